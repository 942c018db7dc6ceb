package coretest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/fleetredis"
	"github.com/llmhedge/llmhedge/internal/testkit/loopclock"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
	"github.com/llmhedge/llmhedge/resp"
)

// The fleet protocol against a real redis-server (internal/testkit/redisproc):
// several replicas, each a Hedger with its own State and its own Redis
// client, share one Redis and one upstream that counts generations.

// gatedUpstream is an OpenAI-style SSE upstream whose answers a test can
// hold before the first event (before commit) and after it (after
// commit). Each request is one generation of the key it carries; the
// events name the generation, so spliced answers show.
type gatedUpstream struct {
	srv *httptest.Server

	mu      sync.Mutex
	gens    map[string]int           // generations per Idempotency-Key
	started chan string              // a generation started (its key and number)
	before  map[string]chan struct{} // hold a key's answers before the first event
	after   map[string]chan struct{} // hold them after the first event
	tail    map[string]chan struct{} // hold their EOF after [DONE]
	// cancelled gets the key of an answer held after its first event or
	// at its tail whose request was cancelled.
	cancelled chan string
	waiters   []genWaiter // startedOf
	events    int         // events per answer
	size      int         // padding per event, for large answers
}

func newGatedUpstream(t *testing.T) *gatedUpstream {
	u := &gatedUpstream{gens: map[string]int{}, started: make(chan string, 1000),
		before: map[string]chan struct{}{}, after: map[string]chan struct{}{}, tail: map[string]chan struct{}{},
		cancelled: make(chan string, 100), events: 5}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *gatedUpstream) serve(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.gens[key]++
	gen := u.gens[key]
	kept := u.waiters[:0]
	for _, w := range u.waiters {
		if w.key == key && gen >= w.n {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	u.waiters = kept
	before := u.before[key]
	if g := u.before[key+"#"+strconv.Itoa(gen)]; g != nil {
		before = g
	}
	after := u.after[key]
	if g := u.after[key+"#"+strconv.Itoa(gen)]; g != nil {
		after = g
	}
	if after == nil {
		after = u.after["*"] // holdAll
	}
	events := u.events
	size := u.size
	u.mu.Unlock()
	u.started <- key + "#" + strconv.Itoa(gen)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Generation", strconv.Itoa(gen))
	flusher := w.(http.Flusher)
	if before != nil {
		select {
		case <-before:
		case <-r.Context().Done():
			return
		}
	}
	pad := strings.Repeat("x", size)
	for i := 0; i < events; i++ {
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"gen%d-tok%d%s \"}}]}\n\n", gen, i, pad)
		flusher.Flush()
		if i == 0 && after != nil {
			select {
			case <-after:
			case <-r.Context().Done():
				u.cancelled <- key
				return
			}
		}
	}
	io.WriteString(w, "data: [DONE]\n\n")
	u.mu.Lock()
	tail := u.tail[key]
	u.mu.Unlock()
	if tail != nil {
		// The answer is whole, but its EOF waits.
		flusher.Flush()
		select {
		case <-tail:
		case <-r.Context().Done():
			u.cancelled <- key
		}
	}
}

func (u *gatedUpstream) generations(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.gens[key]
}

// startedOf returns a channel closed once generation n of key has started.
func (u *gatedUpstream) startedOf(key string, n int) chan struct{} {
	ch := make(chan struct{})
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.gens[key] >= n {
		close(ch)
		return ch
	}
	u.waiters = append(u.waiters, genWaiter{key: key, n: n, ch: ch})
	return ch
}

type genWaiter struct {
	key string
	n   int
	ch  chan struct{}
}

// hold makes the key's answers wait before their first event (pre) or
// after it (post) until the returned function is called.
func (u *gatedUpstream) hold(key string, post bool) func() {
	ch := make(chan struct{})
	u.mu.Lock()
	if post {
		u.after[key] = ch
	} else {
		u.before[key] = ch
	}
	u.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// holdAll makes every key's answers without a gate of their own wait
// after their first event until the returned function is called.
func (u *gatedUpstream) holdAll() func() { return u.hold("*", true) }

// holdGen is hold for generation gen of key only.
func (u *gatedUpstream) holdGen(key string, gen int, post bool) func() {
	return u.hold(key+"#"+strconv.Itoa(gen), post)
}

// waitStarted waits for the next generation of key to reach the upstream
// (those of other keys are passed over) and returns it as key#generation.
func (u *gatedUpstream) waitStarted(t *testing.T, key string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case s := <-u.started:
			if strings.HasPrefix(s, key+"#") {
				return s
			}
		case <-timeout:
			t.Fatalf("no generation of %s reached the upstream within 10s", key)
			return ""
		}
	}
}

// killableClient is a replica's Redis client that a test can cut off, as if
// the replica's process had died as far as Redis can tell, or lose some of
// its commands.
type killableClient struct {
	inner fleetstore.RedisClient
	dead  atomic.Bool
	// lose, when set, is a substring: a command with an argument that
	// contains it never reaches Redis and fails at its deadline, as one
	// whose reply a busy replica read too late; each is sent on lost.
	lose atomic.Pointer[string]
	lost chan []string
	// hold, when set, makes a command with an argument that contains its
	// part wait for the test's release, whatever its deadline.
	hold atomic.Pointer[commandGate]
}

type commandGate struct {
	part    string
	release chan struct{}
	held    chan struct{} // one value per command held
}

// holdCommands makes every command with an argument that contains part
// wait until release is called (then it runs, however late); held gets
// one value per command held.
func (k *killableClient) holdCommands(part string) (held <-chan struct{}, release func()) {
	g := &commandGate{part: part, release: make(chan struct{}), held: make(chan struct{}, 100)}
	k.hold.Store(g)
	var once sync.Once
	return g.held, func() {
		once.Do(func() {
			k.hold.Store(nil)
			close(g.release)
		})
	}
}

// wait holds cmd while a gate names it, and returns the context to run it
// with (a held command's deadline is lifted).
func (k *killableClient) wait(ctx context.Context, cmd []string) context.Context {
	g := k.hold.Load()
	if g == nil {
		return ctx
	}
	for _, a := range cmd {
		if strings.Contains(a, g.part) {
			g.held <- struct{}{}
			<-g.release
			return context.WithoutCancel(ctx)
		}
	}
	return ctx
}

var errKilled = fmt.Errorf("killed by the test")

// loseCommands makes every command naming a key that contains part fail
// at its deadline (part "": none) and returns the channel that gets them.
func (k *killableClient) loseCommands(part string) <-chan []string {
	if k.lost == nil {
		k.lost = make(chan []string, 100)
	}
	if part == "" {
		k.lose.Store(nil)
	} else {
		k.lose.Store(&part)
	}
	return k.lost
}

// losing reports whether cmd is to be lost.
func (k *killableClient) losing(cmd []string) bool {
	part := k.lose.Load()
	if part == nil {
		return false
	}
	for _, a := range cmd {
		if strings.Contains(a, *part) {
			select {
			case k.lost <- cmd:
			default:
			}
			return true
		}
	}
	return false
}

func (k *killableClient) Do(ctx context.Context, args ...string) (fleetstore.RedisValue, error) {
	if k.dead.Load() {
		return fleetstore.RedisValue{}, errKilled
	}
	if k.losing(args) {
		<-ctx.Done()
		return fleetstore.RedisValue{}, ctx.Err()
	}
	return k.inner.Do(k.wait(ctx, args), args...)
}

func (k *killableClient) Pipeline(ctx context.Context, cmds [][]string) ([]fleetstore.RedisValue, error) {
	if k.dead.Load() {
		return nil, errKilled
	}
	for _, cmd := range cmds {
		if k.losing(cmd) {
			<-ctx.Done()
			return nil, ctx.Err()
		}
	}
	for _, cmd := range cmds {
		ctx = k.wait(ctx, cmd)
	}
	return k.inner.Pipeline(ctx, cmds)
}

// fleetSink records fleet samples and signals claims and counted
// operations.
type fleetSink struct {
	mu      sync.Mutex
	up      float64
	ops     map[string]int
	errs    map[string]int
	claims  chan struct{}
	failed  chan string   // the op of each failed operation
	counted chan struct{} // closed (and replaced) when an operation is counted
}

func newFleetSink() *fleetSink {
	return &fleetSink{up: -1, ops: map[string]int{}, errs: map[string]int{}, claims: make(chan struct{}, 1000), failed: make(chan string, 1000),
		counted: make(chan struct{})}
}

func (s *fleetSink) Record(metric int, labels []string, v float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch metric {
	case core.MetricFleetUp:
		s.up = v
	case core.MetricFleetDuration:
		s.ops[labels[1]]++
		close(s.counted)
		s.counted = make(chan struct{})
		if labels[1] == "claim" {
			s.claims <- struct{}{}
		}
	case core.MetricFleetErrors:
		s.errs[labels[1]]++
		select {
		case s.failed <- labels[1]:
		default:
		}
	}
}

func (s *fleetSink) count(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ops[op]
}

// waitCount waits until op was counted at least n times; false: not
// within the guard (a hang detector, not a margin).
func (s *fleetSink) waitCount(op string, n int, guard time.Duration) bool {
	timeout := time.NewTimer(guard)
	defer timeout.Stop()
	for {
		s.mu.Lock()
		got, counted := s.ops[op], s.counted
		s.mu.Unlock()
		if got >= n {
			return true
		}
		select {
		case <-counted:
		case <-timeout.C:
			return false
		}
	}
}

func (s *fleetSink) isUp() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.up
}

// waitClaim waits until the replica sent a claim.
func (s *fleetSink) waitClaim(t *testing.T) {
	t.Helper()
	select {
	case <-s.claims:
	case <-time.After(60 * time.Second): // bounds a failure only
		t.Fatal("no claim within 60s")
	}
}

// replica is one gateway: a Hedger with its own state and Redis client.
type replica struct {
	srv    *httptest.Server
	hedger *core.Hedger
	client *killableClient
	sink   *fleetSink
	fleet  *core.Fleet
	mu     sync.Mutex
	logs   []string
}

type fleetRig struct {
	redis    *redisproc.Server
	upstream *gatedUpstream
	replicas []*replica
}

func newFleetRig(t *testing.T, n int, tune func(*config.Config)) *fleetRig {
	return newFleetRigClocks(t, make([]core.Clock, n), tune)
}

// newFleetRigClocks is newFleetRig with replica i on clocks[i] (nil: the
// system clock). A loop clock is the fleet's alone: the replica's hedger
// gets its base.
func newFleetRigClocks(t *testing.T, clocks []core.Clock, tune func(*config.Config)) *fleetRig {
	return newFleetRigWith(t, clocks, "go-redis", tune)
}

// newFleetRigClient is newFleetRig with replicas on the Redis client the
// Caddy module and the Envoy server use ("go-redis": fleetredis) or the
// Traefik plugin's ("resp").
func newFleetRigClient(t *testing.T, n int, client string, tune func(*config.Config)) *fleetRig {
	return newFleetRigWith(t, make([]core.Clock, n), client, tune)
}

func newFleetRigWith(t *testing.T, clocks []core.Clock, clientKind string, tune func(*config.Config)) *fleetRig {
	srv := redisproc.Start(t, redisproc.Options{})
	rig := newFleetRigOn(t, srv.URL(), clocks, clientKind, tune)
	rig.redis = srv
	return rig
}

// newFleetRigOn is newFleetRigClocks on the Redis at url (rig.redis nil).
func newFleetRigOn(t *testing.T, url string, clocks []core.Clock, clientKind string, tune func(*config.Config)) *fleetRig {
	rig := &fleetRig{upstream: newGatedUpstream(t)}
	for i := range clocks {
		cfg := config.Config{
			Route:       "fleet",
			Upstreams:   []config.UpstreamConfig{{Name: "up", URL: rig.upstream.srv.URL}},
			MaxAttempts: 1,
			Fleet:       config.FleetConfig{URL: url, Lease: config.Duration(300 * time.Millisecond), RetryInterval: config.Duration(100 * time.Millisecond)},
		}
		if tune != nil {
			tune(&cfg)
		}
		client, err := newRedisClient(clientKind, cfg.Fleet)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		rep := &replica{client: &killableClient{inner: client}, sink: newFleetSink()}
		rep.fleet = core.NewFleet(rep.client, cfg.Fleet, core.FleetOptions{Clock: clocks[i], Metrics: rep.sink, Log: func(fields []core.LogField) {
			var b strings.Builder
			for _, f := range fields {
				b.WriteString(f.Key + "=" + f.Str + " ")
			}
			rep.mu.Lock()
			rep.logs = append(rep.logs, b.String())
			rep.mu.Unlock()
		}})
		t.Cleanup(rep.fleet.Close)
		hedgerClock := clocks[i]
		if loop, ok := hedgerClock.(*loopclock.Clock); ok {
			hedgerClock = loop.Base()
		}
		h, err := core.New(cfg, core.Options{Fleet: rep.fleet, Clock: hedgerClock})
		if err != nil {
			t.Fatal(err)
		}
		rep.hedger = h
		rep.srv = httptest.NewServer(h)
		t.Cleanup(rep.srv.Close)
		rig.replicas = append(rig.replicas, rep)
	}
	return rig
}

// closingClient is a fleetstore.RedisClient the rig closes.
type closingClient interface {
	fleetstore.RedisClient
	Close() error
}

// newRedisClient makes a replica's Redis client of the kind an adapter
// uses, sized as the adapter sizes it.
func newRedisClient(kind string, cfg config.FleetConfig) (closingClient, error) {
	if kind == "resp" {
		return resp.New(resp.Options{URL: cfg.URL, PasswordEnv: cfg.PasswordEnv, MaxBlocking: cfg.WithDefaults().MaxFollowers})
	}
	return fleetredis.New(cfg)
}

// answer is what a client got.
type answer struct {
	status   int
	body     string
	header   http.Header
	complete bool // the body ended cleanly
}

func (rep *replica) send(t *testing.T, key, caller, body string) answer {
	t.Helper()
	resp := rep.open(t, key, caller, body)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: string(b), header: resp.Header, complete: err == nil}
}

// open sends a request and returns the response to read.
func (rep *replica) open(t *testing.T, key, caller, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", rep.srv.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if caller != "" {
		req.Header.Set("Authorization", "Bearer "+caller)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("request: %v", err)
		return &http.Response{StatusCode: 0, Body: io.NopCloser(strings.NewReader("")), Header: http.Header{}}
	}
	return resp
}

// sendAsync sends in a goroutine; the answer arrives on the channel.
func (rep *replica) sendAsync(t *testing.T, key, caller, body string) chan answer {
	ch := make(chan answer, 1)
	go func() { ch <- rep.send(t, key, caller, body) }()
	return ch
}

func recvAnswer(t *testing.T, ch chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(60 * time.Second): // bounds a failure only
		t.Fatal("no answer within 60s")
		return answer{}
	}
}

const chatBody = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// Invariant 1 and 2: a request with the same caller and key on another
// replica joins the flight: one generation, byte-identical answers, from the
// first byte however late the follower arrives; invariant 4: a third
// replica after completion gets the replay.
func TestFleetJoinAcrossReplicas(t *testing.T) {
	rig := newFleetRig(t, 3, nil)
	a, b, c := rig.replicas[0], rig.replicas[1], rig.replicas[2]
	release := rig.upstream.hold("k1", true) // hold after commit: b joins mid-answer
	first := a.sendAsync(t, "k1", "alice", chatBody)
	rig.upstream.waitStarted(t, "k1")
	second := b.sendAsync(t, "k1", "alice", chatBody)
	b.sink.waitClaim(t)
	release()
	ra, rb := recvAnswer(t, first), recvAnswer(t, second)
	if got := rig.upstream.generations("k1"); got != 1 {
		t.Errorf("generations = %d, want 1", got)
	}
	if !ra.complete || !rb.complete || ra.status != 200 || rb.status != 200 {
		t.Fatalf("leader %d complete=%v, follower %d complete=%v, want 200 and complete", ra.status, ra.complete, rb.status, rb.complete)
	}
	if ra.body != rb.body {
		t.Errorf("follower's body differs from the leader's:\n%q\n%q", rb.body, ra.body)
	}
	if !strings.Contains(ra.body, "[DONE]") {
		t.Errorf("leader's body %q lacks [DONE]", ra.body)
	}
	if rb.header.Get("X-Generation") != "1" {
		t.Errorf("follower's X-Generation = %q, want 1 (the leader's headers)", rb.header.Get("X-Generation"))
	}
	rc := c.send(t, "k1", "alice", chatBody)
	if rc.body != ra.body || rc.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("third replica: replayed %q, body equal %v, want the replay", rc.header.Get("Idempotent-Replayed"), rc.body == ra.body)
	}
	if got := rig.upstream.generations("k1"); got != 1 {
		t.Errorf("generations after the replay = %d, want 1", got)
	}
}

// Invariant 4: the same caller and key with another body is a 422 on any
// replica, in flight and after; another caller with the same key has its
// own race.
func TestFleetConflictAndCallerScope(t *testing.T) {
	rig := newFleetRig(t, 2, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	release := rig.upstream.hold("k2", false)
	first := a.sendAsync(t, "k2", "alice", chatBody)
	rig.upstream.waitStarted(t, "k2")
	other := `{"model":"m","stream":true,"messages":[{"role":"user","content":"other"}]}`
	if r := b.send(t, "k2", "alice", other); r.status != 422 {
		t.Errorf("other body in flight: status %d, want 422", r.status)
	}
	bob := b.sendAsync(t, "k2", "bob", chatBody)
	rig.upstream.waitStarted(t, "k2") // bob's own generation
	release()
	recvAnswer(t, first)
	if r := recvAnswer(t, bob); !r.complete || r.status != 200 {
		t.Errorf("bob: status %d complete %v, want 200 complete", r.status, r.complete)
	}
	if got := rig.upstream.generations("k2"); got != 2 {
		t.Errorf("generations = %d, want 2 (alice's and bob's)", got)
	}
	if r := b.send(t, "k2", "alice", other); r.status != 422 {
		t.Errorf("other body after completion: status %d, want 422", r.status)
	}
}

// Invariant 5: requests without a client key send nothing to Redis.
func TestFleetUnkeyedRequestsTouchNoRedis(t *testing.T) {
	rig := newFleetRig(t, 1, nil)
	a := rig.replicas[0]
	for i := 0; i < 5; i++ {
		if r := a.send(t, "", "alice", chatBody); r.status != 200 {
			t.Fatalf("status %d", r.status)
		}
	}
	total := 0
	for _, op := range []string{"claim", "append", "finish", "renew", "read", "lease"} {
		total += a.sink.count(op)
	}
	if total != 0 {
		t.Errorf("fleet operations for unkeyed requests = %d, want 0", total)
	}
	// The route's first request attached it to the fleet (one sync); the
	// loop's keys are the only ones.
	if n := a.sink.count("sync"); n < 1 {
		t.Errorf("sync operations = %d, want the first request's attach at least", n)
	}
	for _, k := range redisArray(t, rig.redis, "KEYS", "*") {
		if !(strings.HasPrefix(k, "llmhedge:{r:") && strings.HasSuffix(k, "}:budget")) && !strings.HasPrefix(k, "llmhedge:{fleet}:replica:") && k != "llmhedge:{fleet}:live" {
			t.Errorf("key %q after unkeyed requests, want only the sync loop's (budget, replica, live)", k)
		}
	}
}

// Invariant 1 (takeover): the leader's replica dies before commit; the
// follower takes over once the lease expired, and its client gets a
// complete answer of one generation; at most two generations.
func TestFleetTakeoverBeforeCommit(t *testing.T) {
	rig := newFleetRig(t, 2, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	release := rig.upstream.hold("k3", false)
	defer release()
	first := a.sendAsync(t, "k3", "alice", chatBody)
	rig.upstream.waitStarted(t, "k3")
	second := b.sendAsync(t, "k3", "alice", chatBody)
	b.sink.waitClaim(t)
	a.client.dead.Store(true) // a's replica is gone as far as Redis can tell
	started := rig.upstream.waitStarted(t, "k3")
	if started != "k3#2" {
		t.Errorf("takeover started %s, want k3#2", started)
	}
	release()
	rb := recvAnswer(t, second)
	if !rb.complete || rb.status != 200 || !strings.Contains(rb.body, "[DONE]") {
		t.Errorf("follower after takeover: status %d complete %v body %q, want a complete answer", rb.status, rb.complete, rb.body)
	}
	if strings.Contains(rb.body, "gen1-") {
		t.Errorf("follower's answer has the dead leader's bytes: %q", rb.body)
	}
	recvAnswer(t, first)
	if got := rig.upstream.generations("k3"); got != 2 {
		t.Errorf("generations = %d, want 2", got)
	}
}

// Invariant 3: the leader's replica dies after commit; the follower's
// answer ends broken, with only the dead generation's bytes (never
// spliced); the cut flight is not stored, and a retry gets a fresh
// complete answer.
func TestFleetCutAfterCommit(t *testing.T) {
	rig := newFleetRig(t, 2, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	release := rig.upstream.hold("k4", true)
	defer release()
	first := a.sendAsync(t, "k4", "alice", chatBody)
	rig.upstream.waitStarted(t, "k4")
	// b's client reads until it has the dead generation's first event.
	resp := b.open(t, "k4", "alice", chatBody)
	defer resp.Body.Close()
	got := readUntil(t, resp.Body, "gen1-tok0")
	a.client.dead.Store(true) // a's replica is gone as far as Redis can tell
	rest, err := io.ReadAll(resp.Body)
	body := got + string(rest)
	if err == nil {
		t.Errorf("follower's answer after the leader died post-commit ended cleanly (%q), want broken", body)
	}
	if strings.Contains(body, "gen2-") || strings.Contains(body, "[DONE]") {
		t.Errorf("follower's answer %q is spliced or finished", body)
	}
	release()
	recvAnswer(t, first)
	retry := b.send(t, "k4", "alice", chatBody)
	if !retry.complete || retry.status != 200 || !strings.Contains(retry.body, "gen2-tok4") || retry.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("retry: status %d complete %v replayed %q body %q, want a fresh complete generation 2",
			retry.status, retry.complete, retry.header.Get("Idempotent-Replayed"), retry.body)
	}
}

// readUntil reads r until what it read contains want, and returns it.
func readUntil(t *testing.T, r io.Reader, want string) string {
	t.Helper()
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(got, []byte(want)) {
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("read %q before %q arrived: %v", got, want, err)
		}
	}
	return string(got)
}

// Invariant 5: with Redis killed every request still succeeds on local
// state; the fleet goes down once (one log line) and comes back up by
// itself after Redis returns, and joins work again.
func TestFleetRedisKilledAndRestarted(t *testing.T) {
	rig := newFleetRig(t, 2, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	rig.redis.Kill()
	for i := 0; i < 10; i++ {
		if r := a.send(t, "down"+strconv.Itoa(i), "alice", chatBody); !r.complete || r.status != 200 {
			t.Fatalf("request %d with Redis down: status %d complete %v", i, r.status, r.complete)
		}
	}
	if a.sink.isUp() != 0 {
		t.Errorf("fleet_up = %v with Redis down, want 0", a.sink.isUp())
	}
	rig.redis.Restart()
	back := time.Now()
	// Both fleets come back up by themselves (their breakers probe):
	// polling their gauges, bounded by deadline.
	deadline := time.Now().Add(30 * time.Second)
	for a.sink.isUp() != 1 || b.sink.isUp() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("fleet_up = %v, %v 30s after Redis' return, want 1, 1", a.sink.isUp(), b.sink.isUp())
		}
		time.Sleep(5 * time.Millisecond) // polling, bounded by deadline
	}
	t.Logf("both fleets up %v after Redis' return", time.Since(back))
	// Once up, joins work: the first key joins (a second chance only for
	// a key whose claim raced the last probe).
	joined := false
	for i := 0; i < 2 && !joined; i++ {
		key := "back" + strconv.Itoa(i)
		release := rig.upstream.hold(key, true)
		first := a.sendAsync(t, key, "alice", chatBody)
		rig.upstream.waitStarted(t, key)
		drain(b.sink.claims)
		second := b.sendAsync(t, key, "alice", chatBody)
		// b either claims through Redis (its fleet is up, or it probes) or,
		// its fleet down, runs a generation of its own.
		select {
		case <-b.sink.claims:
		case <-rig.upstream.startedOf(key, 2):
		case <-time.After(10 * time.Second):
			t.Fatal("b neither claimed nor started a generation")
		}
		release()
		recvAnswer(t, first)
		recvAnswer(t, second)
		joined = rig.upstream.generations(key) == 1
	}
	if !joined {
		t.Fatalf("2 keys after both fleets came back up: generations %d, %d, want a join (1)", rig.upstream.generations("back0"), rig.upstream.generations("back1"))
	}
	a.mu.Lock()
	logs := append([]string(nil), a.logs...)
	a.mu.Unlock()
	if len(logs) != 2 || !strings.Contains(logs[0], "state=down") || !strings.Contains(logs[1], "state=up") {
		t.Errorf("state log lines = %q, want one down and one up", logs)
	}
}

// Invariant 5: a paused Redis (commands unanswered) costs a request at
// most the operation timeout per operation until the breaker opens; no
// request fails.
func TestFleetRedisPausedIsBounded(t *testing.T) {
	rig := newFleetRig(t, 1, nil)
	a := rig.replicas[0]
	a.send(t, "warm", "alice", chatBody) // the pool has a connection
	rig.redis.Pause()
	defer rig.redis.Resume()
	// Redis stays paused and never answers: a request that completes at
	// all had its fleet operations ended by their timeouts (their own
	// duration is the Redis clients' tests' subject), not by a reply.
	for i := 0; i < 6; i++ {
		r := a.send(t, "paused"+strconv.Itoa(i), "alice", chatBody)
		if !r.complete || r.status != 200 {
			t.Fatalf("request %d with Redis paused: status %d complete %v", i, r.status, r.complete)
		}
	}
	if a.fleet.Up() {
		t.Error("fleet up with Redis paused, want down")
	}
}

// Invariant 8: every key has a TTL; a stream is bounded by
// max_response_bytes (an answer beyond it is cut for followers and not
// stored).
func TestFleetKeysExpireAndStreamsAreCapped(t *testing.T) {
	rig := newFleetRig(t, 2, func(c *config.Config) { c.Idempotency.MaxResponseBytes = 4096 })
	a, b := rig.replicas[0], rig.replicas[1]
	a.send(t, "small", "alice", chatBody)
	rig.upstream.mu.Lock()
	rig.upstream.size = 2000
	rig.upstream.mu.Unlock()
	release := rig.upstream.hold("big", true)
	first := a.sendAsync(t, "big", "alice", chatBody)
	rig.upstream.waitStarted(t, "big")
	second := b.sendAsync(t, "big", "alice", chatBody)
	b.sink.waitClaim(t)
	release()
	ra, rb := recvAnswer(t, first), recvAnswer(t, second)
	if !ra.complete {
		t.Error("leader's large answer incomplete, want complete")
	}
	if rb.complete {
		t.Errorf("follower of an answer over max_response_bytes complete (%d bytes), want cut", len(rb.body))
	}
	keys := redisArray(t, rig.redis, "KEYS", "*")
	if len(keys) == 0 {
		t.Fatal("no keys in Redis")
	}
	for _, k := range keys {
		if ttl := redisInt(t, rig.redis, "PTTL", k); ttl <= 0 {
			t.Errorf("key %q has PTTL %d, want a TTL", k, ttl)
		}
		if strings.Contains(k, ":s:") {
			if mem := redisInt(t, rig.redis, "MEMORY", "USAGE", k); mem > 3*4096 {
				t.Errorf("stream %q uses %d bytes, want about max_response_bytes (4096) at most", k, mem)
			}
		}
	}
	if r := b.send(t, "big", "alice", chatBody); r.header.Get("Idempotent-Replayed") != "" {
		t.Error("an answer over max_response_bytes was replayed, want a fresh race")
	}
}

// After SCRIPT FLUSH (a restarted or failed-over Redis) the scripts are
// sent again in full (EVAL) and the fleet keeps working.
func TestFleetScriptFlush(t *testing.T) {
	rig := newFleetRig(t, 2, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	a.send(t, "s1", "alice", chatBody)
	redisInt(t, rig.redis, "SCRIPT", "FLUSH")
	a.send(t, "s2", "alice", chatBody)
	if r := b.send(t, "s2", "alice", chatBody); r.header.Get("Idempotent-Replayed") != "true" {
		t.Error("after SCRIPT FLUSH: no replay on the other replica")
	}
	if !a.fleet.Up() {
		t.Error("NOSCRIPT took the fleet down")
	}
}

// Two replicas claiming at the same moment: many concurrent requests with
// one key on four replicas make one generation.
func TestFleetSimultaneousClaims(t *testing.T) {
	// wall clock: Redis expires a lease in real time (no clock to inject
	// there). The test is about claims, not takeovers: a lease of a minute
	// does not run out while a loaded machine delays a renewal, as the
	// rig's 300ms one did (a second generation).
	rig := newFleetRig(t, 4, func(cfg *config.Config) { cfg.Fleet.Lease = config.Duration(time.Minute) })
	for round := 0; round < 10; round++ {
		key := "same" + strconv.Itoa(round)
		var wg sync.WaitGroup
		bodies := make([]answer, 8)
		for i := range bodies {
			i := i
			wg.Add(1)
			go func() {
				defer wg.Done()
				bodies[i] = rig.replicas[i%4].send(t, key, "alice", chatBody)
			}()
		}
		wg.Wait()
		if got := rig.upstream.generations(key); got != 1 {
			t.Errorf("round %d: generations = %d, want 1", round, got)
		}
		for i := range bodies {
			if bodies[i].body != bodies[0].body || !bodies[i].complete {
				t.Errorf("round %d: answer %d differs or is incomplete", round, i)
			}
		}
	}
}

// drain empties a signal channel.
func drain(ch chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func redisDo(t *testing.T, srv *redisproc.Server, args ...string) fleetstore.RedisValue {
	t.Helper()
	c, err := fleetredis.New(config.FleetConfig{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := c.Do(ctx, args...)
	if err != nil {
		t.Fatalf("%s: %v", args[0], err)
	}
	return v
}

func redisInt(t *testing.T, srv *redisproc.Server, args ...string) int64 {
	t.Helper()
	return redisDo(t, srv, args...).Int
}

func redisArray(t *testing.T, srv *redisproc.Server, args ...string) []string {
	t.Helper()
	var out []string
	for _, v := range redisDo(t, srv, args...).Array {
		out = append(out, v.Str)
	}
	return out
}

// A follower that waits long before the leader commits reads again and
// again (XREAD BLOCK); Redis answers a blocked read on its own clock tick,
// late by up to 100ms, and no read may time out on that: the fleet stays
// up and the follower joins.
func TestFleetLongWaitKeepsTheFleetUp(t *testing.T) {
	rig := newFleetRig(t, 2, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	release := rig.upstream.hold("slow", false)
	first := a.sendAsync(t, "slow", "alice", chatBody)
	rig.upstream.waitStarted(t, "slow")
	second := b.sendAsync(t, "slow", "alice", chatBody)
	b.sink.waitClaim(t)
	// Eight reads of waiting (lease 300ms: 150ms blocks), counted rather
	// than timed: polling the follower's counter, bounded by deadline.
	reads := b.sink.count("read")
	deadline := time.Now().Add(30 * time.Second)
	for b.sink.count("read") < reads+8 {
		if time.Now().After(deadline) {
			release()
			t.Fatalf("the follower read %d times in 30s, want 8", b.sink.count("read")-reads)
		}
		time.Sleep(5 * time.Millisecond) // polling, bounded by deadline
	}
	release()
	ra, rb := recvAnswer(t, first), recvAnswer(t, second)
	if !rb.complete || rb.body != ra.body {
		t.Errorf("follower after a long wait: complete %v, same body %v; want the leader's answer", rb.complete, rb.body == ra.body)
	}
	b.sink.mu.Lock()
	readErrors := b.sink.errs["read"]
	b.sink.mu.Unlock()
	if readErrors != 0 || !b.fleet.Up() {
		t.Errorf("read errors = %d, fleet up %v; want 0 and up", readErrors, b.fleet.Up())
	}
	if got := rig.upstream.generations("slow"); got != 1 {
		t.Errorf("generations = %d, want 1", got)
	}
}

// The leader's client leaves after commit while a follower on another
// replica reads: the race goes on for the follower, which gets the whole
// answer of the one generation.
func TestFleetLeaderClientLeavesFollowerCompletes(t *testing.T) {
	rig := newFleetRig(t, 2, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	release := rig.upstream.hold("left", true)
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", a.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "left")
	req.Header.Set("Authorization", "Bearer alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, resp.Body, "gen1-tok0")
	second := b.sendAsync(t, "left", "alice", chatBody)
	b.sink.waitClaim(t)
	cancel() // the leader's client goes away
	resp.Body.Close()
	waitLeaderGone := time.AfterFunc(200*time.Millisecond, release)
	defer waitLeaderGone.Stop()
	rb := recvAnswer(t, second)
	if !rb.complete || !strings.Contains(rb.body, "gen1-tok4") || !strings.Contains(rb.body, "[DONE]") {
		t.Errorf("follower after the leader's client left: complete %v body %q, want generation 1 whole", rb.complete, rb.body)
	}
	if got := rig.upstream.generations("left"); got != 1 {
		t.Errorf("generations = %d, want 1", got)
	}
}

// Memory in Redis per flight in progress and per stored answer (MEMORY
// USAGE of each key, and used_memory_dataset over 100 flights). With
// LLMHEDGE_FLEET_BENCH=1 only:
//
//	LLMHEDGE_FLEET_BENCH=1 go test -run TestFleetBenchMemory -v ./core/coretest
func TestFleetBenchMemory(t *testing.T) {
	if os.Getenv("LLMHEDGE_FLEET_BENCH") != "1" {
		t.Skip("fleet benchmark: set LLMHEDGE_FLEET_BENCH=1")
	}
	rig := newFleetRig(t, 1, func(c *config.Config) { c.Fleet.Lease = config.Duration(10 * time.Second) })
	a := rig.replicas[0]
	rig.upstream.mu.Lock()
	rig.upstream.events = 50
	rig.upstream.mu.Unlock()
	const n = 100
	used := func() int64 {
		info := redisDo(t, rig.redis, "INFO", "memory").Str
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory_dataset:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		return 0
	}
	base := used()
	var releases []func()
	var answers []chan answer
	for i := 0; i < n; i++ {
		key := "mem-" + strconv.Itoa(i)
		releases = append(releases, rig.upstream.hold(key, true))
		answers = append(answers, a.sendAsync(t, key, "alice", chatBody))
		rig.upstream.waitStarted(t, key)
	}
	// Every leader committed (head and first event appended) once its
	// client has the first bytes: wait for the appends.
	for redisInt(t, rig.redis, "DBSIZE") < 2*n {
		time.Sleep(time.Millisecond) // Redis holds the state; no event to wait on
	}
	inFlight := used() - base
	perKey := map[string]int64{}
	for _, k := range redisArray(t, rig.redis, "KEYS", "*") {
		kind := k[strings.LastIndex(k, "}")+1:]
		if strings.HasPrefix(kind, ":s:") {
			kind = ":s:<holder>"
		}
		perKey[kind] += redisInt(t, rig.redis, "MEMORY", "USAGE", k, "SAMPLES", "0")
	}
	for _, r := range releases {
		r()
	}
	size := 0
	for _, ch := range answers {
		size = len(recvAnswer(t, ch).body)
	}
	stored := used() - base
	doneMem := int64(0)
	streamMem := int64(0)
	for _, k := range redisArray(t, rig.redis, "KEYS", "*") {
		switch {
		case strings.HasSuffix(k, ":done"):
			doneMem += redisInt(t, rig.redis, "MEMORY", "USAGE", k, "SAMPLES", "0")
		case strings.Contains(k, ":s:"):
			streamMem += redisInt(t, rig.redis, "MEMORY", "USAGE", k, "SAMPLES", "0")
		}
	}
	t.Logf("in flight (head + first event appended): used_memory_dataset %d B per flight; MEMORY USAGE lease %d B, stream %d B",
		inFlight/n, perKey[":lease"]/n, perKey[":s:<holder>"]/n)
	t.Logf("stored (answer %d B): used_memory_dataset %d B per answer; done %d B, its stream while it lingers (60s) %d B",
		size, stored/n, doneMem/n, streamMem/n)
}

// skewedClock is the system clock moved by skew: a replica whose wall
// clock is wrong. Its timers are real.
type skewedClock struct{ skew time.Duration }

func (c skewedClock) Now() time.Time { return time.Now().Add(c.skew) }

func (c skewedClock) AfterFunc(d time.Duration, f func()) core.Timer {
	var t core.Timer = time.AfterFunc(d, f)
	return t
}

// Clock skew between replicas changes nothing: leases and stored answers
// expire on Redis' clock (PX), never on a replica's. One replica an hour
// ahead, one an hour behind: joins, replays and a takeover work.
func TestFleetClockSkewBetweenReplicas(t *testing.T) {
	rig := newFleetRigClocks(t, []core.Clock{skewedClock{time.Hour}, skewedClock{-time.Hour}}, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	release := rig.upstream.hold("skew", true)
	first := a.sendAsync(t, "skew", "alice", chatBody)
	rig.upstream.waitStarted(t, "skew")
	second := b.sendAsync(t, "skew", "alice", chatBody)
	b.sink.waitClaim(t)
	release()
	ra, rb := recvAnswer(t, first), recvAnswer(t, second)
	if !rb.complete || rb.body != ra.body || rig.upstream.generations("skew") != 1 {
		t.Errorf("join with skewed clocks: complete %v, same body %v, %d generations; want the leader's one", rb.complete, rb.body == ra.body, rig.upstream.generations("skew"))
	}
	if r := b.send(t, "skew", "alice", chatBody); r.header.Get("Idempotent-Replayed") != "true" {
		t.Error("replay with skewed clocks: not replayed")
	}
	hold := rig.upstream.hold("skew2", false)
	defer hold()
	lead := b.sendAsync(t, "skew2", "alice", chatBody)
	rig.upstream.waitStarted(t, "skew2")
	follow := a.sendAsync(t, "skew2", "alice", chatBody)
	a.sink.waitClaim(t)
	b.client.dead.Store(true)
	if got := rig.upstream.waitStarted(t, "skew2"); got != "skew2#2" {
		t.Errorf("takeover with skewed clocks started %s, want skew2#2", got)
	}
	hold()
	if r := recvAnswer(t, follow); !r.complete {
		t.Error("takeover with skewed clocks: incomplete answer")
	}
	recvAnswer(t, lead)
}

// The leader's client (like the OpenAI SDK) closes at [DONE] while the
// upstream's EOF waits: the race ends at the end marker, so the answer is
// stored and a twin on another replica gets it instead of a second
// generation.
func TestFleetAnswerWholeAtDoneIsStored(t *testing.T) {
	rig := newFleetRig(t, 2, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	tail := make(chan struct{})
	defer close(tail)
	rig.upstream.mu.Lock()
	rig.upstream.tail["atdone"] = tail
	rig.upstream.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", a.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "atdone")
	req.Header.Set("Authorization", "Bearer alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got := readUntil(t, resp.Body, "[DONE]")
	cancel() // the client has the whole answer and goes
	resp.Body.Close()
	select {
	case <-rig.upstream.cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the leader's race was not cancelled")
	}
	rb := b.send(t, "atdone", "alice", chatBody)
	if !rb.complete || rb.body != got {
		t.Errorf("twin after the leader's client left at [DONE]: complete %v, same body %v; want the whole answer", rb.complete, rb.body == got)
	}
	if n := rig.upstream.generations("atdone"); n != 1 {
		t.Errorf("generations = %d, want 1", n)
	}
}
