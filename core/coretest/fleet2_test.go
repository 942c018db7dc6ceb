package coretest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/core/config"

	"go.uber.org/goleak"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/fleetredis"
	"github.com/llmhedge/llmhedge/internal/testkit/loopclock"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// Fleet mode part 2 against a real redis-server: the hedge budget, the
// caps, upstream health and the kill switch hold for the fleet. Each
// replica is a Hedger with its own State, Fleet and Redis client. Each
// fleet runs on a loop clock of its own (over a steppedClock whose timers
// never fire), so the tests run each replica's sync loop round by hand
// (member.loop.round) where a real one would tick every sync_interval.

// steppedClock is the real time plus what the test advanced it by, with
// timers that never fire.
type steppedClock struct {
	mu   sync.Mutex
	off  time.Duration
	base time.Time // zero: the system's time (plus off); set: frozen there
}

// frozenClock is a steppedClock that moves only when advanced: a fleet's
// intervals (syncs, heartbeats) pass by the test's steps alone, never by
// how long a loaded machine takes between them.
func frozenClock() *steppedClock { return &steppedClock{base: time.Now()} }

func (c *steppedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.base.IsZero() {
		return c.base.Add(c.off)
	}
	return time.Now().Add(c.off)
}

func (c *steppedClock) advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

func (c *steppedClock) AfterFunc(d time.Duration, f func()) core.Timer {
	return stoppedTimer{}
}

type stoppedTimer struct{ fired bool }

func (t stoppedTimer) Stop() bool { return !t.fired }

// twoUpstreams are A and B. A answers as its behave function says (by
// request number, from 1); B answers at once.
type twoUpstreams struct {
	a, b   *httptest.Server
	aCount atomic.Int64
	behave func(n int64, w http.ResponseWriter, r *http.Request) bool // true: answered
}

func sseAnswer(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
}

func newTwoUpstreams(t *testing.T, behave func(n int64, w http.ResponseWriter, r *http.Request) bool) *twoUpstreams {
	u := &twoUpstreams{behave: behave}
	u.a = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		n := u.aCount.Add(1)
		if u.behave != nil && u.behave(n, w, r) {
			return
		}
		sseAnswer(w)
	}))
	u.b = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		sseAnswer(w)
	}))
	t.Cleanup(u.a.Close)
	t.Cleanup(u.b.Close)
	return u
}

// hedgeAtOnce is a hedger clock on which a hedge delay of these tests
// (5ms or less) has passed as soon as it is armed: the hedge timer's event
// is queued before attempt 0 can answer, so whether a hedge starts is the
// budget's and switch's decision alone, never a race of 2ms against A's
// answer on a loaded machine. Longer timers (deadlines, early headers,
// delays meant not to pass) run on the system clock.
type hedgeAtOnce struct{}

func (hedgeAtOnce) Now() time.Time { return time.Now() }

func (hedgeAtOnce) AfterFunc(d time.Duration, f func()) core.Timer {
	if d <= 5*time.Millisecond {
		f() // the race's event channel is buffered: this only queues
		return stoppedTimer{fired: true}
	}
	return time.AfterFunc(d, f)
}

// heldHedge is a hedger clock whose hedge timer (the delay it was made
// for) never passes by itself: the upstream fires it (fire) for the one
// request that wants a hedge. A member sends one request at a time, so the
// timer pending when its upstream asks is that request's. Other timers run
// on the system clock.
type heldHedge struct {
	delay   time.Duration
	mu      sync.Mutex
	pending *heldTimer
	armed   chan struct{} // a timer was armed since the last look
}

type heldTimer struct {
	c *heldHedge
	f func()
}

func newHeldHedge(delay time.Duration) *heldHedge {
	return &heldHedge{delay: delay, armed: make(chan struct{}, 1)}
}

func (c *heldHedge) Now() time.Time { return time.Now() }

func (c *heldHedge) AfterFunc(d time.Duration, f func()) core.Timer {
	if d != c.delay {
		return time.AfterFunc(d, f)
	}
	t := &heldTimer{c: c, f: f}
	c.mu.Lock()
	c.pending = t
	c.mu.Unlock()
	select {
	case c.armed <- struct{}{}:
	default:
	}
	return t
}

func (t *heldTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.c.pending == t {
		t.c.pending = nil
		return true
	}
	return false
}

// fire runs the pending hedge timer, first waiting for it to be armed
// (the attempt can reach the upstream before launch arms it). false: the
// request ended first.
func (c *heldHedge) fire(ctx context.Context) bool {
	for {
		c.mu.Lock()
		t := c.pending
		c.pending = nil
		c.mu.Unlock()
		if t != nil {
			t.f() // the race's event channel is buffered: this only queues
			return true
		}
		select {
		case <-c.armed:
		case <-ctx.Done():
			return false
		}
	}
}

// stall holds A's answer for 40ms or until the request is cancelled (the
// hedge won). On hedgeAtOnce the hedge decision precedes A's answer, so
// the 40ms only says how long a request with no hedge takes.
func stall(w http.ResponseWriter, r *http.Request) bool {
	t := time.NewTimer(40 * time.Millisecond)
	defer t.Stop()
	select {
	case <-r.Context().Done():
		return true
	case <-t.C:
		return false
	}
}

// member is one replica of a fleet2 rig.
type member struct {
	hedger   *core.Hedger
	fleet    *core.Fleet
	loop     *loopclock.Clock // the fleet's clock: round runs its sync loop (nil: no fleet, or the real loop)
	switches *core.Switches   // the process's kill switches
	client   fleetstore.RedisClient
	errs     *errorsSeen // what the fleet's Redis client answered with errors
	sink     *fleetSink
	reports  *reportLog
	logs     *lineLog
}

// errorsSeen is a RedisClient that keeps the text of every error its
// inner client returns.
type errorsSeen struct {
	inner fleetstore.RedisClient
	mu    sync.Mutex
	texts []string
}

func (e *errorsSeen) Do(ctx context.Context, args ...string) (fleetstore.RedisValue, error) {
	v, err := e.inner.Do(ctx, args...)
	e.note(err)
	return v, err
}

func (e *errorsSeen) Pipeline(ctx context.Context, cmds [][]string) ([]fleetstore.RedisValue, error) {
	v, err := e.inner.Pipeline(ctx, cmds)
	e.note(err)
	return v, err
}

func (e *errorsSeen) note(err error) {
	if err != nil {
		e.mu.Lock()
		e.texts = append(e.texts, err.Error())
		e.mu.Unlock()
	}
}

// all are the errors seen but NOSCRIPT (a script's first run on a server,
// sent again in full).
func (e *errorsSeen) all() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, s := range e.texts {
		if !strings.HasPrefix(s, "NOSCRIPT") {
			out = append(out, s)
		}
	}
	return out
}

type reportLog struct {
	mu      sync.Mutex
	hedges  int
	denials map[string]int
	first   []string // attempt 0's upstream, per request
	status  []int
}

func (l *reportLog) Observe(r *core.Report) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hedges += countRole(r, core.RoleHedge)
	for _, d := range r.Denials {
		l.denials[d]++
	}
	if len(r.Attempts) > 0 {
		l.first = append(l.first, r.Attempts[0].Upstream)
	}
	l.status = append(l.status, r.Status)
}

func countRole(r *core.Report, role string) int {
	n := 0
	for _, a := range r.Attempts {
		if a.Role == role {
			n++
		}
	}
	return n
}

func (l *reportLog) snapshot() (hedges int, denials map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := map[string]int{}
	for k, v := range l.denials {
		d[k] = v
	}
	return l.hedges, d
}

func (l *reportLog) lastFirst() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.first) == 0 {
		return ""
	}
	return l.first[len(l.first)-1]
}

type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) log(fields []core.LogField) {
	var b strings.Builder
	for _, f := range fields {
		b.WriteString(f.Key + "=" + f.Str + " ")
	}
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	l.mu.Unlock()
}

func (l *lineLog) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, sub) {
			n++
		}
	}
	return n
}

// fleet2Config is a route over A then B that hedges after 2ms.
func fleet2Config(redisURL string, ups *twoUpstreams) config.Config {
	return config.Config{
		Route:       "fleet",
		Upstreams:   []config.UpstreamConfig{{Name: "A", URL: ups.a.URL}, {Name: "B", URL: ups.b.URL}},
		Delay:       config.DelayConfig{Fixed: config.Duration(2 * time.Millisecond)},
		MaxAttempts: 2,
		Fleet:       config.FleetConfig{URL: redisURL, Timeout: config.Duration(2 * time.Second)},
	}
}

// newMember makes a replica for cfg (cfg.Fleet.URL empty: no fleet) on
// clock (nil: a steppedClock of its own). The fleet's clock is a loop clock
// over clock (m.loop), but for core.SystemClock: then the fleet's loop
// runs by itself (m.loop nil).
func newMember(t *testing.T, cfg config.Config, clock core.Clock, state *core.State) *member {
	t.Helper()
	return newMemberClocks(t, cfg, clock, nil, state)
}

// newMemberClocks is newMember with the hedger's clock too (nil:
// hedgeAtOnce): a replica whose clock is off.
func newMemberClocks(t *testing.T, cfg config.Config, clock, hedgerClock core.Clock, state *core.State) *member {
	t.Helper()
	m := &member{sink: newFleetSink(), reports: &reportLog{denials: map[string]int{}}, logs: &lineLog{}}
	if clock == nil {
		clock = &steppedClock{}
	}
	if hedgerClock == nil {
		hedgerClock = hedgeAtOnce{}
	}
	m.switches = core.NewSwitches()
	opts := core.Options{Observer: m.reports, State: state, Log: m.logs.log, Clock: hedgerClock, Switches: m.switches}
	if cfg.Fleet.URL != "" {
		client, err := fleetredis.New(cfg.Fleet)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		m.errs = &errorsSeen{inner: client}
		m.client = m.errs
		fleetClock := clock
		if _, real := clock.(core.SystemClock); !real {
			m.loop = loopclock.New(clock, cfg.Fleet)
			fleetClock = m.loop
		}
		m.fleet = core.NewFleet(m.client, cfg.Fleet, core.FleetOptions{Clock: fleetClock, Metrics: m.sink, Log: m.logs.log, Kind: "test"})
		t.Cleanup(m.fleet.Close)
		opts.Fleet = m.fleet
	}
	h, err := core.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	m.hedger = h
	return m
}

// alternate runs rounds of one request on each member, then each one's
// sync.
func alternate(t *testing.T, rounds int, hdr map[string]string, members ...*member) {
	t.Helper()
	for i := 0; i < rounds; i++ {
		for _, m := range members {
			m.do(t, hdr)
		}
		for _, m := range members {
			m.loop.Round(t)
		}
	}
}

// do sends one request through m's hedger and returns the status.
func (m *member) do(t *testing.T, hdr map[string]string) int {
	t.Helper()
	req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	m.hedger.ServeHTTP(rec, req)
	return rec.Code
}

// Invariant 6: with every request wanting a hedge, the hedges started
// across four replicas stay within ratio × fleet requests + burst (the
// documented bound adds replicas × max lease only when the fleet's bucket
// starts over, which it does not here); the same replicas without the
// fleet start about replicas × burst more.
func TestFleetBudgetBoundAcrossReplicas(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool { return stall(w, r) })
	const replicas, perReplica, syncEvery = 4, 100, 10
	const ratio, burst = 0.05, 5
	run := func(fleet bool) int {
		cfg := fleet2Config(redis.URL(), ups)
		cfg.Budget = config.BudgetConfig{Ratio: ratio, Burst: burst, MaxConcurrentHedges: -1}
		if !fleet {
			cfg.Fleet = config.FleetConfig{}
		}
		members := make([]*member, replicas)
		for i := range members {
			members[i] = newMember(t, cfg, nil, nil)
		}
		var wg sync.WaitGroup
		for _, m := range members {
			m := m
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 1; i <= perReplica; i++ {
					if code := m.do(t, nil); code != 200 {
						t.Errorf("status %d, want 200", code)
					}
					if m.fleet != nil && i%syncEvery == 0 {
						m.loop.Round(t)
					}
				}
			}()
		}
		wg.Wait()
		total := 0
		for _, m := range members {
			n, _ := m.reports.snapshot()
			total += n
		}
		return total
	}
	requests := replicas * perReplica
	bound := int(ratio*float64(requests)) + burst
	fleetHedges := run(true)
	localHedges := run(false)
	t.Logf("%d requests over %d replicas: %d hedges with the fleet (bound %d), %d without", requests, replicas, fleetHedges, bound, localHedges)
	if fleetHedges > bound {
		t.Errorf("fleet-wide hedges = %d, want at most ratio × requests + burst = %d", fleetHedges, bound)
	}
	if fleetHedges < bound/2 {
		t.Errorf("fleet-wide hedges = %d, want about %d: the budget is throttled below its ratio", fleetHedges, bound)
	}
	if localHedges <= bound {
		t.Errorf("hedges without the fleet = %d, want more than %d (each replica has its own burst)", localHedges, bound)
	}
}

// At a healthy rate (hedges wanted by 1 request in 12, ratio 0.1) the
// leased budget denies no hedge once the replicas have synced twice (the
// first interval shares the fleet's burst among replicas that start
// together).
func TestFleetBudgetNoThrottleAtHealthyRate(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	const replicas, perReplica, syncEvery, warmUp = 3, 360, 24, 48
	// The hedge delay never passes by itself (heldHedge): A fires it for
	// the requests that want a hedge before it answers. The others cannot
	// hedge however slowly the machine answers them.
	const delay = time.Hour
	clocks := make([]*heldHedge, replicas)
	for i := range clocks {
		clocks[i] = newHeldHedge(delay)
	}
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("X-Slow") == "" {
			return false
		}
		i, err := strconv.Atoi(r.Header.Get("X-Member"))
		if err != nil || i < 0 || i >= replicas {
			w.WriteHeader(400) // a request of no member: the test's own bug
			return true
		}
		// The hedge timer's event is queued before this answer can reach
		// the race, so the hedge is decided (started or denied) first; A
		// then answers, and no denial can leave it waiting.
		clocks[i].fire(r.Context())
		return false
	})
	cfg := fleet2Config(redis.URL(), ups)
	cfg.Delay = config.DelayConfig{Fixed: config.Duration(delay)}
	cfg.Budget = config.BudgetConfig{Ratio: 0.1, Burst: 10}
	members := make([]*member, replicas)
	for i := range members {
		members[i] = newMemberClocks(t, cfg, nil, clocks[i], nil)
	}
	var wg sync.WaitGroup
	var wanted, hedges, denied atomic.Int64
	for mi, m := range members {
		mi, m := mi, m
		wg.Add(1)
		go func() {
			defer wg.Done()
			var hedgesBefore int
			var deniedBefore int
			for i := 1; i <= perReplica; i++ {
				var hdr map[string]string
				if i%12 == 0 && i > warmUp {
					hdr = map[string]string{"X-Slow": "1", "X-Member": strconv.Itoa(mi)}
					wanted.Add(1)
				}
				m.do(t, hdr)
				if i%syncEvery == 0 {
					m.loop.Round(t)
				}
				if i == warmUp {
					h, d := m.reports.snapshot()
					hedgesBefore, deniedBefore = h, d[core.DenyBudget]
				}
			}
			h, d := m.reports.snapshot()
			hedges.Add(int64(h - hedgesBefore))
			denied.Add(int64(d[core.DenyBudget] - deniedBefore))
		}()
	}
	wg.Wait()
	t.Logf("after the warm-up: %d requests wanting a hedge, %d hedges, %d budget denials", wanted.Load(), hedges.Load(), denied.Load())
	if denied.Load() != 0 || hedges.Load() < wanted.Load() {
		t.Errorf("budget denials = %d, hedges = %d, want 0 and at least %d (every wanted hedge)", denied.Load(), hedges.Load(), wanted.Load())
	}
}

// tooManyOnXFail makes A answer a request with X-Fail 429 Retry-After: 5.
func tooManyOnXFail(n int64, w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get("X-Fail") != "" {
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(429)
		return true
	}
	return false
}

// coolDownFleet is the cool-down tests' set-up: a real Redis and A
// answering a request with X-Fail 429 Retry-After: 5. Its members (see
// noHedgeMember) never hedge: the first attempt's upstream is the routing's
// choice alone.
func coolDownFleet(t *testing.T) (*redisproc.Server, *twoUpstreams, config.Config) {
	t.Helper()
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, tooManyOnXFail)
	cfg := fleet2Config(redis.URL(), ups)
	return redis, ups, cfg
}

// noHedgeMember is newMember whose hedge timer never passes (heldHedge,
// never fired): a failing A is always seen, never lost to a hedge.
func noHedgeMember(t *testing.T, cfg config.Config, clock core.Clock) *member {
	t.Helper()
	return newMemberClocks(t, cfg, clock, newHeldHedge(time.Duration(cfg.Delay.Fixed)), nil)
}

// Invariant 7: replica 1 sees a 429 with Retry-After: 5 from A; replica
// 2's next request goes to B first, and A stays avoided.
func TestFleetCoolDownReachesOtherReplicas(t *testing.T) {
	redis, ups, cfg := coolDownFleet(t)
	r1, r2 := noHedgeMember(t, cfg, nil), noHedgeMember(t, cfg, nil)
	r2.do(t, nil) // attached, and A is fine
	if got := r2.reports.lastFirst(); got != "A" {
		t.Fatalf("replica 2's first attempt before the 429 went to %q, want A", got)
	}
	if code := r1.do(t, map[string]string{"X-Fail": "1"}); code != 200 {
		t.Fatalf("replica 1: status %d, want 200 (retried on B)", code)
	}
	waitPublished(t, redis, r1, cfg.Route, "cool:A")
	r2.loop.Round(t) // replica 2's next sync
	r2.do(t, nil)
	if got := r2.reports.lastFirst(); got != "B" {
		t.Errorf("replica 2's first attempt after replica 1's 429 went to %q, want B", got)
	}
	if n := ups.aCount.Load(); n != 2 {
		t.Errorf("A got %d requests, want 2 (replica 2's before the 429, replica 1's)", n)
	}
}

// A cool-down whose publish failed (Redis paused while replica 1 wrote
// it) is not lost: replica 1's next round publishes what is left of it,
// and replica 2 then avoids A.
func TestFleetCoolDownPublishedAfterAFailedWrite(t *testing.T) {
	redis, _, cfg := coolDownFleet(t)
	cfg.Fleet.Timeout = config.Duration(100 * time.Millisecond)
	r1, r2 := noHedgeMember(t, cfg, nil), noHedgeMember(t, cfg, nil)
	r1.do(t, nil)
	r2.do(t, nil) // both attached, and A is fine
	redis.Pause()
	if code := r1.do(t, map[string]string{"X-Fail": "1"}); code != 200 {
		t.Fatalf("replica 1: status %d, want 200 (retried on B)", code)
	}
	// The first EVALSHA of each script also counts as failed (NOSCRIPT).
	for published := false; !published; {
		select {
		case op := <-r1.sink.failed:
			published = op == "publish"
		case <-time.After(10 * time.Second):
			redis.Resume()
			t.Fatal("replica 1's publish of the cool-down did not fail within 10s with Redis paused")
		}
	}
	redis.Resume()
	r1.loop.Round(t) // the next round of replica 1's loop
	r2.loop.Round(t)
	r2.do(t, nil)
	if got := r2.reports.lastFirst(); got != "B" {
		t.Errorf("replica 2's first attempt after replica 1's 429 (its first publish failed) went to %q, want B", got)
	}
}

// The same with the real loops on the system clock: replica 1's loop
// publishes the 429's cool-down, and after replica 2's loop has synced
// since, replica 2 avoids A.
func TestFleetCoolDownThroughTheLoops(t *testing.T) {
	_, _, cfg := coolDownFleet(t)
	cfg.Fleet.Timeout = config.Duration(200 * time.Millisecond)
	r1, r2 := noHedgeMember(t, cfg, core.SystemClock{}), noHedgeMember(t, cfg, core.SystemClock{})
	r2.do(t, nil)
	published := r1.sink.count(fleetstore.OpPublish)
	r1.do(t, map[string]string{"X-Fail": "1"})
	start := time.Now()
	// Replica 1's loop (or its publisher) publishes the cool-down. The
	// guard is a hang detector.
	if !r1.sink.waitCount(fleetstore.OpPublish, published+1, 30*time.Second) {
		t.Fatal("replica 1's loop never published its cool-down")
	}
	// Replica 2's loop after the publish, by its sync operations (each
	// round reads the switch of every route, then syncs the route; the
	// loop runs them one after the other): the next one may have been
	// sent before the publish, the one after starts after it, and within
	// the next two one is the route's sync; the operation after that
	// starts once its round applied it. The guard is a hang detector.
	if !r2.sink.waitCount(fleetstore.OpSync, r2.sink.count(fleetstore.OpSync)+4, 30*time.Second) {
		t.Fatal("replica 2's loop stopped syncing")
	}
	r2.do(t, nil)
	if got := r2.reports.lastFirst(); got != "B" {
		t.Errorf("replica 2's first attempt two syncs after replica 1 published its 429 went to %q, want B", got)
	}
	t.Logf("propagation: %v", time.Since(start))
}

// The kill switch: a fleet pause stops every hedge on every replica after
// its next sync (retries still run), holds for a new hedger on the same
// State (a reload) and for a new replica before its first hedge, holds
// while Redis is away, and a resume brings hedging back.
func TestFleetKillSwitch(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("X-Fail") != "" {
			w.WriteHeader(500)
			return true
		}
		return stall(w, r)
	})
	cfg := fleet2Config(redis.URL(), ups)
	clock := &steppedClock{}
	r1, r2 := newMember(t, cfg, nil, nil), newMember(t, cfg, clock, nil)
	r1.do(t, nil)
	r2.do(t, nil)
	redisDo(t, redis, "SET", fleetstore.SwitchKey("llmhedge:", "fleet"), fleetstore.EncodeSwitch(fleetstore.Switch{Paused: true}))
	r1.loop.Round(t)
	r2.loop.Round(t)
	for _, m := range []*member{r1, r2} {
		before, _ := m.reports.snapshot()
		m.do(t, nil)
		after, denied := m.reports.snapshot()
		if after != before || denied[core.DenyPaused] != 1 {
			t.Errorf("paused: hedges %d -> %d, paused denials %d, want no new hedge and 1 denial", before, after, denied[core.DenyPaused])
		}
		if got := m.hedger.SwitchInForce(); !got.Paused {
			t.Errorf("SwitchInForce = %v, want paused", got)
		}
		if core.HedgerGauge(core.MetricHedgingPaused, m.hedger) != 1 {
			t.Error("llm_hedge_hedging_paused = 0, want 1")
		}
	}
	// A retry after a failure still runs.
	r1.do(t, map[string]string{"X-Fail": "1"})
	r1.reports.mu.Lock()
	last := r1.reports.status[len(r1.reports.status)-1]
	r1.reports.mu.Unlock()
	if last != 200 {
		t.Errorf("paused, A failed: status %d, want 200 from the retry on B", last)
	}

	// A reload: a new hedger on the same State sees the pause at once.
	reloaded := newMember(t, cfg, nil, r1.hedger.State())
	reloaded.do(t, nil)
	if _, d := reloaded.reports.snapshot(); d[core.DenyPaused] != 1 {
		t.Errorf("reloaded hedger: paused denials %d, want 1", d[core.DenyPaused])
	}
	// A new replica reads the switch before its first hedge.
	fresh := newMember(t, cfg, nil, nil)
	fresh.do(t, nil)
	if h, d := fresh.reports.snapshot(); h != 0 || d[core.DenyPaused] != 1 {
		t.Errorf("new replica: hedges %d, paused denials %d, want 0 and 1", h, d[core.DenyPaused])
	}

	// Redis away: the last switch seen stays in force.
	redis.Kill()
	for i := 0; i < 4; i++ {
		r2.loop.Round(t)
	}
	if r2.fleet.Up() {
		t.Error("fleet up with Redis killed, want down")
	}
	before, _ := r2.reports.snapshot()
	if code := r2.do(t, nil); code != 200 {
		t.Errorf("Redis away: status %d, want 200", code)
	}
	if after, _ := r2.reports.snapshot(); after != before {
		t.Errorf("Redis away: hedges %d -> %d, want the pause still in force", before, after)
	}
	redis.Restart()

	// Resume: the key is gone (a restarted Redis has none anyway).
	redisDo(t, redis, "DEL", fleetstore.SwitchKey("llmhedge:", "fleet"))
	waitFleetUp(t, r2, clock)
	r2.loop.Round(t)
	before, _ = r2.reports.snapshot()
	r2.do(t, nil)
	if after, _ := r2.reports.snapshot(); after != before+1 {
		t.Errorf("resumed: hedges %d -> %d, want one more", before, after)
	}
}

// waitFleetUp syncs m until its fleet is up again: the breaker probes
// once per retry_interval on the fleet's clock.
func waitFleetUp(t *testing.T, m *member, clock *steppedClock) {
	t.Helper()
	for i := 0; i < 10 && !m.fleet.Up(); i++ {
		clock.advance(time.Second)
		m.loop.Round(t)
	}
	if !m.fleet.Up() {
		t.Fatal("fleet not up after 10 retry intervals with Redis restarted")
	}
}

// The switch for every route ("*") and a delay override: the override
// replaces the hedge delay, and a process switch applies without a fleet.
func TestFleetSwitchAllRoutesDelayAndProcess(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool { return stall(w, r) })
	cfg := fleet2Config(redis.URL(), ups)
	cfg.Delay = config.DelayConfig{Fixed: config.Duration(time.Hour)}
	r1 := newMember(t, cfg, nil, nil)
	redisDo(t, redis, "SET", fleetstore.SwitchKey("llmhedge:", fleetstore.SwitchAllRoutes), fleetstore.EncodeSwitch(fleetstore.Switch{Delay: 5 * time.Millisecond}))
	r1.do(t, nil) // attaches: the first sync reads the switch
	if h, _ := r1.reports.snapshot(); h != 1 {
		t.Errorf("delay override 5ms on a 1h delay: hedges %d, want 1", h)
	}
	if d := r1.hedger.CurrentDelay(); d != 5*time.Millisecond {
		t.Errorf("CurrentDelay = %v, want the override 5ms", d)
	}

	noFleet := cfg
	noFleet.Fleet = config.FleetConfig{}
	noFleet.Delay = config.DelayConfig{Fixed: config.Duration(2 * time.Millisecond)}
	local := newMember(t, noFleet, nil, nil)
	local.switches.Set("fleet", fleetstore.Switch{Paused: true})
	local.do(t, nil)
	if h, d := local.reports.snapshot(); h != 0 || d[core.DenyPaused] != 1 {
		t.Errorf("process pause without a fleet: hedges %d, paused denials %d, want 0 and 1", h, d[core.DenyPaused])
	}
	local.switches.Set("fleet", fleetstore.Switch{})
	local.do(t, nil)
	if h, _ := local.reports.snapshot(); h != 1 {
		t.Errorf("process switch removed: hedges %d, want 1", h)
	}
}

// The spend cap holds for the fleet: two replicas share the hour's cap
// of ten hedges through reservations in Redis; the fleet starts no more
// than ten (no hedge starts once the cap is reserved; retries still run),
// the gauge says so, and one line is logged.
func TestFleetSpendCap(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("X-Fail") != "" {
			w.WriteHeader(500)
			return true
		}
		return stall(w, r)
	})
	perHedge := int64(len(chatBody) / 4)
	const capHedges = 10
	cfg := fleet2Config(redis.URL(), ups)
	cfg.Budget = config.BudgetConfig{Ratio: -1, SpendCapTokensPerHour: capHedges*perHedge + perHedge/2, PromptUSDPerMillion: 2}
	r1, r2 := newMember(t, cfg, nil, nil), newMember(t, cfg, nil, nil)
	alternate(t, 3*capHedges, nil, r1, r2)
	h1, d1 := r1.reports.snapshot()
	h2, d2 := r2.reports.snapshot()
	if h1+h2 != capHedges {
		t.Errorf("fleet hedges under a cap of %d hedges = %d (%d + %d), want %d", capHedges, h1+h2, h1, h2, capHedges)
	}
	for i, m := range []*member{r1, r2} {
		if got := core.HedgerGauge(core.MetricSpendCapReached, m.hedger); got != 1 {
			t.Errorf("replica %d: llm_hedge_spend_cap_reached = %v, want 1", i+1, got)
		}
		if n := m.logs.count("spend cap reached"); n != 1 {
			t.Errorf("replica %d: spend cap log lines = %d, want 1", i+1, n)
		}
		if tokens, _ := m.hedger.SpendTokens(); tokens != int64(h1+h2)*perHedge {
			t.Errorf("replica %d: SpendTokens = %d, want %d (the fleet's %d hedges)", i+1, tokens, int64(h1+h2)*perHedge, h1+h2)
		}
	}
	if d1[core.DenySpendCap]+d2[core.DenySpendCap] == 0 {
		t.Error("spend_cap denials = 0 with every request wanting a hedge, want some")
	}
	r1.do(t, map[string]string{"X-Fail": "1"})
	r1.reports.mu.Lock()
	last := r1.reports.status[len(r1.reports.status)-1]
	r1.reports.mu.Unlock()
	if last != 200 {
		t.Errorf("capped, A failed: status %d, want 200 from the retry on B", last)
	}
	keys := redisArray(t, redis, "KEYS", "llmhedge:{r:fleet}:spend:*")
	if len(keys) != 1 {
		t.Fatalf("spend keys %v, want one (the hour's)", keys)
	}
	if v := redisDo(t, redis, "PTTL", keys[0]).Int; v <= 0 {
		t.Errorf("spend key PTTL = %d, want a TTL", v)
	}

	// Without a fleet the cap is this replica's.
	noFleet := cfg
	noFleet.Fleet = config.FleetConfig{}
	local := newMember(t, noFleet, nil, nil)
	for i := 0; i <= capHedges; i++ {
		local.do(t, nil)
	}
	if h, d := local.reports.snapshot(); h != capHedges || d[core.DenySpendCap] != 1 {
		t.Errorf("local spend cap: hedges %d, spend_cap denials %d, want %d and 1", h, d[core.DenySpendCap], capHedges)
	}
}

// The per-tenant cap holds for the fleet: what one replica charged a
// tenant counts on the other after their syncs.
func TestFleetTenantCap(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool { return stall(w, r) })
	perHedge := int64(len(chatBody) / 4)
	cfg := fleet2Config(redis.URL(), ups)
	cfg.Budget = config.BudgetConfig{Ratio: -1, TenantHeader: "X-Tenant", TenantTokensPerMinute: 2*perHedge + perHedge/2}
	r1, r2 := newMember(t, cfg, nil, nil), newMember(t, cfg, nil, nil)
	tenant := map[string]string{"X-Tenant": "acme"}
	r1.do(t, tenant)
	r1.loop.Round(t)
	r2.do(t, tenant)
	r2.loop.Round(t)
	r1.loop.Round(t)
	r1.do(t, tenant) // a third hedge would exceed the fleet's cap
	h1, d1 := r1.reports.snapshot()
	h2, _ := r2.reports.snapshot()
	if h1+h2 != 2 || d1[core.DenyTenant] != 1 {
		t.Errorf("tenant over the fleet's cap: hedges %d, tenant denials %d, want 2 and 1", h1+h2, d1[core.DenyTenant])
	}
	for _, k := range redisArray(t, redis, "KEYS", "llmhedge:{r:fleet}:tenant:*") {
		if strings.Contains(k, "acme") {
			t.Errorf("tenant key %q names the tenant, want its hash", k)
		}
		if ttl := redisInt(t, redis, "PTTL", k); ttl <= 0 {
			t.Errorf("tenant key %q PTTL %d, want a TTL", k, ttl)
		}
	}
}

// The concurrent-hedge cap is shared: with two live replicas each may run
// max_concurrent_hedges / 2 hedges at once.
func TestFleetHedgeCapShared(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool { return stall(w, r) })
	// B holds the hedges until their requests time out, so that the first
	// is still in flight when the second request wants one; it answers a
	// warm-up request's hedge (X-Warm) at once.
	hedged := make(chan struct{}, 2)
	ups.b.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Warm") != "" {
			sseAnswer(w)
			return
		}
		hedged <- struct{}{}
		<-r.Context().Done()
	})
	cfg := fleet2Config(redis.URL(), ups)
	cfg.Budget = config.BudgetConfig{MaxConcurrentHedges: 2}
	cfg.Timeout = config.Duration(time.Second)
	clock := &steppedClock{}
	r1, r2 := newMember(t, cfg, clock, nil), newMember(t, cfg, clock, nil)
	warm := map[string]string{"X-Warm": "1"}
	r1.do(t, warm) // the route attaches: each loop starts
	r2.do(t, warm)
	r1.loop.Round(t)
	r2.loop.Round(t) // two heartbeats
	clock.advance(fleetstore.HeartbeatInterval)
	r1.loop.Round(t) // counts both
	if n := r1.fleet.LiveReplicas(); n != 2 {
		t.Fatalf("LiveReplicas = %d, want 2", n)
	}
	r1.loop.Round(t) // the route's sync takes its share (a round syncs before its heartbeat)
	done := make(chan int, 2)
	go func() { done <- r1.do(t, nil) }()
	<-hedged // the first request's hedge is in flight until its timeout
	r1.do(t, nil)
	<-done
	if _, d := r1.reports.snapshot(); d[core.DenyConcurrency] != 1 {
		t.Errorf("concurrency denials = %d, want 1 (a share of 1 of the cap 2 with 2 replicas)", d[core.DenyConcurrency])
	}
}

// The heartbeat: llmhedge-ctl's ReplicaStatus, with a TTL.
func TestFleetHeartbeat(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(429)
			return true
		}
		return false
	})
	cfg := fleet2Config(redis.URL(), ups)
	clock := &steppedClock{}
	// The hedge timer never passes (heldHedge, never fired): A's 429 is
	// seen and cools A before B answers the retry, never lost to a hedge.
	r1 := newMemberClocks(t, cfg, clock, newHeldHedge(time.Duration(cfg.Delay.Fixed)), nil)
	r1.do(t, nil)
	r1.do(t, nil)
	r1.loop.Round(t)
	key := fleetstore.ReplicaKey("llmhedge:", r1.fleet.ReplicaID())
	raw := redisDo(t, redis, "GET", key).Str
	var st fleetstore.ReplicaStatus
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		t.Fatalf("heartbeat %q: %v", raw, err)
	}
	if st.Kind != "test" || st.ID != r1.fleet.ReplicaID() || len(st.Routes) != 1 {
		t.Fatalf("heartbeat kind %q, id %q, %d routes; want test, %s, 1", st.Kind, st.ID, len(st.Routes), r1.fleet.ReplicaID())
	}
	rt := st.Routes[0]
	if rt.Name != "fleet" || rt.Requests != 2 || rt.Switch != "on" || len(rt.Cooled) != 1 || rt.Cooled[0] != "A" {
		t.Errorf("route %q requests %d switch %q cooled %v, want fleet, 2, on, [A]", rt.Name, rt.Requests, rt.Switch, rt.Cooled)
	}
	if ttl := redisInt(t, redis, "PTTL", key); ttl <= 0 || ttl > int64(fleetstore.HeartbeatTTL/time.Millisecond) {
		t.Errorf("heartbeat PTTL = %d, want (0, %d]", ttl, fleetstore.HeartbeatTTL/time.Millisecond)
	}
	// The live set's TTL is renewed every tenth beat: it outlasts ten.
	liveTTL := int64((10*fleetstore.HeartbeatInterval + fleetstore.HeartbeatTTL) / time.Millisecond)
	if ttl := redisInt(t, redis, "PTTL", "llmhedge:{fleet}:live"); ttl <= int64(10*fleetstore.HeartbeatInterval/time.Millisecond) || ttl > liveTTL {
		t.Errorf("live set PTTL = %d, want (%d, %d]", ttl, 10*fleetstore.HeartbeatInterval/time.Millisecond, liveTTL)
	}
	// A set that expired starts over with a TTL at the next beat, tenth or not.
	redisDo(t, redis, "DEL", "llmhedge:{fleet}:live")
	clock.advance(fleetstore.HeartbeatInterval)
	r1.loop.Round(t)
	if ttl := redisInt(t, redis, "PTTL", "llmhedge:{fleet}:live"); ttl <= 0 {
		t.Errorf("live set PTTL = %d after it expired and the next (second) beat, want a TTL", ttl)
	}
	r1.fleet.Close()
	if n := redisInt(t, redis, "EXISTS", key); n != 0 {
		t.Error("heartbeat still there after Close, want removed")
	}
}

// Redis away: requests go on with the local budget, fleet_up says so, and
// nothing fails.
func TestFleetRedisAwayUsesLocalBudget(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool { return stall(w, r) })
	cfg := fleet2Config(redis.URL(), ups)
	cfg.Fleet.Timeout = config.Duration(100 * time.Millisecond)
	cfg.Budget = config.BudgetConfig{Ratio: 0.5, Burst: 2}
	r1 := newMember(t, cfg, nil, nil)
	r1.do(t, nil)
	redis.Pause()
	for i := 0; i < 4; i++ {
		r1.loop.Round(t)
	}
	if up := r1.sink.isUp(); up != 0 {
		t.Errorf("llm_hedge_fleet_up = %v with Redis paused, want 0", up)
	}
	redis.Resume()
	before, _ := r1.reports.snapshot()
	for i := 0; i < 10; i++ {
		if code := r1.do(t, nil); code != 200 {
			t.Fatalf("Redis away: status %d, want 200", code)
		}
	}
	after, _ := r1.reports.snapshot()
	// Local bucket: what it held, plus 0.5 per request.
	if after-before < 4 {
		t.Errorf("Redis away: %d hedges in 10 requests, want the local budget's (about 5)", after-before)
	}
}

// Redis commands per unkeyed request: the loop's cost is per interval.
// At 160 requests/s (what each replica of the five-replica acceptance run
// served) and the default 250ms interval, one sync per 40 requests, a
// heartbeat every eighth.
func TestFleetRedisCommandsPerUnkeyedRequest(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, nil)
	cfg := fleet2Config(redis.URL(), ups)
	clock := frozenClock()
	r1 := noHedgeMember(t, cfg, clock)
	r1.do(t, nil)
	r1.loop.Round(t)
	before := redisCommands(t, redis)
	const requests = 1200
	for i := 1; i <= requests; i++ {
		r1.do(t, nil)
		if i%40 == 0 {
			clock.advance(250 * time.Millisecond)
			r1.loop.Round(t)
		}
	}
	used := redisCommands(t, redis).Since(before, ownReads...).Total()
	perRequest := float64(used) / requests
	t.Logf("%d Redis commands for %d unkeyed requests: %.3f per request (%s)", used, requests, perRequest, redisCommands(t, redis).Since(before, ownReads...))
	if perRequest > 0.1 {
		t.Errorf("Redis commands per unkeyed request = %.3f, want at most 0.1", perRequest)
	}
}

// What each round of the loop costs Redis, command by command: a round
// reads the switch of every route (one GET), a route's sync is its script
// and one MGET (the bucket full, no health event alive); the
// health hash is read only while an event lives (its mark exists); a
// heartbeat is its script with SET, TIME, ZADD and ZCOUNT, and every tenth
// one also prunes and renews the live set.
func TestFleetLoopRedisCommands(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	cool := atomic.Bool{}
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if cool.Load() {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(429)
			return true
		}
		return false
	})
	cfg := fleet2Config(redis.URL(), ups)
	clock := frozenClock()
	r1 := noHedgeMember(t, cfg, clock)
	r1.do(t, nil)
	r1.loop.Round(t) // the first sync and heartbeat (a tenth beat)
	round := func(requests int, step time.Duration) redisproc.Calls {
		for i := 0; i < requests; i++ {
			r1.do(t, nil)
		}
		clock.advance(step)
		before := redisCommands(t, redis)
		r1.loop.Round(t)
		return redisCommands(t, redis).Since(before, ownReads...)
	}
	// Refill the fleet's bucket (the first sync leased half the burst;
	// then the replica holds what its requests earn and leases no more).
	for i := 0; i < 10; i++ {
		round(40, 250*time.Millisecond)
	}
	// The GET is the switch of every route: on a Redis Cluster its key is
	// on a slot of its own, so the route's script cannot read it (one GET
	// per round, whatever the number of routes).
	if got := round(40, 250*time.Millisecond); got.String() != "evalsha=1 get=1 mget=1" {
		t.Errorf("a sync without a heartbeat or a health event used %s, want evalsha=1 get=1 mget=1", got)
	}
	if got := round(40, fleetstore.HeartbeatInterval); got.String() != "evalsha=2 get=1 mget=1 set=1 time=1 zadd=1 zcount=1" {
		t.Errorf("a sync with a heartbeat used %s, want evalsha=2 get=1 mget=1 set=1 time=1 zadd=1 zcount=1", got)
	}
	cool.Store(true)
	r1.do(t, nil) // A answers 429 Retry-After 30: a cool-down, published
	cool.Store(false)
	waitPublished(t, redis, r1, "fleet", "cool:A")
	if ttl, mark := redisInt(t, redis, "PTTL", "llmhedge:{r:fleet}:health"), redisInt(t, redis, "PTTL", "llmhedge:{r:fleet}:healthmark"); mark <= 0 || mark > ttl {
		t.Errorf("health mark PTTL %d with the health hash's %d, want (0, the hash's]", mark, ttl)
	}
	if got := round(0, 250*time.Millisecond); got.String() != "evalsha=1 get=1 hgetall=1 mget=1 time=1" {
		t.Errorf("a sync while a cool-down lives used %s, want evalsha=1 get=1 hgetall=1 mget=1 time=1", got)
	}
}

// waitPublished polls srv until route's health hash holds field, which
// m published: its background publisher, or a round of its loop (polling,
// bounded by deadline).
func waitPublished(t *testing.T, srv *redisproc.Server, m *member, route, field string) {
	t.Helper()
	key := "llmhedge:{r:" + route + "}:health"
	deadline := time.Now().Add(30 * time.Second)
	for m.loop.Round(t); redisInt(t, srv, "HEXISTS", key, field) != 1; m.loop.Round(t) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in %s 30s after the 429", field, key)
		}
		time.Sleep(2 * time.Millisecond) // polling, bounded by deadline
	}
}

// redisCommands reads srv's calls per command.
func redisCommands(t *testing.T, srv *redisproc.Server) redisproc.Calls {
	t.Helper()
	return redisproc.ParseCalls(redisDo(t, srv, "INFO", "commandstats").Str)
}

// ownReads are the commands of the test's own reads (each a new
// connection: HELLO, then INFO), left out of the loop's counts.
var ownReads = []string{"hello", "info"}

// Close stops the loop on the system clock and leaves no goroutine.
func TestFleetCloseLeavesNoGoroutine(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, nil)
	ignore := goleak.IgnoreCurrent()
	cfg := fleet2Config(redis.URL(), ups)
	cfg.Fleet.SyncInterval = config.Duration(10 * time.Millisecond)
	client, err := fleetredis.New(cfg.Fleet)
	if err != nil {
		t.Fatal(err)
	}
	sink := newFleetSink()
	fleet := core.NewFleet(client, cfg.Fleet, core.FleetOptions{Metrics: sink})
	tr := &http.Transport{}
	h2, err := core.New(cfg, core.Options{Fleet: fleet, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(chatBody))
	h2.ServeHTTP(httptest.NewRecorder(), req)
	// Three ticks: each reads the switch of every route and syncs the
	// route, two sync operations. The guard is a hang detector.
	if !sink.waitCount(fleetstore.OpSync, sink.count(fleetstore.OpSync)+6, 5*time.Second) {
		t.Fatal("the loop did not tick three times within 5s")
	}
	fleet.Close()
	client.Close()
	tr.CloseIdleConnections()
	goleak.VerifyNone(t, ignore)
}

// Invariant 7 for the breaker: replica 1 opens A's breaker; after the
// syncs replica 2 sends its first attempt to B (the probe is replica 1's).
func TestFleetOpenBreakerReachesOtherReplicas(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("X-Fail") != "" {
			w.WriteHeader(500)
			return true
		}
		return false
	})
	cfg := fleet2Config(redis.URL(), ups)
	cfg.Budget = config.BudgetConfig{BreakerFailures: 1, BreakerOpen: config.Duration(time.Minute)}
	r1, r2 := noHedgeMember(t, cfg, nil), noHedgeMember(t, cfg, nil)
	r2.do(t, nil)
	if got := r2.reports.lastFirst(); got != "A" {
		t.Fatalf("replica 2's first attempt went to %q, want A", got)
	}
	if code := r1.do(t, map[string]string{"X-Fail": "1"}); code != 200 {
		t.Fatalf("replica 1: status %d, want 200 (retried on B)", code)
	}
	r1.loop.Round(t)
	r2.loop.Round(t)
	r2.do(t, nil)
	if got := r2.reports.lastFirst(); got != "B" {
		t.Errorf("replica 2's first attempt after replica 1 opened A's breaker went to %q, want B", got)
	}
	fields := redisArray(t, redis, "HKEYS", "llmhedge:{r:fleet}:health")
	if len(fields) != 1 || fields[0] != "open:A" {
		t.Errorf("health fields %v, want [open:A]", fields)
	}
	if ttl := redisInt(t, redis, "PTTL", "llmhedge:{r:fleet}:health"); ttl <= 0 || ttl > 60000 {
		t.Errorf("health key PTTL %d, want (0, 60000]: the open time", ttl)
	}
}

// Invariant 7 for the overload stop: replica 1 sees 503s above the
// overload rate; after the syncs replica 2 starts no hedge (overload).
func TestFleetOverloadReachesOtherReplicas(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	fail := func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("X-Fail") != "" {
			w.WriteHeader(503)
			return true
		}
		return stall(w, r)
	}
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool { return fail(w, r) })
	ups.b.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if !fail(w, r) {
			sseAnswer(w)
		}
	})
	cfg := fleet2Config(redis.URL(), ups)
	cfg.Budget = config.BudgetConfig{CoolDown: config.Duration(time.Millisecond), MaxCoolDown: config.Duration(time.Millisecond),
		OverloadWindow: 2, BreakerFailures: 100}
	r1, r2 := newMember(t, cfg, nil, nil), newMember(t, cfg, nil, nil)
	r2.do(t, nil)
	if h, _ := r2.reports.snapshot(); h != 1 {
		t.Fatalf("replica 2 before the overload: hedges %d, want 1", h)
	}
	r1.do(t, map[string]string{"X-Fail": "1"}) // A and B answer 503: overloaded
	r1.loop.Round(t)
	r2.loop.Round(t)
	r2.do(t, nil)
	if h, d := r2.reports.snapshot(); h != 1 || d[core.DenyOverload] != 1 {
		t.Errorf("replica 2 after replica 1's overload: hedges %d, overload denials %d, want 1 and 1", h, d[core.DenyOverload])
	}
}
