package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/envgate"
	"github.com/llmhedge/llmhedge/internal/testkit/heyload"
	"github.com/llmhedge/llmhedge/internal/testkit/jaeger"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
	"github.com/llmhedge/llmhedge/internal/testkit/refload"
)

// Traces through the real Traefik, the plugin interpreted by Yaegi and its
// spans exported by lighttrace over OTLP/HTTP to a real Jaeger
// (internal/testkit/jaeger), read back through Jaeger's query API.

const traceService = "llmhedge-traefik-e2e"

// tracingConfig is the plugin's tracing section for endpoint.
func tracingConfig(endpoint string) string {
	return fmt.Sprintf(`tracing:
  serviceName: %s
  sampleRate: 1
  otlp:
    http:
      endpoint: %s
      headers:
        X-Collector-Tenant: e2e`, traceService, endpoint)
}

// newTraceContext returns a fresh trace id and client span id, and the
// client's traceparent naming them.
func newTraceContext(t *testing.T) (traceID, spanID, traceparent string) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	traceID = hex.EncodeToString(b[:16])
	spanID = hex.EncodeToString(b[16:])
	return traceID, spanID, "00-" + traceID + "-" + spanID + "-01"
}

// headerLog records the headers of every request a handler receives.
type headerLog struct {
	name string
	next http.Handler
	mu   sync.Mutex
	seen []http.Header
}

func (l *headerLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.mu.Lock()
	l.seen = append(l.seen, r.Header.Clone())
	l.mu.Unlock()
	l.next.ServeHTTP(w, r)
}

// traceparents returns the traceparent of every request l received with
// traceparents of traceID.
func (l *headerLog) traceparents(traceID string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, h := range l.seen {
		if tp := h.Get("Traceparent"); strings.Contains(tp, "-"+traceID+"-") {
			out = append(out, tp)
		}
	}
	return out
}

// simTraceparents returns the traceparents llmsim server s received for
// requests of traceID.
func simTraceparents(s *llmsim.Running, traceID string) []string {
	var out []string
	for _, r := range s.Requests() {
		if tp := r.Header.Get("Traceparent"); strings.Contains(tp, "-"+traceID+"-") {
			out = append(out, tp)
		}
	}
	return out
}

// parentOf is the parent span id of a traceparent.
func parentOf(tp string) string {
	parts := strings.Split(tp, "-")
	if len(parts) != 4 {
		return ""
	}
	return parts[2]
}

// tracedPost sends body to url with the client's traceparent and extra
// headers, and returns the status and the whole answer.
func tracedPost(t *testing.T, url, body, traceparent string, header map[string]string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", traceparent)
	req.Header.Set("Tracestate", "e2e=client")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return resp.StatusCode, string(b)
}

func chatBody() string {
	return `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
}

// wantTag fails unless span s has tag key = want.
func wantTag(t *testing.T, what string, s jaeger.Span, key string, want any) {
	t.Helper()
	if got, ok := s.Tags[key]; !ok || got != want {
		t.Errorf("%s: %s span %s: tag %s = %v (%T), want %v (%T)", what, s.OperationName, s.SpanID, key, got, got, want, want)
	}
}

// attemptTree checks a request's trace: one llm_hedge span, child of the
// client's span, and n llm_hedge.attempt spans, its children, of the
// plugin's service and kinds. It returns the request span and the
// attempts by their llmhedge.attempt.index.
func attemptTree(t *testing.T, what string, spans []jaeger.Span, clientSpan string, n int) (jaeger.Span, map[int64]jaeger.Span) {
	t.Helper()
	reqs := jaeger.Find(spans, "llm_hedge")
	if len(reqs) != 1 {
		t.Fatalf("%s: %d llm_hedge spans, want 1", what, len(reqs))
	}
	req := reqs[0]
	if req.ParentSpanID != clientSpan {
		t.Errorf("%s: llm_hedge's parent is %q, want the client's span %s", what, req.ParentSpanID, clientSpan)
	}
	if req.Kind != "internal" || req.Service != traceService {
		t.Errorf("%s: llm_hedge kind %q service %q, want internal, %s", what, req.Kind, req.Service, traceService)
	}
	attempts := jaeger.Find(spans, "llm_hedge.attempt")
	if len(attempts) != n {
		t.Fatalf("%s: %d llm_hedge.attempt spans, want %d", what, len(attempts), n)
	}
	byIndex := map[int64]jaeger.Span{}
	for _, a := range attempts {
		if a.ParentSpanID != req.SpanID {
			t.Errorf("%s: attempt span %s's parent is %q, want the request span %s", what, a.SpanID, a.ParentSpanID, req.SpanID)
		}
		if a.Kind != "client" {
			t.Errorf("%s: attempt span %s kind %q, want client", what, a.SpanID, a.Kind)
		}
		if a.Start.Before(req.Start) || a.Start.Add(a.Duration).After(req.Start.Add(req.Duration).Add(time.Millisecond)) {
			t.Errorf("%s: attempt span %s [%v, +%v] outside the request span [%v, +%v]", what, a.SpanID, a.Start, a.Duration, req.Start, req.Duration)
		}
		idx, ok := a.Tags["llmhedge.attempt.index"].(int64)
		if !ok {
			t.Fatalf("%s: attempt span %s has llmhedge.attempt.index %v (%T), want an int64", what, a.SpanID, a.Tags["llmhedge.attempt.index"], a.Tags["llmhedge.attempt.index"])
		}
		byIndex[idx] = a
	}
	return req, byIndex
}

// checkWire fails unless the upstreams received, for each attempt span, a
// traceparent whose parent is that span: distinct ones, none the client's.
func checkWire(t *testing.T, what string, received []string, attempts map[int64]jaeger.Span, clientSpan string) {
	t.Helper()
	if len(received) != len(attempts) {
		t.Fatalf("%s: upstreams received %d requests of the trace (%q), want %d, one per attempt", what, len(received), received, len(attempts))
	}
	byParent := map[string]bool{}
	for _, tp := range received {
		p := parentOf(tp)
		if p == clientSpan {
			t.Errorf("%s: an upstream received the client's traceparent %q unchanged, want its attempt's span as parent", what, tp)
		}
		if byParent[p] {
			t.Errorf("%s: two attempts sent the same parent %s", what, p)
		}
		byParent[p] = true
		if !strings.HasSuffix(tp, "-01") {
			t.Errorf("%s: traceparent %q is not sampled", what, tp)
		}
	}
	for idx, a := range attempts {
		if !byParent[a.SpanID] {
			t.Errorf("%s: attempt %d's span %s is the parent of no traceparent an upstream received (%q)", what, idx, a.SpanID, received)
		}
	}
}

func TestTracesInJaeger(t *testing.T) {
	proc.SkipShort(t, "Traefik and Jaeger")
	j := jaeger.Start(t)
	wl := functionalWorkload()
	a, b := llmsim.Start("A", wl), llmsim.Start("B", wl)
	defer a.Close()
	defer b.Close()
	// The validated route: A answers schema-invalid JSON fast, B valid
	// JSON later; both record the headers they receive.
	va := &headerLog{name: "A", next: &llmsim.Structured{Name: "A", Valid: false, Delay: 5 * time.Millisecond}}
	vb := &headerLog{name: "B", next: &llmsim.Structured{Name: "B", Valid: true, Delay: 40 * time.Millisecond}}
	vaSrv, vbSrv := httptest.NewServer(va), httptest.NewServer(vb)
	defer vaSrv.Close()
	defer vbSrv.Close()

	ab := [][2]string{{"A", a.URL}, {"B", b.URL}}
	tracing := tracingConfig(j.OTLPHTTPEndpoint())
	d := newDynamic("traces").
		hedge("hedge-traced", pluginConfig(ab, "delay: 100ms", "log: off", tracing)).
		route("traced", "noop@internal", "hedge-traced").
		hedge("hedge-validated", pluginConfig([][2]string{{"A", vaSrv.URL}, {"B", vbSrv.URL}}, "delay: 500ms", "validate: [json_schema]", "log: off", tracing)).
		route("validated", "noop@internal", "hedge-validated")
	tr := startTraefik(t, "INFO", d)
	traced := tr.URL + "/traced/v1/chat/completions"

	t.Run("hedged", func(t *testing.T) {
		traceID, clientSpan, tp := newTraceContext(t)
		status, body := tracedPost(t, traced, chatBody(), tp, map[string]string{llmsim.HeaderRequest: "tr-hedged", llmsim.HeaderBehavior: "A=stall;B=ttft:20ms"})
		if status != 200 || !strings.Contains(body, `"id":"chatcmpl-B-tr-hedged"`) {
			t.Fatalf("status %d, body %q: want B's answer", status, proc.Tail(body, 300))
		}
		spans := j.Trace(t, traceID, 3)
		req, attempts := attemptTree(t, "hedged", spans, clientSpan, 2)
		wantTag(t, "hedged", req, "llmhedge.outcome", "ok")
		wantTag(t, "hedged", req, "llmhedge.winner_upstream", "B")
		wantTag(t, "hedged", req, "llmhedge.attempts", int64(2))
		wantTag(t, "hedged", req, "llmhedge.delay_ms", float64(100))
		for idx, want := range map[int64][3]string{0: {"primary", "lost", "A"}, 1: {"hedge", "won", "B"}} {
			wantTag(t, "hedged", attempts[idx], "llmhedge.attempt.role", want[0])
			wantTag(t, "hedged", attempts[idx], "llmhedge.attempt.result", want[1])
			wantTag(t, "hedged", attempts[idx], "llmhedge.attempt.upstream", want[2])
			if attempts[idx].Error {
				t.Errorf("hedged: attempt %d (%s) has an error status, want none", idx, want[1])
			}
		}
		if _, ok := attempts[1].Tags["llmhedge.attempt.ttft_ms"].(float64); !ok {
			t.Errorf("hedged: the winner has llmhedge.attempt.ttft_ms %v, want a float64", attempts[1].Tags["llmhedge.attempt.ttft_ms"])
		}
		// The hedge started once the delay had passed.
		if started := attempts[1].Start.Sub(req.Start); started < 100*time.Millisecond {
			t.Errorf("hedged: the hedge's span starts %v into the request, want >= the 100ms delay", started)
		}
		checkWire(t, "hedged", append(simTraceparents(a, traceID), simTraceparents(b, traceID)...), attempts, clientSpan)
		for _, r := range append(a.Requests(), b.Requests()...) {
			if strings.Contains(r.Header.Get("Traceparent"), traceID) && r.Header.Get("Tracestate") != "e2e=client" {
				t.Errorf("hedged: upstream got tracestate %q, want the client's e2e=client", r.Header.Get("Tracestate"))
			}
		}
	})

	t.Run("primary failed", func(t *testing.T) {
		traceID, clientSpan, tp := newTraceContext(t)
		status, body := tracedPost(t, traced, chatBody(), tp, map[string]string{llmsim.HeaderRequest: "tr-failed", llmsim.HeaderBehavior: "A=status:503"})
		if status != 200 || !strings.Contains(body, `"id":"chatcmpl-B-tr-failed"`) {
			t.Fatalf("status %d, body %q: want B's answer", status, proc.Tail(body, 300))
		}
		spans := j.Trace(t, traceID, 3)
		req, attempts := attemptTree(t, "primary failed", spans, clientSpan, 2)
		wantTag(t, "primary failed", req, "llmhedge.outcome", "ok")
		failed, retry := attempts[0], attempts[1]
		wantTag(t, "primary failed", failed, "llmhedge.attempt.role", "primary")
		wantTag(t, "primary failed", failed, "llmhedge.attempt.result", "failed")
		wantTag(t, "primary failed", failed, "llmhedge.attempt.upstream", "A")
		wantTag(t, "primary failed", failed, "error.type", "503")
		wantTag(t, "primary failed", failed, "http.response.status_code", int64(503))
		if !failed.Error || failed.StatusCode != "ERROR" {
			t.Errorf("primary failed: the failed attempt's status %q error %v, want ERROR", failed.StatusCode, failed.Error)
		}
		wantTag(t, "primary failed", retry, "llmhedge.attempt.role", "retry")
		wantTag(t, "primary failed", retry, "llmhedge.attempt.result", "won")
		wantTag(t, "primary failed", retry, "llmhedge.attempt.upstream", "B")
		if _, ok := retry.Tags["error.type"]; ok || retry.Error {
			t.Errorf("primary failed: the retry that won has error.type %v, error %v; want neither", retry.Tags["error.type"], retry.Error)
		}
		checkWire(t, "primary failed", append(simTraceparents(a, traceID), simTraceparents(b, traceID)...), attempts, clientSpan)
	})

	t.Run("replayed key", func(t *testing.T) {
		key := "tr-key-" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
		firstTrace, firstSpan, firstTP := newTraceContext(t)
		hdr := map[string]string{llmsim.HeaderRequest: "tr-replay", "Idempotency-Key": key}
		status, first := tracedPost(t, traced, chatBody(), firstTP, hdr)
		if status != 200 || !strings.Contains(first, "data: [DONE]") {
			t.Fatalf("first request: status %d, body %q", status, proc.Tail(first, 300))
		}
		traceID, clientSpan, tp := newTraceContext(t)
		status, second := tracedPost(t, traced, chatBody(), tp, hdr)
		if status != 200 || second != first {
			t.Fatalf("replay: status %d, body %q, want the first answer again", status, proc.Tail(second, 300))
		}
		led := j.Trace(t, firstTrace, 2)
		ledReq, ledAttempts := attemptTree(t, "key led", led, firstSpan, 1)
		wantTag(t, "key led", ledReq, "llmhedge.idempotency", "led")
		checkWire(t, "key led", append(simTraceparents(a, firstTrace), simTraceparents(b, firstTrace)...), ledAttempts, firstSpan)
		spans := j.Trace(t, traceID, 1)
		req, _ := attemptTree(t, "replayed", spans, clientSpan, 0)
		wantTag(t, "replayed", req, "llmhedge.idempotency", "replayed")
		wantTag(t, "replayed", req, "llmhedge.outcome", "replayed")
		wantTag(t, "replayed", req, "llmhedge.idempotency_key_hash", ledReq.Tags["llmhedge.idempotency_key_hash"])
		for k, v := range req.Tags {
			if s, ok := v.(string); ok && strings.Contains(s, key) {
				t.Errorf("replayed: tag %s carries the idempotency key itself", k)
			}
		}
		if n := len(simTraceparents(a, traceID)) + len(simTraceparents(b, traceID)); n != 0 {
			t.Errorf("replayed: upstreams received %d requests of the replayed trace, want 0", n)
		}
	})

	t.Run("validated", func(t *testing.T) {
		traceID, clientSpan, tp := newTraceContext(t)
		req := llmsim.StructuredRequest(context.Background(), tr.URL+"/validated", true)
		body, _ := io.ReadAll(req.Body)
		status, answer := tracedPost(t, req.URL.String(), string(body), tp, nil)
		if status != 200 || !strings.Contains(answer, "Paris") { // only a valid answer names a city
			t.Fatalf("status %d, body %q: want B's valid answer", status, proc.Tail(answer, 300))
		}
		spans := j.Trace(t, traceID, 3)
		rs, attempts := attemptTree(t, "validated", spans, clientSpan, 2)
		wantTag(t, "validated", rs, "llmhedge.validation", "passed")
		wantTag(t, "validated", rs, "llmhedge.winner_upstream", "B")
		invalid, valid := attempts[0], attempts[1]
		wantTag(t, "validated", invalid, "llmhedge.attempt.upstream", "A")
		wantTag(t, "validated", invalid, "llmhedge.attempt.result", "invalid")
		wantTag(t, "validated", invalid, "llmhedge.attempt.invalid_check", "json_schema")
		if _, ok := invalid.Tags["error.type"].(string); !ok || !invalid.Error {
			t.Errorf("validated: the invalid answer's span has error.type %v, error %v; want a class and an error status", invalid.Tags["error.type"], invalid.Error)
		}
		wantTag(t, "validated", valid, "llmhedge.attempt.upstream", "B")
		wantTag(t, "validated", valid, "llmhedge.attempt.result", "won")
		checkWire(t, "validated", append(va.traceparents(traceID), vb.traceparents(traceID)...), attempts, clientSpan)
	})
}

// otlpSink is an OTLP/HTTP endpoint that reads every post, counts its
// spans and answers 200: the benchmark prices the proxy, not a backend.
// reached is closed once want spans have arrived.
type otlpSink struct {
	spans   atomic.Int64
	posts   atomic.Int64
	want    int64
	once    sync.Once
	reached chan struct{}
}

func (s *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if s.spans.Add(int64(bytes.Count(body, []byte(`"spanId"`)))) >= s.want {
		s.once.Do(func() { close(s.reached) })
	}
	s.posts.Add(1)
	w.WriteHeader(http.StatusOK)
}

// TestBenchTracingOverhead measures requests per second through the plugin
// with tracing off and on (every request a new sampled trace, its spans
// posted to a sink), on a fast upstream where no hedge fires: 3
// alternating rounds of TestBenchThroughput's loop. Not timed: it prints
// the ratio. `LLMHEDGE_BENCH=1 go test -run TestBenchTracingOverhead -v ./traefikplugin/e2e`.
func TestBenchTracingOverhead(t *testing.T) {
	envgate.Bench(t)
	const rounds, n, concurrency = 3, 1500, 20
	fast := llmsim.Fast()
	f := llmsim.Start("F", fast)
	defer f.Close()
	// Every traced request's two spans (the request, its one attempt).
	sink := &otlpSink{want: int64(2 * (300 + rounds*n)), reached: make(chan struct{})}
	sinkSrv := httptest.NewServer(sink)
	defer sinkSrv.Close()
	ff := [][2]string{{"F", f.URL}, {"F", f.URL}}
	d := newDynamic("trace-rps").
		hedge("hedge-off", pluginConfig(ff, "delay: 30s", "log: off")).
		route("off", "noop@internal", "hedge-off").
		hedge("hedge-on", pluginConfig(ff, "delay: 30s", "log: off", tracingConfig(sinkSrv.URL))).
		route("on", "noop@internal", "hedge-on")
	tr := startTraefik(t, "ERROR", d)
	ctx := context.Background()
	run := func(route, prefix string, count int) *refload.Result {
		r := refload.Run(ctx, refload.Options{URL: tr.URL + "/" + route + "/v1/chat/completions", N: count,
			Concurrency: concurrency, IDPrefix: prefix, Upstreams: []string{"F"}, Tokens: fast.WithDefaults().Tokens})
		if r.Wrong != 0 || r.Failed != 0 {
			t.Errorf("%s: %d wrong, %d failed: %v", route, r.Wrong, r.Failed, r.Errors)
		}
		return r
	}
	run("on", "warm-on-", 300)
	run("off", "warm-off-", 300)
	var offWall, onWall, offCPU, onCPU time.Duration
	var perRound []string
	for round := 0; round < rounds; round++ {
		cpu := tr.cpuTime()
		ow := run("off", fmt.Sprintf("off%d-", round), n).Wall
		offCPU += tr.cpuTime() - cpu
		cpu = tr.cpuTime()
		nw := run("on", fmt.Sprintf("on%d-", round), n).Wall
		onCPU += tr.cpuTime() - cpu
		offWall += ow
		onWall += nw
		perRound = append(perRound, fmt.Sprintf("%.3f", ow.Seconds()/nw.Seconds()))
	}
	total := time.Duration(rounds * n)
	offRPS := float64(total) / offWall.Seconds()
	onRPS := float64(total) / onWall.Seconds()
	t.Logf("fast upstream, %d requests x %d rounds, %d concurrent: tracing off %.0f req/s, on %.0f req/s, on/off ratio %.3f (rounds %s)",
		n, rounds, concurrency, offRPS, onRPS, onRPS/offRPS, strings.Join(perRound, " "))
	t.Logf("Traefik CPU per request: tracing off %v, on %v (tracing's cost: %v per request, x%.2f)",
		offCPU/total, onCPU/total, (onCPU-offCPU)/total, float64(onCPU)/float64(offCPU))
	// They all reach the sink, within the exporter's interval.
	select {
	case <-sink.reached:
	case <-time.After(10 * time.Second):
	}
	if got := sink.spans.Load(); got != sink.want {
		t.Errorf("the sink received %d spans in %d posts, want %d (2 per traced request)", got, sink.posts.Load(), sink.want)
	}
	t.Logf("spans exported: %d in %d posts", sink.spans.Load(), sink.posts.Load())
	heyload.Compare(t, [2]string{"tracing on", "tracing off"}, [2]string{tr.URL + "/on/v1/chat/completions", tr.URL + "/off/v1/chat/completions"},
		[2]func() time.Duration{tr.cpuTime, tr.cpuTime}, "Traefik")
}
