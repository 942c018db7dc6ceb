package yaegistress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// The reference workload (BENCHMARKS.md, "The reference workload") at a twentieth of real time: TTFT
// lognormal around 30ms with 2% stalls of 0.5–1s, 20 tokens 1ms apart,
// keep-alive pings every 12.5ms while an upstream "thinks".
const (
	loadScale = 0.05
	loadSeed  = 6
	// hedgeQuantile of the workload's TTFT is the fixed hedge delay, so
	// hedges fire on ~5% of requests (the stalls and the slow tail).
	hedgeQuantile = 0.95
	// clientDeadline is far above any correct request (a stall is at most
	// 1s and is hedged); a request still running then is a hang. wall
	// clock: a hang has no event to wait for; only a bound tells it from
	// slow (with both cores busy the slowest answers took a few seconds).
	clientDeadline = 20 * time.Second
	// drainDeadline bounds the wait for goroutines to return to baseline
	// after everything was closed.
	drainDeadline = 20 * time.Second
	model         = "sim-model"
)

// Every twentieth request sends an Idempotency-Key, and every twentieth
// (offset by ten) is sent twice at once with the same key, so the
// idempotency table, its flights and their sync.Cond followers run too.
const (
	keyedEvery    = 20
	keyedOffset   = 10
	twinEvery     = 20
	headerIdemKey = "Idempotency-Key"
)

// builder makes the handler under test for upstreams A and B and a hedge
// delay; it may count what it sees into run. release, if not nil, closes
// what the handler holds (idle connections) once the load is over.
type builder func(t testing.TB, run *loadRun, a, b string, delay time.Duration) (h http.Handler, release func())

// loadRun is the result of one load run.
type loadRun struct {
	mode                   string
	requests               int
	ok, wrong, errs, hangs int64
	panics                 int64 // recovered in the guard or logged by the server
	hedges                 int64 // attempts that reached upstream B
	keyed, twins           int
	cancelled              int64 // attempts the upstreams saw abandoned (lost hedges)
	completed              int64 // attempts the upstreams answered in full
	goroutinesBefore, peak int
	goroutinesAfter        int
	wall                   time.Duration
	// awaitRenewal, set by a builder, adds a keyed warm-up request whose
	// first token is held until awaitRenewal returns (fleet mode: once
	// the leader renewed its lease, so that the renewal path is warmed up
	// too).
	awaitRenewal func()

	mu       sync.Mutex
	examples []string       // the first few failures
	outcomes map[string]int // core's Report.Outcome counts, when observed
}

// observe counts one core Report (see corehandler.New).
func (r *loadRun) observe(outcome string, _ int, _ string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.outcomes == nil {
		r.outcomes = make(map[string]int)
	}
	r.outcomes[outcome]++
}

func (r *loadRun) String() string {
	return fmt.Sprintf("%s: requests=%d ok=%d wrong=%d panics=%d hangs=%d errors=%d hedges=%d (%.1f%%) keyed=%d twins=%d "+
		"upstream-completed=%d upstream-cancelled=%d goroutines before=%d peak=%d after=%d wall=%v (%.0f req/s)",
		r.mode, r.requests, r.ok, r.wrong, r.panics, r.hangs, r.errs, r.hedges, 100*float64(r.hedges)/float64(r.requests),
		r.keyed, r.twins, r.completed, r.cancelled, r.goroutinesBefore, r.peak, r.goroutinesAfter, r.wall.Round(time.Millisecond),
		float64(r.requests)/r.wall.Seconds())
}

// note counts a failure and keeps its description if there is room.
func (r *loadRun) note(counter *int64, format string, args ...any) {
	atomic.AddInt64(counter, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.examples) < 5 {
		r.examples = append(r.examples, fmt.Sprintf(format, args...))
	}
}

// check fails t unless the run was clean: every answer its own, no panic,
// hang, error or leaked goroutine, and hedges fired.
func (r *loadRun) check(t testing.TB) {
	t.Helper()
	t.Log(r.String())
	if r.outcomes != nil {
		t.Logf("  core outcomes: %v", r.outcomes)
	}
	for _, e := range r.examples {
		t.Log("  ", e)
	}
	if r.wrong != 0 || r.panics != 0 || r.hangs != 0 || r.errs != 0 || r.ok != int64(r.requests) {
		t.Errorf("%s: not clean: %d wrong, %d panics, %d hangs, %d errors, %d/%d ok",
			r.mode, r.wrong, r.panics, r.hangs, r.errs, r.ok, r.requests)
	}
	if r.goroutinesAfter > r.goroutinesBefore {
		t.Errorf("%s: goroutines leaked: %d before, %d after", r.mode, r.goroutinesBefore, r.goroutinesAfter)
	}
	if r.hedges*100 < int64(r.requests) {
		t.Errorf("%s: only %d hedges in %d requests; the hedge path was not exercised", r.mode, r.hedges, r.requests)
	}
}

// chatRequest is the body every client sends for request id.
func chatRequest(id string) []byte {
	return []byte(`{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"answer ` + id + `"}]}`)
}

// loadItem is one client request; twins share id and key.
type loadItem struct {
	id       string
	keyed    bool
	behavior string // X-Sim-Behavior, to force a path during the warm-up
}

// planLoad lays out n requests: unique ids, some keyed, some keyed twins.
func planLoad(prefix string, n int) (items []loadItem, keyed, twins int) {
	for k := 0; len(items) < n; k++ {
		id := fmt.Sprintf("%s-%06d", prefix, k)
		switch {
		case k%twinEvery == 0 && len(items)+2 <= n:
			items = append(items, loadItem{id: id, keyed: true}, loadItem{id: id, keyed: true})
			twins++
			keyed += 2
		case k%keyedEvery == keyedOffset:
			items = append(items, loadItem{id: id, keyed: true})
			keyed++
		default:
			items = append(items, loadItem{id: id})
		}
	}
	return items, keyed, twins
}

// guard is the front handler: it runs the handler under test and counts
// its panics other than http.ErrAbortHandler (which core raises on purpose
// for a stream that broke after commit, and which is then an error for the
// client, never silent).
type guard struct {
	next http.Handler
	run  *loadRun
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		if v != http.ErrAbortHandler {
			g.run.note(&g.run.panics, "handler panicked for %s: %v", r.Header.Get(llmsim.HeaderRequest), v)
		}
		panic(http.ErrAbortHandler)
	}()
	g.next.ServeHTTP(w, r)
}

// panicLog counts the panics net/http logs (those the guard cannot see).
type panicLog struct{ run *loadRun }

func (p panicLog) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("panic")) {
		p.run.note(&p.run.panics, "server log: %s", strings.TrimSpace(string(b)))
	}
	return len(b), nil
}

// runLoad serves the handler that build makes on 127.0.0.1 in front of two
// simulated upstreams and sends it n streaming requests from `clients`
// goroutines, checking each answer byte for byte against its own request.
func runLoad(t testing.TB, mode string, build builder, n, clients int) *loadRun {
	t.Helper()
	run := &loadRun{mode: mode, requests: n}
	run.goroutinesBefore = runtime.NumGoroutine()

	wl := llmsim.Reference(loadSeed, loadScale)
	// The warm-up holds chosen requests' first tokens at both upstreams.
	hold := &llmsim.TokenHold{}
	upA := hold.Start(&llmsim.Server{Name: "A", Workload: wl, LogLimit: 1})
	upB := hold.Start(&llmsim.Server{Name: "B", Workload: wl, LogLimit: 1})
	delay := wl.TrueQuantile(hedgeQuantile)
	handler, release := build(t, run, upA.URL, upB.URL, delay)

	front := httptest.NewUnstartedServer(&guard{next: handler, run: run})
	front.Config.ErrorLog = log.New(panicLog{run}, "", 0)
	front.Start()
	transport := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: 2 * clients}
	client := &http.Client{Transport: transport}

	prefix := strings.ReplaceAll(mode, " ", "-")
	// Interpreted under -race only (LLMHEDGE_STRESS_INPROCESS=1, see
	// child_test.go): compiled code has no lazy cache to warm.
	if raceEnabled && strings.Contains(mode, "interpreted") && os.Getenv("LLMHEDGE_STRESS_COLD") == "" {
		warmUp(t, warmRig{client: client, url: front.URL, hold: hold, b: upB}, prefix, wl.WithDefaults().Tokens, run)
		// Core observes a request before its response ends, so every
		// warm-up report is in; the load's are counted from zero. Where
		// core reports (the core runs), the warm-up must have joined and
		// replayed: the paths its gates force.
		run.mu.Lock()
		warmed := run.outcomes
		run.outcomes = nil
		run.mu.Unlock()
		if warmed != nil && (warmed[core.OutcomeJoined] < 1 || warmed[core.OutcomeReplayed] < 1) {
			run.note(&run.errs, "warm-up: core reported %v, want a joined and a replayed request", warmed)
		}
	}
	servedB := upB.Served()
	cancelled := upA.Cancelled() + upB.Cancelled()
	completed := upA.Completed() + upB.Completed()
	items, keyed, twins := planLoad(prefix, n)
	run.keyed, run.twins = keyed, twins
	var next atomic.Int64
	var wg sync.WaitGroup
	stopPeak := sampleGoroutines(&run.peak)
	start := time.Now()
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := int(next.Add(1)) - 1
				if k >= len(items) {
					return
				}
				sendAndCheck(client, front.URL, items[k], wl.WithDefaults().Tokens, run)
			}
		}()
	}
	wg.Wait()
	run.wall = time.Since(start)
	stopPeak()
	settle(upA.Server)
	settle(upB.Server)
	run.hedges = upB.Served() - servedB
	run.cancelled = upA.Cancelled() + upB.Cancelled() - cancelled
	run.completed = upA.Completed() + upB.Completed() - completed

	// Close everything, then wait for the goroutine count to come back.
	transport.CloseIdleConnections()
	closeWithin(front, drainDeadline, run)
	if release != nil {
		release()
	}
	upA.Close()
	upB.Close()
	run.goroutinesAfter = waitGoroutines(run.goroutinesBefore, drainDeadline)
	if run.goroutinesAfter > run.goroutinesBefore {
		t.Logf("%s: goroutines still running:\n%s", mode, goroutineDump())
	}
	return run
}

// warmUp sends one request down each path of the engine (plain, hedge won,
// primary won after the hedge, keyed, replayed, joined) before the load,
// when the race detector is on. Yaegi v0.16.1 computes an interpreted
// type's reflect type lazily, the first time it is needed, and caches it
// without synchronisation (interp/type.go, refType): the first concurrent
// uses of a code path race on that cache. Every writer stores the same
// canonical type, so the race has no effect, but the detector would fail
// the test on it; after the warm-up the load itself must be free of data
// races. Its requests are checked like the load's but not counted in it.
// LLMHEDGE_STRESS_COLD=1 skips it, to see that race. It runs only for the
// interpreted loads kept under -race with LLMHEDGE_STRESS_INPROCESS=1: by
// default they run in a child without -race (child_test.go), as no
// warm-up reaches every path a loaded machine takes.
//
// Each path is forced by an event, not a TTFT: a path that a slow machine
// let slip (a hedge that lost its race, a follower that came after its
// leader's end) would be cold, and its first concurrent use under the load
// would trip the race detector on Yaegi's cache.
func warmUp(t testing.TB, rig warmRig, prefix string, tokens int, run *loadRun) {
	warm := &loadRun{mode: "warm-up"}
	send := func(it loadItem) { sendAndCheck(rig.client, rig.url, it, tokens, warm) }
	sent := 0
	// Plain; the hedge wins (A never sends a token); the keyed path and
	// its replay, one after the other.
	for _, it := range []loadItem{
		{id: prefix + "-warm-plain"},
		{id: prefix + "-warm-hedge-wins", behavior: "A=stall"},
		{id: prefix + "-warm-keyed", keyed: true},
		{id: prefix + "-warm-keyed", keyed: true}, // replayed
	} {
		send(it)
		sent++
	}
	// The primary wins after the hedge: A's first token is held until B
	// has the hedge, which never answers.
	primaryWins := loadItem{id: prefix + "-warm-primary-wins", behavior: "A=ttft:1ms;B=stall"}
	rig.heldUntil(t, primaryWins.id, send, primaryWins, func() {
		rig.waitB(t, primaryWins.id, "the hedge of "+primaryWins.id)
	})
	sent++
	if run.awaitRenewal != nil {
		// A keyed leader held until it renewed its lease.
		slow := loadItem{id: prefix + "-warm-keyed-slow", keyed: true}
		rig.heldUntil(t, slow.id, send, slow, run.awaitRenewal)
		sent++
	}
	// A leader and a follower at once: the leader's upstream holds its
	// first token until the follower waits for the flight.
	twin := loadItem{id: prefix + "-warm-twin", keyed: true}
	done := make(chan struct{})
	rig.heldUntil(t, twin.id, send, twin, func() {
		go func() {
			send(twin)
			close(done)
		}()
		awaitFollower(t, twin.id)
	})
	<-done
	sent += 2
	if warm.ok != int64(sent) {
		run.note(&run.errs, "warm-up: %d of %d requests failed: %v", int64(sent)-warm.ok, sent, warm.examples)
	}
}

// warmRig is what the warm-up drives: the front, and the upstreams' hold.
type warmRig struct {
	client *http.Client
	url    string
	hold   *llmsim.TokenHold
	b      *llmsim.Running
}

// heldUntil sends it with its first token held at both upstreams until
// the request reached that token and then until do returned.
func (rig warmRig) heldUntil(t testing.TB, id string, send func(loadItem), it loadItem, do func()) {
	reached, release := rig.hold.Hold(id)
	defer release()
	done := make(chan struct{})
	go func() {
		send(it)
		close(done)
	}()
	select {
	case <-reached:
	case <-done: // failed before its first token: sendAndCheck counted it
		return
	}
	do()
	release()
	<-done
}

// waitB waits for upstream B to have received request id (an event; the
// deadline only guards against a hedge that never comes).
func (rig warmRig) waitB(t testing.TB, id, what string) {
	ctx, cancel := context.WithTimeout(context.Background(), warmDeadline)
	defer cancel()
	if err := rig.b.WaitFor(ctx, func() bool { return rig.b.Attempts(id) > 0 }); err != nil {
		t.Fatalf("warm-up: no %s: %v", what, err)
	}
}

// warmDeadline guards the warm-up's waits for events against a hang.
const warmDeadline = 60 * time.Second

// awaitFollower polls this process's goroutines (core gives no event for
// it) until one more waits in sync.Cond.Wait than when it started: an
// idempotency follower, the only user of sync.Cond here, waiting for its
// flight. Bounded by warmDeadline.
func awaitFollower(t testing.TB, id string) {
	before := condWaiters()
	deadline := time.Now().Add(warmDeadline)
	for condWaiters() <= before {
		if time.Now().After(deadline) {
			t.Fatalf("warm-up: the twin of %s never waited for its leader's flight", id)
		}
		time.Sleep(time.Millisecond)
	}
}

// condWaiters counts the goroutines blocked in sync.Cond.Wait.
func condWaiters() int {
	buf := make([]byte, 8<<20) // every stack: the warm-up runs few goroutines
	buf = buf[:runtime.Stack(buf, true)]
	return bytes.Count(buf, []byte("sync.(*Cond).Wait("))
}

// sendAndCheck sends one request and classifies its answer.
func sendAndCheck(client *http.Client, url string, it loadItem, tokens int, run *loadRun) {
	ctx, cancel := context.WithTimeout(context.Background(), clientDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(chatRequest(it.id)))
	if err != nil {
		run.note(&run.errs, "%s: %v", it.id, err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(llmsim.HeaderRequest, it.id)
	if it.keyed {
		req.Header.Set(headerIdemKey, "key-"+it.id)
	}
	if it.behavior != "" {
		req.Header.Set(llmsim.HeaderBehavior, it.behavior)
	}
	resp, err := client.Do(req)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
		run.note(&run.hangs, "%s: no complete answer within %v", it.id, clientDeadline)
	case err != nil:
		run.note(&run.errs, "%s: %v", it.id, err)
	case resp.StatusCode != http.StatusOK:
		run.note(&run.errs, "%s: status %d: %.200s", it.id, resp.StatusCode, body)
	default:
		if why := wrongAnswer(it.id, tokens, resp.Header, body); why != "" {
			run.note(&run.wrong, "%s: %s", it.id, why)
			return
		}
		atomic.AddInt64(&run.ok, 1)
	}
}

// wrongAnswer returns why body (with headers) is not exactly the answer to
// id from one upstream, or "" when it is.
//
// A race still undecided after the grace time sends its headers early
// (core's early headers: 200, text/event-stream and keep-alive comments):
// such an answer carries no upstream's headers, so only its body, after
// the keep-alives, is checked.
func wrongAnswer(id string, tokens int, hdr http.Header, body []byte) string {
	early := hdr.Get(llmsim.HeaderRequest) == "" && bytes.HasPrefix(body, keepAlive)
	for bytes.HasPrefix(body, keepAlive) {
		body = body[len(keepAlive):]
	}
	got := llmsim.StripPings(body)
	up := hdr.Get(llmsim.HeaderUpstream)
	if hid := hdr.Get(llmsim.HeaderRequest); hid != id && !early {
		return fmt.Sprintf("headers belong to request %q (upstream %q)", hid, up)
	}
	for _, name := range []string{"A", "B"} {
		if bytes.Equal(got, llmsim.ExpectedStream(name, model, id, tokens)) {
			if up != name && !early {
				return fmt.Sprintf("body from upstream %s under the headers of upstream %q", name, up)
			}
			return ""
		}
	}
	if !bytes.Contains(got, []byte(id+":")) {
		return fmt.Sprintf("another request's answer: %.160q", got)
	}
	return fmt.Sprintf("not one upstream's exact answer (spliced or cut, %d bytes): %.160q", len(got), got)
}

// keepAlive is the comment of a race whose headers went out early.
var keepAlive = []byte(": keep-alive\n\n")

// settle waits (bounded) until no handler of s runs, so its counters are final.
func settle(s *llmsim.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), drainDeadline)
	defer cancel()
	s.WaitFor(ctx, func() bool { return s.InFlight() == 0 })
}

// closeWithin closes srv, counting a handler that never returns as a hang
// instead of hanging the test.
func closeWithin(srv *httptest.Server, d time.Duration, run *loadRun) {
	srv.CloseClientConnections()
	done := make(chan struct{})
	go func() {
		srv.Close()
		close(done)
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		run.note(&run.hangs, "front server still had handlers running %v after its clients left:\n%s", d, goroutineDump())
	}
}

// sampleGoroutines records the highest goroutine count until stopped.
func sampleGoroutines(peak *int) (stop func()) {
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if n := runtime.NumGoroutine(); n > *peak {
				*peak = n
			}
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// waitGoroutines polls until at most want goroutines run or d passes, and
// returns the last count.
func waitGoroutines(want int, d time.Duration) int {
	deadline := time.Now().Add(d)
	for {
		n := runtime.NumGoroutine()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// goroutineDump returns the stacks of every goroutine, cut to a readable size.
func goroutineDump() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	if len(buf) > 20000 {
		buf = append(buf[:20000], "\n..."...)
	}
	return string(buf)
}
