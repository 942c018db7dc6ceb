package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
	"github.com/llmhedge/llmhedge/internal/testkit/refload"
)

// The acceptance test of the Yaegi-safety issue through the real Traefik:
// the plugin, interpreted by Yaegi v0.16.1 inside Traefik v3.6.12, serves
// the reference workload (BENCHMARKS.md) to many concurrent streaming clients with
// hedges firing, and every answer must be its own request's, byte for byte,
// with no panic, no hang and no goroutine left behind in Traefik.

// Stress sizes. LLMHEDGE_STRESS=full runs the acceptance form; without it
// the bounded form runs in CI (one run, short enough for every `go test`).
const (
	stressClients      = 50
	stressFullRequests = 20000
	stressFullRuns     = 3
	stressCIRequests   = 1000
	// stressTimeout is how long one request may take before it counts as a
	// hang: the slowest honest answer of the workload at scale 0.05 (a 1 s
	// stall on both upstreams, then the stream) is a few seconds even on a
	// loaded machine. wall clock: a hang has no event to wait for; only a
	// bound far above the slowest answer tells it from slow.
	stressTimeout = 30 * time.Second
	// goroutineSlack is how many more goroutines Traefik may have after a
	// run than the reference count (pprof's own request, timers of the
	// file provider, connections of the readiness polls).
	goroutineSlack = 50
	// settleDeadline bounds the wait for Traefik's goroutines to wind down
	// once the connections are closed.
	settleDeadline = 30 * time.Second
)

// stressSize returns the requests per run and the number of runs.
func stressSize() (requests, runs int) {
	if os.Getenv("LLMHEDGE_STRESS") == "full" {
		return stressFullRequests, stressFullRuns
	}
	return stressCIRequests, 1
}

// TestStressThroughTraefik drives refload (which checks every answer
// against its own request id and exactly one upstream) through the plugin
// in Traefik, with the hedge delay at the primary's true p95 TTFT so that
// about 5 % of requests hedge, and checks after every run: no wrong or
// missing answer, no request past its deadline, no panic in Traefik's
// output, Traefik still running, and Traefik's goroutine count back where it
// started.
func TestStressThroughTraefik(t *testing.T) {
	requests, runs := stressSize()
	wl := llmsim.Reference(11, 0.05)
	a, b := startStressUpstream("A", wl), startStressUpstream("B", wl)
	defer a.Close()
	defer b.Close()
	delay := wl.TrueQuantile(0.95)
	d := newDynamic("stress").
		hedge("hedge", pluginConfig([][2]string{{"A", a.URL}, {"B", b.URL}}, "delay: "+delay.String(), "log: off")).
		route("hedge", "noop@internal", "hedge")
	// DEBUG: net/http's "http: panic serving" and Traefik's aborted-request
	// lines are written at that level only.
	tr, api := startTraefikWithDebugAPI(t, "DEBUG", d)

	clientTransport := &http.Transport{MaxIdleConns: 2 * stressClients, MaxIdleConnsPerHost: 2 * stressClients, IdleConnTimeout: time.Minute}
	hangs := &deadlineCounter{next: clientTransport}
	before := api.goroutines(t)
	t.Logf("reference workload at scale 0.05, hedge delay %v (true p95), %d clients, %d requests x %d runs, per-request timeout %v",
		delay, stressClients, requests, runs, stressTimeout)
	t.Logf("Traefik goroutines before the runs: %d", before)
	var idleAfterFirst int
	for run := 1; run <= runs; run++ {
		a.ResetCounters()
		b.ResetCounters()
		hangs.n.Store(0)
		logStart := len(tr.logs.String())
		res := refload.Run(context.Background(), refload.Options{
			URL: tr.URL + "/hedge/v1/chat/completions", N: requests, Concurrency: stressClients,
			IDPrefix: fmt.Sprintf("run%d-", run), Upstreams: []string{"A", "B"}, Tokens: wl.WithDefaults().Tokens,
			Client: &http.Client{Transport: hangs}, Timeout: stressTimeout,
		})
		tr.mustBeRunning()
		served := a.Served() + b.Served()
		bWins := 0
		for _, w := range res.Winner {
			if w == "B" {
				bWins++
			}
		}
		// The clients leave; Traefik's connections to them must then end.
		clientTransport.CloseIdleConnections()
		idle := api.settle(t, math.MaxInt)
		if run == 1 {
			idleAfterFirst = idle
		}
		// The upstreams close the plugin's pooled connections too (their
		// idle timeout is 90 s): what remains is what the requests left.
		a.CloseClientConnections()
		b.CloseClientConnections()
		drained := api.settle(t, before+goroutineSlack)
		logs := tr.logs.String()[logStart:]
		panics, aborts := panicLines(logs), strings.Count(logs, "Request has been aborted")

		t.Logf("run %d: %d requests, %d wrong, %d failed (of which %d hangs), %d panics, %d aborted; "+
			"upstream attempts %d (+%.2f%% hedges), B won %d; wall %v (%.0f req/s); "+
			"Traefik goroutines: before %d, after run (upstream pool open) %d, after connections closed %d",
			run, requests, res.Wrong, res.Failed, hangs.n.Load(), len(panics), aborts,
			served, 100*float64(served-int64(requests))/float64(requests), bWins,
			res.Wall.Round(time.Millisecond), float64(requests)/res.Wall.Seconds(), before, idle, drained)
		if res.Wrong != 0 || res.Failed != 0 {
			t.Errorf("run %d: %d wrong and %d failed answers (%d past the %v deadline): %q",
				run, res.Wrong, res.Failed, hangs.n.Load(), stressTimeout, res.Errors)
		}
		if len(panics) != 0 {
			t.Errorf("run %d: %d panic lines in Traefik's output, first: %q", run, len(panics), firstLines(strings.Join(panics, "\n"), 5))
		}
		if aborts != 0 {
			t.Errorf("run %d: Traefik aborted %d responses", run, aborts)
		}
		// Hedges must actually fire, or the run proves nothing about them.
		if extra := float64(served-int64(requests)) / float64(requests); extra < 0.02 {
			t.Errorf("run %d: only %.2f%% extra upstream attempts; the hedges did not fire", run, 100*extra)
		}
		if run > 1 && idle > idleAfterFirst+goroutineSlack {
			t.Errorf("run %d: Traefik has %d goroutines with the upstream pool open, %d after run 1 (slack %d)", run, idle, idleAfterFirst, goroutineSlack)
		}
		if drained > before+goroutineSlack {
			t.Errorf("run %d: Traefik has %d goroutines once every connection is closed, %d before the runs (slack %d); top stacks:\n%s",
				run, drained, before, goroutineSlack, api.goroutineStacks(6000))
		}
		if t.Failed() {
			return
		}
	}
	if all := panicLines(tr.logs.String()); len(all) != 0 {
		t.Errorf("%d panic lines in Traefik's whole output, first: %q", len(all), firstLines(strings.Join(all, "\n"), 5))
	}
}

// stressUpstream is an llmsim server whose connections the test can close,
// so that the plugin's idle upstream connections end when the test says.
type stressUpstream struct {
	*llmsim.Server
	URL string
	ts  *httptest.Server
}

func startStressUpstream(name string, wl llmsim.Workload) *stressUpstream {
	s := &llmsim.Server{Name: name, Workload: wl}
	ts := httptest.NewServer(s)
	return &stressUpstream{Server: s, URL: ts.URL, ts: ts}
}

// CloseClientConnections closes every connection to the server.
func (u *stressUpstream) CloseClientConnections() { u.ts.CloseClientConnections() }

// Close stops the server.
func (u *stressUpstream) Close() {
	u.ts.CloseClientConnections()
	u.ts.Close()
}

// deadlineCounter counts the requests that reached their context deadline
// (refload's per-request timeout): a request cancelled after it ended has
// context.Canceled instead, so only hangs are counted.
type deadlineCounter struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *deadlineCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx := r.Context()
	context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			c.n.Add(1)
		}
	})
	return c.next.RoundTrip(r)
}

// panicMarker matches the lines of a panic: Traefik's recovery middleware
// ("Recovered from panic in HTTP handler"), net/http's "http: panic
// serving", a process crash ("panic: ..."), runtime errors and the header
// line of every goroutine in a stack trace.
var panicMarker = regexp.MustCompile(`(?i)panic|runtime error|^goroutine \d+ \[`)

// panicLines returns the lines of logs that belong to a panic.
func panicLines(logs string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		if panicMarker.MatchString(sc.Text()) {
			out = append(out, sc.Text())
		}
	}
	return out
}

// mustBeRunning fails the test at once if Traefik has exited (a crash).
func (tr *traefik) mustBeRunning() {
	select {
	case <-tr.exited:
		tr.t.Fatalf("traefik exited:\n%s", proc.Tail(tr.logs.String(), 6000))
	default:
	}
}

// debugAPI is Traefik's API entry point with api.debug on, which serves
// Go's pprof handlers under /debug/pprof/.
type debugAPI struct {
	url    string
	client *http.Client
}

// startTraefikWithDebugAPI is startTraefik with Traefik's API served
// insecurely on its own loopback entry point ("traefik") and the debug
// endpoints on: the stress test reads Traefik's goroutine count there.
func startTraefikWithDebugAPI(t testing.TB, logLevel string, d *dynamic) (*traefik, debugAPI) {
	tr, adminURL := launchTraefik(t, logLevel, d, true)
	// Every connection of the poller is new, so that none of its own stays
	// open in Traefik between two counts.
	dbg := debugAPI{url: adminURL,
		client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}}
	tr.waitFor(dbg.url + "/debug/pprof/")
	return tr, dbg
}

// goroutines returns Traefik's goroutine count, from the first line of
// /debug/pprof/goroutine?debug=1 ("goroutine profile: total N").
func (d debugAPI) goroutines(t testing.TB) int {
	t.Helper()
	resp, err := d.client.Get(d.url + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatalf("reading Traefik's goroutine profile: %v", err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	var n int
	if _, serr := fmt.Sscanf(line, "goroutine profile: total %d", &n); resp.StatusCode != http.StatusOK || serr != nil {
		t.Fatalf("Traefik's goroutine profile: status %d, first line %q (%v, %v)", resp.StatusCode, line, err, serr)
	}
	return n
}

// goroutineStacks returns the start of Traefik's goroutine profile, the
// stacks grouped and counted, largest groups first.
func (d debugAPI) goroutineStacks(limit int) string {
	resp, err := d.client.Get(d.url + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, int64(limit)))
	return string(b)
}

// settle polls Traefik's goroutine count until it is at most atMost and
// has not changed for a second, or settleDeadline passes, and returns the
// last count. Traefik is another process: polling with a deadline is how to
// see its connections wind down.
func (d debugAPI) settle(t testing.TB, atMost int) int {
	deadline := time.Now().Add(settleDeadline)
	n, since := d.goroutines(t), time.Now()
	for (n > atMost || time.Since(since) < time.Second) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if m := d.goroutines(t); m != n {
			n, since = m, time.Now()
		}
	}
	return n
}

// TestPanicLinesRecognisesPanics checks the scanner on the shapes a panic
// takes in Traefik's output, and that ordinary lines pass.
func TestPanicLinesRecognisesPanics(t *testing.T) {
	logs := strings.Join([]string{
		`2026-01-01T00:00:00Z ERR github.com/traefik/traefik/v3/pkg/middlewares/recovery/recovery.go:49 > Recovered from panic in HTTP handler [127.0.0.1:1234 - /v1/chat/completions]: boom`,
		`2026-01-01T00:00:00Z DBG log/log.go:245 > http: panic serving 127.0.0.1:1234: boom`,
		`panic: runtime error: invalid memory address or nil pointer dereference`,
		`goroutine 17 [running]:`,
		`2026-01-01T00:00:00Z INF github.com/traefik/traefik/v3/pkg/server/server.go:52 > Stopping server gracefully`,
		`2026-01-01T00:00:00Z DBG github.com/traefik/traefik/v3/pkg/middlewares/recovery/recovery.go:25 > Creating middleware middlewareType=Recovery`,
	}, "\n")
	if got := panicLines(logs); len(got) != 4 {
		t.Fatalf("found %d panic lines, want 4: %q", len(got), got)
	}
}
