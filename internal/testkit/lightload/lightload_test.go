package lightload

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// sseHandler streams n events and [DONE], flushing each (so the answer is
// chunked).
func sseHandler(events int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test") != "light" || r.URL.Path != "/v1/chat" {
			http.Error(w, "wrong request", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < events; i++ {
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
}

func start(t *testing.T, h http.Handler, conns *atomic.Int64) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	if conns != nil {
		srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
			if state == http.StateNew {
				conns.Add(1)
			}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func addr(srv *httptest.Server) string { return strings.TrimPrefix(srv.URL, "http://") }

func TestRunChunkedKeepAlive(t *testing.T) {
	var conns atomic.Int64
	srv := start(t, sseHandler(20), &conns)
	req := NewRequest("POST", addr(srv), "/v1/chat", `{"stream":true}`, "X-Test: light", "Content-Type: application/json")
	res := Run(context.Background(), Options{Addr: addr(srv), Request: req, Conns: 4, N: 200, WantSuffix: []byte("data: [DONE]\n\n")})
	if res.Requests != 200 || res.Failed != 0 {
		t.Fatalf("Requests = %d, Failed = %d, want 200 and 0: %v", res.Requests, res.Failed, res.Errors)
	}
	if got := conns.Load(); got != 4 {
		t.Errorf("connections = %d, want 4 (kept alive)", got)
	}
	want := int64(200 * (len("data: [DONE]\n\n") + 10*len("data: {\"i\":0}\n\n") + 10*len("data: {\"i\":10}\n\n")))
	if res.BodyBytes != want {
		t.Errorf("BodyBytes = %d, want %d", res.BodyBytes, want)
	}
	if res.RPS() <= 0 {
		t.Errorf("RPS = %v, want > 0", res.RPS())
	}
}

func TestRunContentLengthAndClose(t *testing.T) {
	var conns atomic.Int64
	srv := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.Header().Set("Content-Length", "5")
		w.Write([]byte("hello"))
	}), &conns)
	res := Run(context.Background(), Options{Addr: addr(srv), Request: NewRequest("GET", addr(srv), "/", ""), N: 3, WantSuffix: []byte("lo")})
	if res.Requests != 3 || res.Failed != 0 {
		t.Fatalf("Requests = %d, Failed = %d, want 3 and 0: %v", res.Requests, res.Failed, res.Errors)
	}
	if got := conns.Load(); got != 3 {
		t.Errorf("connections = %d, want 3 (the server closes each)", got)
	}
}

func TestRunCountsWrongAnswers(t *testing.T) {
	cut := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("data: 1\n\n"))
		w.(http.Flusher).Flush()
	}), nil)
	res := Run(context.Background(), Options{Addr: addr(cut), Request: NewRequest("GET", addr(cut), "/", ""), N: 2,
		WantSuffix: []byte("data: [DONE]\n\n")})
	if res.Requests != 0 || res.Failed != 2 || len(res.Errors) != 2 {
		t.Errorf("cut stream: Requests = %d, Failed = %d, Errors = %d, want 0, 2, 2", res.Requests, res.Failed, len(res.Errors))
	}
	bad := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusBadGateway)
	}), nil)
	res = Run(context.Background(), Options{Addr: addr(bad), Request: NewRequest("GET", addr(bad), "/", ""), N: 7})
	if res.Requests != 0 || res.Failed != 7 || len(res.Errors) != maxErrors {
		t.Errorf("502: Requests = %d, Failed = %d, Errors = %d, want 0, 7, %d", res.Requests, res.Failed, len(res.Errors), maxErrors)
	}
	if len(res.Errors) > 0 && !strings.Contains(res.Errors[0].Error(), "status 502") {
		t.Errorf("error %q does not name the status", res.Errors[0])
	}
}

func TestRunStopsWithContext(t *testing.T) {
	srv := start(t, sseHandler(1), nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res := Run(ctx, Options{Addr: addr(srv), Request: NewRequest("POST", addr(srv), "/v1/chat", "", "X-Test: light"), N: 1000, Timeout: time.Second})
	if res.Requests+res.Failed != 0 {
		t.Errorf("after cancel: Requests = %d, Failed = %d, want none sent", res.Requests, res.Failed)
	}
}

func TestParseStatCPU(t *testing.T) {
	// A command name with spaces and parentheses; utime 250, stime 50 ticks.
	line := "4242 (my (odd) proc) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 12345 1000000 500 18446744073709551615\n"
	got, err := parseStatCPU([]byte(line))
	if err != nil || got != 3*time.Second {
		t.Errorf("parseStatCPU = %v, %v; want 3s", got, err)
	}
	if _, err := parseStatCPU([]byte("4242 (x) S 1 2")); err == nil {
		t.Error("a short line parsed without error")
	}
}

func TestProcessCPUOfSelf(t *testing.T) {
	before, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Burn ~50ms of CPU; the clock steps in 10ms.
	deadline := time.Now().Add(50 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	after, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after < before {
		t.Errorf("CPU time went back: %v then %v", before, after)
	}
}

func TestCompareAlternatesAndSums(t *testing.T) {
	var order []string
	handler := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(name)) })
	}
	a, b := start(t, handler("a"), nil), start(t, handler("b"), nil)
	cpu := func(name string) func() (time.Duration, error) {
		var calls time.Duration
		return func() (time.Duration, error) {
			order = append(order, name)    // twice per run: before and after
			calls += 10 * time.Millisecond // 10ms more at every call: 10ms per run
			return calls, nil
		}
	}
	targets := []Target{
		{Name: "a", Options: Options{Addr: addr(a), Request: NewRequest("GET", addr(a), "/", ""), N: 10, WantSuffix: []byte("a")}, CPU: cpu("a")},
		{Name: "b", Options: Options{Addr: addr(b), Request: NewRequest("GET", addr(b), "/", ""), N: 5, WantSuffix: []byte("b")}, CPU: cpu("b")},
	}
	c, err := Compare(context.Background(), 3, targets)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(order, ""); got != "aabbbbaaaabb" {
		t.Errorf("CPU readings = %q, want \"aabbbbaaaabb\" (rounds a,b then b,a then a,b)", got)
	}
	if c.Requests[0] != 30 || c.Requests[1] != 15 || c.Failed[0]+c.Failed[1] != 0 {
		t.Errorf("Requests = %v, Failed = %v, want [30 15] and none: %v", c.Requests, c.Failed, c.Errors)
	}
	if c.CPU[0] != 30*time.Millisecond || c.CPUPerRequest(1) != 2*time.Millisecond {
		t.Errorf("CPU = %v, CPUPerRequest(1) = %v, want 30ms for a and 2ms per request for b", c.CPU, c.CPUPerRequest(1))
	}
	if r := c.RoundRatios(0, 1); len(r) != 3 || r[0] <= 0 {
		t.Errorf("RoundRatios = %v, want 3 positive ratios", r)
	}
}
