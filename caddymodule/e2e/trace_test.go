package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/envgate"
	"github.com/llmhedge/llmhedge/internal/testkit/heyload"
	"github.com/llmhedge/llmhedge/internal/testkit/jaeger"
	"github.com/llmhedge/llmhedge/internal/testkit/lightload"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/oteltrace"
)

// traceService is the Caddy process's service.name in Jaeger.
const traceService = "caddy-llmhedge-e2e"

// clientParentSpan is the parent span id of every client traceparent here.
const clientParentSpan = "00f067aa0ba902b7"

// traceEnv points Caddy's tracing handler (its autoexport exporter and its
// batch span processor) at Jaeger over OTLP/HTTP. scheduleDelay, when
// non-empty, is OTEL_BSP_SCHEDULE_DELAY in ms (default 5000).
func traceEnv(j *jaeger.Jaeger, scheduleDelay string) []string {
	env := []string{
		"OTEL_TRACES_EXPORTER=otlp",
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + j.OTLPHTTPEndpoint(),
		"OTEL_SERVICE_NAME=" + traceService,
		"OTEL_TRACES_SAMPLER=parentbased_always_on",
		"OTEL_PROPAGATORS=tracecontext,baggage",
	}
	if scheduleDelay != "" {
		env = append(env, "OTEL_BSP_SCHEDULE_DELAY="+scheduleDelay)
	}
	return env
}

// tracedSite wraps a site body's handlers in Caddy's tracing directive.
func tracedSite(body string) string {
	return "\ttracing {\n\t\tspan gateway\n\t}\n" + body
}

// clientTrace is a client traceparent of trace n: its trace id, and the
// header.
func clientTrace(n int) (traceID, traceparent string) {
	traceID = fmt.Sprintf("e2e0000000000000000000000000%04x", n)
	return traceID, "00-" + traceID + "-" + clientParentSpan + "-01"
}

// headerRecorder serves h after keeping each request's headers by its
// X-Sim-Request id and the upstream's name.
type headerRecorder struct {
	mu   sync.Mutex
	seen map[string]http.Header // "<upstream> <id>"
}

func (hr *headerRecorder) wrap(name string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hr.mu.Lock()
		if hr.seen == nil {
			hr.seen = map[string]http.Header{}
		}
		hr.seen[name+" "+r.Header.Get(llmsim.HeaderRequest)] = r.Header.Clone()
		hr.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

func (hr *headerRecorder) get(name, id string) http.Header {
	hr.mu.Lock()
	defer hr.mu.Unlock()
	return hr.seen[name+" "+id]
}

// simHeaders returns the headers of the one request sim received with id.
func simHeaders(t *testing.T, sim *llmsim.Running, id string) http.Header {
	t.Helper()
	var found []http.Header
	for _, r := range sim.Requests() {
		if r.RequestID == id {
			found = append(found, r.Header)
		}
	}
	if len(found) != 1 {
		t.Fatalf("upstream %s received %d requests %q, want 1", sim.Name, len(found), id)
	}
	return found[0]
}

// tracedRequest sends req with the client trace headers and returns the
// status and the body without pings.
func tracedRequest(t *testing.T, req *http.Request, traceparent string) (int, http.Header, string) {
	t.Helper()
	req.Header.Set("Traceparent", traceparent)
	req.Header.Set("Tracestate", "vendor=client")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return resp.StatusCode, resp.Header, string(llmsim.StripPings(body))
}

// streamedContent joins the delta contents of a Chat Completions stream.
func streamedContent(body string) string {
	var out strings.Builder
	for _, line := range strings.Split(body, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &chunk) == nil {
			for _, c := range chunk.Choices {
				out.WriteString(c.Delta.Content)
			}
		}
	}
	return out.String()
}

// raceTrace is one request's spans as Jaeger reports them.
type raceTrace struct {
	server, race jaeger.Span
	attempts     []jaeger.Span // by llmhedge.attempt.index
}

// readTrace waits for trace traceID's 2+attempts spans in Jaeger and checks
// their tree: Caddy's server span (child of the client's span), under it
// llm_hedge (internal), under that the llm_hedge.attempt spans (client).
func readTrace(t *testing.T, j *jaeger.Jaeger, traceID string, attempts int) raceTrace {
	t.Helper()
	spans := j.Trace(t, traceID, 2+attempts)
	if len(spans) != 2+attempts {
		t.Fatalf("trace %s has %d spans, want %d: %s", traceID, len(spans), 2+attempts, describeSpans(spans))
	}
	var tr raceTrace
	races := jaeger.Find(spans, core.SpanRequest)
	if len(races) != 1 {
		t.Fatalf("trace %s: %d %q spans, want 1: %s", traceID, len(races), core.SpanRequest, describeSpans(spans))
	}
	tr.race = races[0]
	server, ok := jaeger.ByID(spans)[tr.race.ParentSpanID]
	if !ok {
		t.Fatalf("trace %s: %s's parent %q is not in the trace: %s", traceID, core.SpanRequest, tr.race.ParentSpanID, describeSpans(spans))
	}
	tr.server = server
	if server.OperationName != "gateway" || server.Kind != "server" || server.ParentSpanID != clientParentSpan {
		t.Errorf("trace %s: llm_hedge's parent is %q (kind %q, parent %q), want Caddy's server span \"gateway\" under the client's %s",
			traceID, server.OperationName, server.Kind, server.ParentSpanID, clientParentSpan)
	}
	for _, s := range spans {
		if s.Service != traceService {
			t.Errorf("span %s %q: service %q, want %q (OTEL_SERVICE_NAME)", s.SpanID, s.OperationName, s.Service, traceService)
		}
	}
	if tr.race.Kind != "internal" || tr.race.Tags["otel.scope.name"] != oteltrace.ScopeName {
		t.Errorf("llm_hedge span: kind %q scope %v, want internal, %s", tr.race.Kind, tr.race.Tags["otel.scope.name"], oteltrace.ScopeName)
	}
	tr.attempts = jaeger.Find(spans, core.SpanAttempt)
	if len(tr.attempts) != attempts {
		t.Fatalf("trace %s: %d attempt spans, want %d: %s", traceID, len(tr.attempts), attempts, describeSpans(spans))
	}
	sort.Slice(tr.attempts, func(x, y int) bool {
		return fmt.Sprint(tr.attempts[x].Tags["llmhedge.attempt.index"]) < fmt.Sprint(tr.attempts[y].Tags["llmhedge.attempt.index"])
	})
	for i, a := range tr.attempts {
		if idx := a.Tags["llmhedge.attempt.index"]; idx != int64(i) {
			t.Errorf("attempt span %s: llmhedge.attempt.index %v, want %d", a.SpanID, idx, i)
		}
		if a.ParentSpanID != tr.race.SpanID || a.Kind != "client" {
			t.Errorf("attempt %d: parent %s kind %q, want the llm_hedge span %s, client", i, a.ParentSpanID, a.Kind, tr.race.SpanID)
		}
		if a.Start.Before(tr.race.Start) {
			t.Errorf("attempt %d starts at %v, before its race at %v", i, a.Start, tr.race.Start)
		}
	}
	if tr.race.Start.Before(tr.server.Start) {
		t.Errorf("llm_hedge starts at %v, before Caddy's span at %v", tr.race.Start, tr.server.Start)
	}
	return tr
}

func describeSpans(spans []jaeger.Span) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "\n  %s %s (%s, parent %q)", s.SpanID, s.OperationName, s.Kind, s.ParentSpanID)
	}
	return b.String()
}

// checkTags compares span tags with want: string, bool, int64 or float64
// values as Jaeger types them; nil means the tag must be absent.
func checkTags(t *testing.T, what string, s jaeger.Span, want map[string]any) {
	t.Helper()
	for key, w := range want {
		got, ok := s.Tags[key]
		switch {
		case w == nil && ok:
			t.Errorf("%s: tag %s = %v, want none", what, key, got)
		case w != nil && !ok:
			t.Errorf("%s: no tag %s, want %v", what, key, w)
		case w != nil && got != w:
			t.Errorf("%s: tag %s = %v (%T), want %v (%T)", what, key, got, got, w, w)
		}
	}
}

// checkErrorOnly: the attempts listed in failed have an error status with a
// reason; no other span of the trace has one.
func checkErrorOnly(t *testing.T, tr raceTrace, failed ...int) {
	t.Helper()
	isFailed := map[int]bool{}
	for _, i := range failed {
		isFailed[i] = true
	}
	for i, a := range tr.attempts {
		switch {
		case isFailed[i] && (!a.Error || a.StatusCode != "ERROR" || a.StatusMessage == ""):
			t.Errorf("attempt %d: error %v status %q %q, want an ERROR status with its reason", i, a.Error, a.StatusCode, a.StatusMessage)
		case !isFailed[i] && (a.Error || a.StatusCode != ""):
			t.Errorf("attempt %d: error %v status %q %q, want no error status", i, a.Error, a.StatusCode, a.StatusMessage)
		}
	}
	if tr.race.Error || tr.race.StatusCode == "ERROR" {
		t.Errorf("llm_hedge span: error status %q %q, want none (the client got its answer)", tr.race.StatusCode, tr.race.StatusMessage)
	}
}

// checkReceived: attempt i's upstream received headers[i], whose
// traceparent names attempt i's span as parent, each a distinct one, with
// the client's tracestate kept.
func checkReceived(t *testing.T, tr raceTrace, headers []http.Header) {
	t.Helper()
	seen := map[string]int{}
	for i, a := range tr.attempts {
		got := headers[i].Get("Traceparent")
		want := "00-" + a.TraceID + "-" + a.SpanID + "-01"
		if got != want {
			t.Errorf("attempt %d's upstream received traceparent %q, want %q (its attempt span as parent)", i, got, want)
		}
		if j, dup := seen[got]; dup {
			t.Errorf("attempts %d and %d sent the same traceparent %q", j, i, got)
		}
		seen[got] = i
		if got := headers[i].Get("Tracestate"); got != "vendor=client" {
			t.Errorf("attempt %d's upstream received tracestate %q, want the client's \"vendor=client\"", i, got)
		}
	}
}

// TestTracesInJaeger: real Caddy with its tracing directive on the route,
// exporting to a real Jaeger over OTLP/HTTP; the span trees of a hedged
// request, a retried failure, a replayed idempotency key and a validated
// answer are read back from Jaeger's query API, and each upstream's
// traceparent is checked against its attempt's span. A route without
// tracing passes the client's traceparent through and makes no span.
func TestTracesInJaeger(t *testing.T) {
	j := jaeger.Start(t)

	// A holds the hedged request until the test releases it; B answers it
	// only once A has it, so both attempts reach their upstream.
	const hedgedID = "trace-hedged"
	holder := &llmsim.Holder{}
	release := holder.Hold(hedgedID)
	defer close(release)
	a := (&llmsim.Server{Name: "A", Workload: simWorkload(10 * time.Millisecond), Behave: holder.Behave}).Start()
	t.Cleanup(a.Close)
	b := (&llmsim.Server{Name: "B", Workload: simWorkload(10 * time.Millisecond), Behave: func(r *http.Request) llmsim.Behavior {
		if r.Header.Get(llmsim.HeaderRequest) == hedgedID {
			a.WaitFor(r.Context(), func() bool { return a.Attempts(hedgedID) > 0 })
		}
		return llmsim.Behavior{}
	}}).Start()
	t.Cleanup(b.Close)

	// The validated route: A answers at once with JSON that breaks the
	// request's schema, B with a valid answer.
	var rec headerRecorder
	sa := httptest.NewServer(rec.wrap("A", &llmsim.Structured{Name: "A", Valid: false}))
	t.Cleanup(sa.Close)
	sb := httptest.NewServer(rec.wrap("B", &llmsim.Structured{Name: "B", Valid: true}))
	t.Cleanup(sb.Close)
	validated := fmt.Sprintf("\tllm_hedge {\n\t\troute validated\n\t\tupstream %s {\n\t\t\tname A\n\t\t}\n\t\tupstream %s {\n\t\t\tname B\n\t\t}\n\t\tdelay 10s\n\t\tvalidate json_schema\n\t}", sa.URL, sb.URL)

	c := startCaddyEnv(t, traceEnv(j, "100"), "",
		tracedSite(hedgeSite(a, b, "")), tracedSite(validated), hedgeSite(a, b, ""))
	ctx := testContext(t)

	// Without tracing on the route: no span, the client's trace headers.
	untracedID, untracedParent := clientTrace(0)
	status, _, _ := tracedRequest(t, rawChatRequest(c.url(2), "trace-untraced", ""), untracedParent)
	if status != http.StatusOK {
		t.Fatalf("untraced route: status %d, want 200", status)
	}
	h := simHeaders(t, a, "trace-untraced")
	if got := h.Get("Traceparent"); got != untracedParent {
		t.Errorf("untraced route: A received traceparent %q, want the client's %q unchanged", got, untracedParent)
	}
	if got := h.Get("Tracestate"); got != "vendor=client" {
		t.Errorf("untraced route: A received tracestate %q, want the client's", got)
	}

	t.Run("hedged", func(t *testing.T) {
		traceID, parent := clientTrace(1)
		status, _, body := tracedRequest(t, rawChatRequest(c.url(0), hedgedID, "").WithContext(ctx), parent)
		if want := string(llmsim.ExpectedStream("B", "model-b", hedgedID, simTokens)); status != 200 || body != want {
			t.Fatalf("status %d body %q, want 200 and B's stream", status, body)
		}
		tr := readTrace(t, j, traceID, 2)
		checkTags(t, "llm_hedge", tr.race, map[string]any{
			"llmhedge.route": "e2e", "llmhedge.outcome": "ok", "llmhedge.status": int64(200), "llmhedge.hedged": true,
			"llmhedge.attempts": int64(2), "llmhedge.hedges_started": int64(1), "llmhedge.delay_ms": 50.0,
			"llmhedge.winner_attempt": int64(1), "llmhedge.winner_upstream": "B", "llmhedge.winner_role": core.RoleHedge,
			"gen_ai.request.model": "m", "llmhedge.idempotency": nil,
		})
		checkTags(t, "attempt 0", tr.attempts[0], map[string]any{
			"llmhedge.attempt.upstream": "A", "llmhedge.attempt.role": core.RolePrimary, "llmhedge.attempt.result": core.ResultLost,
			"gen_ai.request.model": "model-a", "gen_ai.operation.name": "chat", "server.address": "127.0.0.1", "error.type": nil,
		})
		checkTags(t, "attempt 1", tr.attempts[1], map[string]any{
			"llmhedge.attempt.upstream": "B", "llmhedge.attempt.role": core.RoleHedge, "llmhedge.attempt.result": core.ResultWon,
			"gen_ai.request.model": "model-b", "http.response.status_code": int64(200), "error.type": nil,
		})
		if started, ok := tr.attempts[1].Tags["llmhedge.attempt.started_ms"].(float64); !ok || started < 50 {
			t.Errorf("hedge's llmhedge.attempt.started_ms %v, want >= the 50ms delay", tr.attempts[1].Tags["llmhedge.attempt.started_ms"])
		}
		checkErrorOnly(t, tr)
		checkReceived(t, tr, []http.Header{simHeaders(t, a, hedgedID), simHeaders(t, b, hedgedID)})
	})

	t.Run("primary failed", func(t *testing.T) {
		const id = "trace-failed"
		traceID, parent := clientTrace(2)
		status, _, body := tracedRequest(t, rawChatRequest(c.url(0), id, "A=status:503").WithContext(ctx), parent)
		if want := string(llmsim.ExpectedStream("B", "model-b", id, simTokens)); status != 200 || body != want {
			t.Fatalf("status %d body %q, want 200 and B's stream", status, body)
		}
		tr := readTrace(t, j, traceID, 2)
		checkTags(t, "llm_hedge", tr.race, map[string]any{
			"llmhedge.outcome": "ok", "llmhedge.attempts": int64(2), "llmhedge.winner_upstream": "B", "llmhedge.winner_role": core.RoleRetry,
		})
		checkTags(t, "attempt 0", tr.attempts[0], map[string]any{
			"llmhedge.attempt.upstream": "A", "llmhedge.attempt.role": core.RolePrimary, "llmhedge.attempt.result": core.ResultFailed,
			"llmhedge.attempt.error_type": "503", "http.response.status_code": int64(503), "error.type": "503",
		})
		checkTags(t, "attempt 1", tr.attempts[1], map[string]any{
			"llmhedge.attempt.upstream": "B", "llmhedge.attempt.role": core.RoleRetry, "llmhedge.attempt.result": core.ResultWon,
			"error.type": nil,
		})
		checkErrorOnly(t, tr, 0)
		checkReceived(t, tr, []http.Header{simHeaders(t, a, id), simHeaders(t, b, id)})
	})

	t.Run("replayed key", func(t *testing.T) {
		const id, key = "trace-replay", "trace-key-secret-1"
		send := func(n int) (string, string) {
			traceID, parent := clientTrace(n)
			req := rawChatRequest(c.url(0), id, "").WithContext(ctx)
			req.Header.Set("Idempotency-Key", key)
			status, _, body := tracedRequest(t, req, parent)
			if status != 200 {
				t.Fatalf("request %d: status %d, want 200: %s", n, status, body)
			}
			return traceID, body
		}
		firstID, first := send(3)
		replayID, replay := send(4)
		if replay != first {
			t.Fatalf("replay %q, want the first answer %q", replay, first)
		}
		if n := a.Attempts(id) + b.Attempts(id); n < 1 || a.Attempts(id) > 1 || b.Attempts(id) > 1 {
			t.Fatalf("upstream requests for the key: A %d B %d, want one race (the replay sends none)", a.Attempts(id), b.Attempts(id))
		}
		led := readTrace(t, j, firstID, a.Attempts(id)+b.Attempts(id))
		checkTags(t, "first request", led.race, map[string]any{"llmhedge.idempotency": core.IdempotencyLed,
			"llmhedge.idempotency_key_hash": core.KeyHash(key)})
		tr := readTrace(t, j, replayID, 0)
		checkTags(t, "replay", tr.race, map[string]any{"llmhedge.idempotency": core.IdempotencyReplayed,
			"llmhedge.outcome": core.OutcomeReplayed, "llmhedge.attempts": int64(0), "llmhedge.idempotency_key_hash": core.KeyHash(key)})
		checkErrorOnly(t, tr)
		for _, s := range []jaeger.Span{led.server, led.race, tr.server, tr.race} {
			for k, v := range s.Tags {
				if strings.Contains(fmt.Sprint(v), key) {
					t.Errorf("span %s tag %s carries the idempotency key", s.OperationName, k)
				}
			}
		}
	})

	t.Run("validated", func(t *testing.T) {
		const id = "trace-validated"
		traceID, parent := clientTrace(5)
		req := llmsim.StructuredRequest(ctx, c.url(1), true)
		req.Header.Set(llmsim.HeaderRequest, id)
		status, hdr, body := tracedRequest(t, req, parent)
		if want := llmsim.StructuredContent("B", true); status != 200 || streamedContent(body) != want || hdr.Get(core.HeaderValidation) != "" {
			t.Fatalf("status %d, %s %q, content %q: want 200 and B's valid answer %q", status, core.HeaderValidation, hdr.Get(core.HeaderValidation), streamedContent(body), want)
		}
		tr := readTrace(t, j, traceID, 2)
		checkTags(t, "llm_hedge", tr.race, map[string]any{
			"llmhedge.route": "validated", "llmhedge.outcome": "ok", "llmhedge.validation": core.ValidationPassed,
			"llmhedge.winner_upstream": "B", "llmhedge.attempts": int64(2),
		})
		checkTags(t, "attempt 0", tr.attempts[0], map[string]any{
			"llmhedge.attempt.upstream": "A", "llmhedge.attempt.result": core.ResultInvalid,
			"llmhedge.attempt.invalid_check": "json_schema", "error.type": "upstream_bad_response",
		})
		checkTags(t, "attempt 1", tr.attempts[1], map[string]any{
			"llmhedge.attempt.upstream": "B", "llmhedge.attempt.role": core.RoleRetry, "llmhedge.attempt.result": core.ResultWon, "error.type": nil,
		})
		checkErrorOnly(t, tr, 0)
		checkReceived(t, tr, []http.Header{rec.get("A", id), rec.get("B", id)})
	})

	// Every traced request's spans are in Jaeger by now, exported after the
	// untraced one's would have been: it has none.
	if spans := j.Trace(t, untracedID, 0); len(spans) != 0 {
		t.Errorf("untraced route: Jaeger has %d spans of its trace, want none: %s", len(spans), describeSpans(spans))
	}
}

// TestBenchTracingOnOff compares requests/s through real Caddy with
// tracing on (the tracing directive on the route, every request sampled
// and exported to a real Jaeger over OTLP/HTTP) and off (the same route
// without it), on a fast upstream where no hedge fires: the light load
// client, rounds alternating between the sites. reverse_proxy with and
// without tracing, on the same upstream, price Caddy's own span and export
// beside llm_hedge's three spans. It prints the ratios and asserts no
// number (the machine is shared). It runs with LLMHEDGE_BENCH=1, as the
// other benchmarks here.
func TestBenchTracingOnOff(t *testing.T) {
	const (
		rounds   = 3
		perRound = 3000
		conns    = 20
	)
	envgate.Bench(t)
	j := jaeger.Start(t)
	up := llmsim.Start("A", llmsim.Fast())
	defer up.Close()
	spare := llmsim.Start("B", llmsim.Fast())
	defer spare.Close()
	hedge := fmt.Sprintf("\tllm_hedge %s %s {\n\t\tdelay 30s\n\t\tlog_level debug\n\t}", up.URL, spare.URL)
	proxy := fmt.Sprintf("\treverse_proxy %s", up.URL)
	c := startCaddyEnv(t, traceEnv(j, ""), "", tracedSite(hedge), hedge, tracedSite(proxy), proxy)
	names := []string{"llm_hedge, tracing on", "llm_hedge, tracing off", "reverse_proxy, tracing on", "reverse_proxy, tracing off"}
	targets := func(n int) []lightload.Target {
		var out []lightload.Target
		for i, name := range names {
			out = append(out, lightload.StreamTarget(name, strings.TrimPrefix(c.url(i), "http://"), "/v1/chat/completions", c.cmd.Process.Pid, conns, n))
		}
		return out
	}
	_, cmp, err := lightload.Bench(testContext(t), rounds, 1000, perRound, targets)
	if err != nil {
		t.Fatal(err)
	}
	cmp.CheckNoFailureNoHedge(t, spare)
	t.Logf("tracing on/off, fast 20-token upstream, no hedge: %d rounds x %d requests per site, %d connections; on: every request sampled and exported to Jaeger", rounds, perRound, conns)
	for i, name := range cmp.Names {
		t.Logf("  %-27s %8.0f req/s   Caddy CPU %v/request", name, cmp.RPS(i), cmp.CPUPerRequest(i))
	}
	cpu := func(i, j int) float64 { return float64(cmp.CPUPerRequest(i)) / float64(cmp.CPUPerRequest(j)) }
	t.Logf("  llm_hedge     req/s on / off = %.3f (rounds %.2f); Caddy CPU per request on / off = %.2f (+%v)",
		cmp.RPS(0)/cmp.RPS(1), cmp.RoundRatios(0, 1), cpu(0, 1), cmp.CPUPerRequest(0)-cmp.CPUPerRequest(1))
	t.Logf("  reverse_proxy req/s on / off = %.3f (rounds %.2f); Caddy CPU per request on / off = %.2f (+%v)",
		cmp.RPS(2)/cmp.RPS(3), cmp.RoundRatios(2, 3), cpu(2, 3), cmp.CPUPerRequest(2)-cmp.CPUPerRequest(3))
	caddyCPU := func() time.Duration {
		d, err := lightload.ProcessCPU(c.cmd.Process.Pid)
		if err != nil {
			t.Fatalf("reading Caddy's CPU time: %v", err)
		}
		return d
	}
	heyload.Compare(t, [2]string{"llm_hedge, tracing on", "llm_hedge, tracing off"}, [2]string{c.url(0) + "/v1/chat/completions", c.url(1) + "/v1/chat/completions"},
		[2]func() time.Duration{caddyCPU, caddyCPU}, "Caddy")
}
