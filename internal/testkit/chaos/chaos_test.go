package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// The upstream sends exactly what Generation.Expected renders, streaming
// and not, and each fault cuts it where the script says.
func TestUpstreamAnswersAreTheirExpectedBytes(t *testing.T) {
	env := NewEnv(t)
	for _, tc := range []struct {
		stream   bool
		act      Action
		complete bool // the body is the whole Expected, read cleanly
		status   int
	}{
		{true, Action{Kind: ActOK}, true, 200},
		{false, Action{Kind: ActOK}, true, 200},
		{true, Action{Kind: ActResetAfter, K: 2}, false, 200},
		{true, Action{Kind: ActTruncate, K: 2}, false, 200},
		{false, Action{Kind: ActTruncate}, false, 200},
		{true, Action{Kind: ActStatus, K: 429}, false, 429},
	} {
		body := `{"model":"chaos","stream":false}`
		if tc.stream {
			body = `{"model":"chaos","stream":true}`
		}
		req, _ := http.NewRequest(http.MethodPost, env.URLA+Path, strings.NewReader(body))
		req.Header.Set(HeaderRequest, "direct-"+tc.act.String())
		req.Header.Set(HeaderPlan, Plan{Default: tc.act}.header())
		req.Header.Set(HeaderShape, Shape{Chunks: 4, Padding: 3}.header())
		req.Header.Set("Authorization", authorization(1))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, readErr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Fatalf("%v: status %d, want %d", tc.act, resp.StatusCode, tc.status)
		}
		if tc.status != 200 {
			if resp.Header.Get("Retry-After") != "1" {
				t.Errorf("%v: Retry-After %q, want 1", tc.act, resp.Header.Get("Retry-After"))
			}
			continue
		}
		m := genRef.FindSubmatch(got)
		if m == nil {
			t.Fatalf("%v: no generation named in %q", tc.act, got)
		}
		g := env.reg.Lookup(string(m[1]))
		if g == nil {
			t.Fatalf("%v: no generation named in %q", tc.act, got)
		}
		want := g.Expected()
		if tc.complete && (string(got) != string(want) || readErr != nil) {
			t.Errorf("%v: got %q (%v), want %q", tc.act, got, readErr, want)
		}
		if !tc.complete && (len(got) >= len(want) || !strings.HasPrefix(string(want), string(got))) {
			t.Errorf("%v: got %d bytes, want a strict prefix of the %d expected", tc.act, len(got), len(want))
		}
		if g.AuthHash != AuthHash(authorization(1)) {
			t.Errorf("%v: auth hash %s, want the caller's %s", tc.act, g.AuthHash, AuthHash(authorization(1)))
		}
	}
}

// The checker classifies hand-made answers as the rules say.
func TestCheckerClassifies(t *testing.T) {
	broken := errors.New("unexpected EOF")
	type answer struct {
		caller  int
		key     string
		status  int
		body    func(mine, others *Generation) []byte
		readErr error
	}
	healthy, resets := Action{Kind: ActOK}, Action{Kind: ActResetAfter, K: 1}
	cases := []struct {
		name    string
		act     Action // of the request's own generation
		ownerOf int    // the generation named in the answer was produced for: 0 this request, 1 another of caller 1, 2 of caller 2
		a       answer
		want    string
	}{
		{"complete", healthy, 0, answer{1, "", 200, func(g, _ *Generation) []byte { return g.Expected() }, nil}, OutComplete},
		{"spliced", healthy, 0, answer{1, "", 200, func(g, o *Generation) []byte { return append(g.Expected()[:200:200], o.chunk(1)...) }, broken}, VSpliced},
		{"clean end mid-stream", healthy, 0, answer{1, "", 200, func(g, _ *Generation) []byte { return g.Expected()[:300] }, nil}, VBrokenAsComplete},
		{"healthy generation cut", healthy, 0, answer{1, "", 200, func(g, _ *Generation) []byte { return g.Expected()[:300] }, broken}, VUnexpectedBreak},
		{"reset generation cut", resets, 0, answer{1, "", 200, func(g, _ *Generation) []byte { return g.Expected()[:300] }, broken}, OutBroken},
		{"another caller's generation", healthy, 2, answer{1, "k", 200, func(g, _ *Generation) []byte { return g.Expected() }, nil}, VCrossCaller},
		{"same caller, another key", healthy, 1, answer{1, "", 200, func(g, _ *Generation) []byte { return g.Expected() }, nil}, VWrongRequest},
		{"same caller, same key", healthy, 1, answer{1, "k", 200, func(g, _ *Generation) []byte { return g.Expected() }, nil}, OutComplete},
		{"bytes altered", healthy, 0, answer{1, "", 200, func(g, _ *Generation) []byte {
			return []byte(strings.Replace(string(g.Expected()), "1/3", "2/3", 1))
		}, nil}, VCorrupt},
		{"200 without output", healthy, 0, answer{1, "", 200, func(*Generation, *Generation) []byte { return []byte(": ping\n\n") }, broken}, VNoOutput200},
		{"non-JSON error", healthy, 0, answer{1, "", 502, func(*Generation, *Generation) []byte { return []byte("<html>bad gateway</html>") }, nil}, VErrorShape},
		{"OpenAI-shaped error", healthy, 0, answer{1, "", 502, func(*Generation, *Generation) []byte {
			return []byte(`{"error":{"message":"no upstream answered"}}`)
		}, nil}, OutCleanError},
		{"early headers, then the winner", healthy, 0, answer{1, "", 200, func(g, _ *Generation) []byte {
			return append([]byte(": keep-alive\n\n: keep-alive\n\n"), g.Expected()...)
		}, nil}, OutComplete},
		{"early headers, then an error event", healthy, 0, answer{1, "", 200, func(*Generation, *Generation) []byte {
			return []byte(": keep-alive\n\n" + `data: {"error":{"message":"no upstream answered before the deadline"}}` + "\n\n")
		}, nil}, OutCleanError},
		{"early headers, then the last upstream's error naming its generation", healthy, 0, answer{1, "", 200, func(g, _ *Generation) []byte {
			return []byte(": keep-alive\n\n" + `data: {"error":{"message":"chaos ` + g.ID + `: status 503","type":"chaos"}}` + "\n\n")
		}, nil}, OutCleanError},
		{"early headers, then another caller's error", healthy, 2, answer{1, "k", 200, func(g, _ *Generation) []byte {
			return []byte(": keep-alive\n\n" + `data: {"error":{"message":"chaos ` + g.ID + `: status 503","type":"chaos"}}` + "\n\n")
		}, nil}, VCrossCaller},
		{"early headers, then a clean end", healthy, 0, answer{1, "", 200, func(*Generation, *Generation) []byte {
			return []byte(": keep-alive\n\n")
		}, nil}, VBrokenAsComplete},
	}
	for _, tc := range cases {
		reg := newRegistry()
		me := &Request{ID: "me", Caller: tc.a.caller, Key: tc.a.key, Stream: true, Status: tc.a.status, ReadErr: tc.a.readErr, CancelAt: -1, Elapsed: time.Millisecond}
		sibling := &Request{ID: "sibling", Caller: 1, Key: "k"}
		stranger := &Request{ID: "stranger", Caller: 2, Key: "k"}
		newGen := func(id string, r *Request, act Action) *Generation {
			g := &Generation{ID: id, Upstream: "A", RequestID: r.ID, AuthHash: AuthHash(authorization(r.Caller)), Action: act, Shape: Shape{Chunks: 3}, Stream: true}
			reg.add(g)
			return g
		}
		owners := []*Request{me, sibling, stranger}
		named := newGen("A000001", owners[tc.ownerOf], tc.act)
		other := newGen("A000002", stranger, healthy)
		me.Got = tc.a.body(named, other)
		s := &Scenario{Fault: FaultNone, Reqs: []*Request{me}}
		ck := newChecker(reg, []*Scenario{s, {Reqs: []*Request{sibling, stranger}}}, map[string]string{}, nil, Timeout)
		if got, _ := ck.answer(s, me); got != tc.want {
			t.Errorf("%s: classified %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Twins that both complete must have the same bytes; a canary anywhere in
// a response is found.
func TestCheckerTwinsAndCanaries(t *testing.T) {
	reg := newRegistry()
	a := &Request{ID: "a", Caller: 1, Key: "k", Stream: true, Status: 200, CancelAt: -1}
	b := &Request{ID: "b", Caller: 1, Key: "k", Stream: true, Status: 200, CancelAt: -1}
	for _, r := range []*Request{a, b} {
		g := &Generation{ID: "A00000" + string(rune('1'+len(reg.gens))), Upstream: "A", RequestID: r.ID, AuthHash: AuthHash(authorization(1)), Action: Action{Kind: ActOK}, Shape: Shape{Chunks: 2}, Stream: true}
		reg.add(g)
		r.Got = g.Expected()
	}
	b.Header = map[string][]string{"X-Upstream-Url": {"http://host/?key=CANARY-x"}}
	s := &Scenario{Fault: FaultTwins, Reqs: []*Request{a, b}}
	ck := newChecker(reg, []*Scenario{s}, map[string]string{}, []string{"CANARY-x"}, Timeout)
	ck.scenario(s)
	if n := len(ck.violation[VTwinsDiffer]); n != 1 {
		t.Errorf("twins with different generations: %d %s violations, want 1", n, VTwinsDiffer)
	}
	if n := len(ck.violation[VCanary]); n != 1 {
		t.Errorf("a canary in a header: %d %s violations, want 1", n, VCanary)
	}
}

// recorder is a T that keeps what the suite reports.
type recorder struct {
	mu     sync.Mutex
	errors []string
	clean  []func()
}

func (r *recorder) Helper()             {}
func (r *recorder) Logf(string, ...any) {}
func (r *recorder) Cleanup(f func())    { r.clean = append(r.clean, f) }
func (r *recorder) Fatalf(f string, a ...any) {
	r.Errorf(f, a...)
	panic("fatal")
}
func (r *recorder) Errorf(f string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(f, a...))
}

func (r *recorder) has(substr string) bool {
	for _, e := range r.errors {
		if strings.Contains(e, substr) {
			return true
		}
	}
	return false
}

// A proxy that leaks a goroutine per request and logs its upstream's key
// fails the suite's leak and canary checks.
func TestSuiteSeesLeaksAndCanaries(t *testing.T) {
	saved := settleDeadline
	settleDeadline = 300 * time.Millisecond
	defer func() { settleDeadline = saved }()
	rec := &recorder{}
	defer func() {
		for i := len(rec.clean) - 1; i >= 0; i-- {
			rec.clean[i]()
		}
	}()
	env := NewEnv(rec)
	target, _ := url.Parse(env.URLA)
	proxy := httputil.NewSingleHostReverseProxy(target)
	transport := &http.Transport{}
	proxy.Transport = transport
	proxy.ErrorLog = log.New(io.Discard, "", 0)
	var logs strings.Builder
	var logMu sync.Mutex
	release := make(chan struct{})
	var leaked sync.WaitGroup
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaked.Add(1)
		go func() { // the leak
			defer leaked.Done()
			<-release
		}()
		logMu.Lock()
		fmt.Fprintf(&logs, "forwarding with %s\n", env.AuthB)
		logMu.Unlock()
		// A deadline, so that the stalled upstreams end.
		ctx, cancel := context.WithTimeout(r.Context(), 300*time.Millisecond)
		defer cancel()
		proxy.ServeHTTP(w, r.WithContext(ctx))
	}))
	defer func() {
		close(release)
		leaked.Wait()
		front.Close()
		transport.CloseIdleConnections()
	}()
	func() {
		defer func() { recover() }()
		Run(rec, env, Target{
			Name: "leaky", BaseURL: front.URL, PID: os.Getpid(), InProcess: true,
			Goroutines: func() (int, error) { return runtime.NumGoroutine(), nil },
			CloseIdle:  transport.CloseIdleConnections,
			Logs: func() string {
				logMu.Lock()
				defer logMu.Unlock()
				return logs.String()
			},
		}, 30, 7)
	}()
	if !rec.has("leaked goroutines") {
		t.Errorf("no goroutine leak reported; the suite said:\n%s", strings.Join(rec.errors, "\n"))
	}
	if !rec.has("a log line carries a canary credential") {
		t.Errorf("no canary in the log reported; the suite said:\n%s", strings.Join(rec.errors, "\n"))
	}
	if strings.Contains(strings.Join(rec.errors, "\n"), canaryHeader) {
		t.Errorf("the suite's own report prints the canary")
	}
}

// A connection counts as busy only while a request is on it: one the
// proxy's pool dialed and parked unused (Go's transport finishes a dial
// its cancelled attempt no longer wants) is idle, while one whose request
// the proxy never ended stays busy and is named in the report.
func TestUpstreamCountsOnlyConnectionsCarryingARequestAsBusy(t *testing.T) {
	u := &Upstream{Name: "A", conns: map[net.Conn]*connInfo{}}
	pipe := func() net.Conn {
		c, other := net.Pipe()
		t.Cleanup(func() { c.Close(); other.Close() })
		return c
	}
	parked, between, open := pipe(), pipe(), pipe()
	u.connState(parked, http.StateNew)
	u.connState(between, http.StateNew)
	u.connState(between, http.StateActive)
	u.connState(between, http.StateIdle)
	u.connState(open, http.StateNew)
	u.connState(open, http.StateActive)
	busy, idle := u.Conns()
	if busy != 1 {
		t.Errorf("busy = %d, want 1 (only the connection with a request open)", busy)
	}
	if idle != 2 {
		t.Errorf("idle = %d, want 2 (the parked new connection and the one between requests)", idle)
	}
	if report := u.busyReport(); len(report) != 1 || !strings.Contains(report[0], "active") {
		t.Errorf("busy report = %q, want the one active connection", report)
	}
	u.connState(open, http.StateClosed)
	if busy, _ := u.Conns(); busy != 0 {
		t.Errorf("busy after the open connection closed = %d, want 0", busy)
	}
}
