package lighttrace

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
)

func newTestExporter(t *testing.T, opts Options) *Exporter {
	t.Helper()
	e, err := NewExporter(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func requestWith(traceparent, tracestate string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader("{}"))
	if traceparent != "" {
		r.Header.Set("Traceparent", traceparent)
	}
	if tracestate != "" {
		r.Header.Set("Tracestate", tracestate)
	}
	return r
}

// A request with a sampled parent continues its trace; each attempt gets
// a distinct span id, sent as the parent of its traceparent, with the
// client's tracestate.
func TestAttemptsContinueTheClientsTrace(t *testing.T) {
	e := newTestExporter(t, Options{Endpoint: "http://127.0.0.1:1"})
	tr := NewTracer(e, 0) // a parent's sampled flag wins over the rate
	tc := tr.Start(requestWith(clientTP, "congo=t61rcWkgMzE"), time.Now())
	if tc == nil {
		t.Fatal("Start returned nil for a sampled parent")
	}
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		tp, state := tc.Attempt(i, time.Now())
		p, ok := parseTraceparent(tp)
		if !ok || !strings.HasPrefix(tp, "00-") || !strings.HasSuffix(tp, "-01") {
			t.Fatalf("attempt %d traceparent %q: want a valid, sampled version-00 header", i, tp)
		}
		if p.traceID != clientTrace {
			t.Errorf("attempt %d trace id %s, want the client's %s", i, p.traceID, clientTrace)
		}
		if p.spanID == clientSpan {
			t.Errorf("attempt %d sends the client's span %s as its parent, want its own span", i, p.spanID)
		}
		if seen[p.spanID] {
			t.Errorf("attempt %d reuses span id %s", i, p.spanID)
		}
		seen[p.spanID] = true
		if state != "congo=t61rcWkgMzE" {
			t.Errorf("attempt %d tracestate %q, want the client's", i, state)
		}
		if got := tc.(*trace).attempts[i]; got != p.spanID {
			t.Errorf("attempt %d: traceparent parent %s, but its span is %s", i, p.spanID, got)
		}
	}
	if rs := tc.(*trace).spanID; seen[rs] || rs == clientSpan {
		t.Errorf("request span id %s is shared with an attempt or the client", rs)
	}
}

// A parent that is not sampled leaves the request untraced, whatever the
// rate; without a parent the rate decides.
func TestSampling(t *testing.T) {
	e := newTestExporter(t, Options{Endpoint: "http://127.0.0.1:1"})
	unsampled := "00-" + clientTrace + "-" + clientSpan + "-00"
	if tr := NewTracer(e, 1).Start(requestWith(unsampled, "a=b"), time.Now()); tr != nil {
		t.Fatalf("unsampled parent: Start returned a trace, want nil")
	}
	if tr := NewTracer(e, 0).Start(requestWith("", ""), time.Now()); tr != nil {
		t.Fatalf("rate 0 without a parent: Start returned a trace, want nil")
	}
	// An invalid parent is absent: a new trace (rate 1), no tracestate.
	tr := NewTracer(e, 1).Start(requestWith("00-"+zeroTraceID+"-"+clientSpan+"-01", "a=b"), time.Now())
	if tr == nil {
		t.Fatal("rate 1, invalid parent: Start returned nil, want a new trace")
	}
	got := tr.(*trace)
	if got.traceID == clientTrace || got.traceID == zeroTraceID || len(got.traceID) != 32 || !isLowerHex(got.traceID) {
		t.Errorf("new trace id %q: want 32 fresh hex digits", got.traceID)
	}
	if got.parentID != "" || got.tracestate != "" {
		t.Errorf("new trace has parent %q and tracestate %q, want none", got.parentID, got.tracestate)
	}
	if _, state := tr.Attempt(0, time.Now()); state != "" {
		t.Errorf("new trace's attempt carries tracestate %q, want none", state)
	}
	half := NewTracer(e, 0.5)
	n := 0
	for i := 0; i < 2000; i++ {
		if half.Start(requestWith("", ""), time.Now()) != nil {
			n++
		}
	}
	if n < 800 || n > 1200 {
		t.Errorf("rate 0.5 sampled %d of 2000 new traces, want about 1000", n)
	}
}

const ms = time.Millisecond

// hedgedReport is a request whose primary failed with a 503, retried on B,
// which won.
func hedgedReport(start time.Time) *core.Report {
	r := &core.Report{Route: "r@test", Outcome: core.OutcomeOK, Status: 200, Hedged: true, Winner: 1, Start: start,
		Total: 300 * ms, Delay: 100 * ms, TTFT: 70 * ms, Denials: []string{"budget"}, KeyHash: "4f9bf09c1b697898", Idempotency: core.IdempotencyLed, Model: "gpt-x"}
	r.Attempts = []core.AttemptReport{
		{Index: 0, Upstream: "A", Role: core.RolePrimary, Result: core.ResultFailed, Status: 503, Ended: 20 * ms,
			ErrorType: "503", Error: "status 503", ServerAddress: "a.test", ServerPort: 8080},
		{Index: 1, Upstream: "B", Role: core.RoleRetry, Result: core.ResultWon, Status: 200, Started: 21 * ms, Ended: 300 * ms,
			TTFT: 49 * ms, ServerAddress: "api.openai.com", ServerPort: 443, Provider: "openai"},
	}
	return r
}

func nanos(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

// The collector receives the tree: the request span under the client's
// span, each attempt's span under it with the id its upstream was sent,
// kinds, times, typed attributes and error statuses.
func TestExportedTree(t *testing.T) {
	c := startCollector(t, http.StatusOK, false)
	e := newTestExporter(t, Options{Endpoint: c.srv.URL, ServiceName: "edge", Headers: map[string]string{"X-Api-Key": "sekrit"}, BatchSize: 3})
	tc := NewTracer(e, 1).Start(requestWith(clientTP, ""), time.Now())
	tp0, _ := tc.Attempt(0, time.Now())
	tp1, _ := tc.Attempt(1, time.Now())
	start := time.Unix(1700000000, 123456789)
	tc.End(hedgedReport(start))

	post := c.next(t)
	if post.path != "/v1/traces" {
		t.Errorf("posted to %s, want /v1/traces", post.path)
	}
	if ct := post.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if k := post.header.Get("X-Api-Key"); k != "sekrit" {
		t.Errorf("X-Api-Key %q, want the configured header", k)
	}
	spans, service, scopeName := otlpSpans(t, decoded(t, post.body))
	if service != "edge" || scopeName != ScopeName {
		t.Errorf("service.name %q, scope %q; want edge, %s", service, scopeName, ScopeName)
	}
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3 (the request and two attempts)", len(spans))
	}
	req, a0, a1 := spans[0], spans[1], spans[2]
	want := func(s map[string]interface{}, key string, v interface{}) {
		t.Helper()
		if s[key] != v {
			t.Errorf("span %v: %s = %v (%T), want %v (%T)", s["name"], key, s[key], s[key], v, v)
		}
	}
	for _, s := range spans {
		want(s, "traceId", clientTrace)
	}
	want(req, "name", core.SpanRequest)
	want(req, "kind", float64(core.SpanKindInternal))
	want(req, "parentSpanId", clientSpan)
	want(req, "startTimeUnixNano", nanos(start))
	want(req, "endTimeUnixNano", nanos(start.Add(300*ms)))
	if _, ok := req["status"]; ok {
		t.Errorf("request span has status %v, want it unset (the request succeeded)", req["status"])
	}
	reqID, _ := req["spanId"].(string)
	for i, pair := range []struct {
		s  map[string]interface{}
		tp string
	}{{a0, tp0}, {a1, tp1}} {
		want(pair.s, "name", core.SpanAttempt)
		want(pair.s, "kind", float64(core.SpanKindClient))
		want(pair.s, "parentSpanId", reqID)
		if p, _ := parseTraceparent(pair.tp); pair.s["spanId"] != p.spanID {
			t.Errorf("attempt %d span id %v, but its upstream was sent parent %s", i, pair.s["spanId"], p.spanID)
		}
	}
	want(a0, "startTimeUnixNano", nanos(start))
	want(a0, "endTimeUnixNano", nanos(start.Add(20*ms)))
	want(a1, "startTimeUnixNano", nanos(start.Add(21*ms)))
	want(a1, "endTimeUnixNano", nanos(start.Add(300*ms)))
	st := field(t, a0, "status")
	if st["code"] != float64(2) || st["message"] != "status 503" {
		t.Errorf("failed attempt's status %v, want code 2 and message \"status 503\"", st)
	}
	if _, ok := a1["status"]; ok {
		t.Errorf("winning attempt has status %v, want it unset", a1["status"])
	}

	// Attribute values carry OTLP's types: intValue as a decimal string,
	// doubleValue and boolValue as JSON numbers and booleans, string
	// arrays as arrayValue.
	ra := attrs(t, req)
	for key, v := range map[string][2]interface{}{
		"llmhedge.attempts":             {"intValue", "2"},
		"llmhedge.status":               {"intValue", "200"},
		"llmhedge.hedged":               {"boolValue", true},
		"llmhedge.total_ms":             {"doubleValue", float64(300)},
		"llmhedge.outcome":              {"stringValue", core.OutcomeOK},
		"llmhedge.idempotency":          {"stringValue", core.IdempotencyLed},
		"llmhedge.idempotency_key_hash": {"stringValue", "4f9bf09c1b697898"},
		"gen_ai.request.model":          {"stringValue", "gpt-x"},
	} {
		if got := ra[key][v[0].(string)]; got != v[1] {
			t.Errorf("request span %s = %v (%T) as %s, want %v; value %v", key, got, got, v[0], v[1], ra[key])
		}
	}
	denials, ok := ra["llmhedge.denials"]["arrayValue"].(map[string]interface{})
	if !ok {
		t.Fatalf("llmhedge.denials = %v, want an arrayValue", ra["llmhedge.denials"])
	}
	vals := list(t, denials, "values")
	if len(vals) != 1 || vals[0].(map[string]interface{})["stringValue"] != "budget" {
		t.Errorf("llmhedge.denials values %v, want [budget]", vals)
	}
	if _, ok := ra["llmhedge.attempt_list"]; ok {
		t.Error("request span carries the log line's attempt_list, want it left to the attempt spans")
	}
	aa0 := attrs(t, a0)
	for key, v := range map[string][2]interface{}{
		"llmhedge.attempt.role":     {"stringValue", core.RolePrimary},
		"llmhedge.attempt.result":   {"stringValue", core.ResultFailed},
		"llmhedge.attempt.upstream": {"stringValue", "A"},
		"llmhedge.attempt.index":    {"intValue", "0"},
		"error.type":                {"stringValue", "503"},
		"server.port":               {"intValue", "8080"},
		"http.response.status_code": {"intValue", "503"},
	} {
		if got := aa0[key][v[0].(string)]; got != v[1] {
			t.Errorf("attempt 0 %s = %v (%T) as %s, want %v; value %v", key, got, got, v[0], v[1], aa0[key])
		}
	}
	aa1 := attrs(t, a1)
	if aa1["gen_ai.provider.name"]["stringValue"] != "openai" || aa1["llmhedge.attempt.ttft_ms"]["doubleValue"] != float64(49) {
		t.Errorf("attempt 1: provider %v, ttft %v; want openai and 49", aa1["gen_ai.provider.name"], aa1["llmhedge.attempt.ttft_ms"])
	}
	if _, ok := aa1["error.type"]; ok {
		t.Errorf("winning attempt has error.type %v", aa1["error.type"])
	}
	e.Close()
	if s := e.Stats(); s.Exported != 3 || s.Dropped != 0 || s.FailedPosts != 0 {
		t.Errorf("stats %+v, want 3 exported and nothing else", s)
	}
}

// A new trace is a root: its request span has no parent. A failed
// request's span has an error status naming its outcome.
func TestRootAndFailedRequest(t *testing.T) {
	c := startCollector(t, http.StatusOK, false)
	e := newTestExporter(t, Options{Endpoint: c.srv.URL + "/", ServiceName: "edge", BatchSize: 2})
	tc := NewTracer(e, 1).Start(requestWith("", ""), time.Now())
	tc.Attempt(0, time.Now())
	r := hedgedReport(time.Now())
	r.Outcome = core.OutcomeUpstreamError
	r.Status = 503
	r.Winner = -1
	r.Attempts = r.Attempts[:1]
	tc.End(r)
	post := c.next(t)
	if post.path != "/v1/traces" {
		t.Errorf("endpoint with path / posted to %s, want /v1/traces", post.path)
	}
	spans, _, _ := otlpSpans(t, decoded(t, post.body))
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	if p, ok := spans[0]["parentSpanId"]; ok {
		t.Errorf("root request span has parent %v, want none", p)
	}
	st := field(t, spans[0], "status")
	if st["code"] != float64(2) || st["message"] != core.OutcomeUpstreamError {
		t.Errorf("failed request's status %v, want code 2 and message %q", st, core.OutcomeUpstreamError)
	}
	if spans[1]["parentSpanId"] != spans[0]["spanId"] {
		t.Errorf("attempt's parent %v, want the request span %v", spans[1]["parentSpanId"], spans[0]["spanId"])
	}
}
