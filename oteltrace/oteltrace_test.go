package oteltrace_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/oteltrace"
)

// The client's trace context in the tests that send one.
const (
	clientTraceID     = "0af7651916cd43dd8448eb211c80319c"
	clientParentID    = "b7ad6b7169203331"
	clientTraceparent = "00-" + clientTraceID + "-" + clientParentID + "-01"
	clientTracestate  = "vendor=client"
)

// upstream is an httptest server that reports every request's headers, in
// arrival order, on received.
type upstream struct {
	*httptest.Server
	name     string
	received chan http.Header
}

// next is the headers of the upstream's next request, one that has
// arrived already.
func (u *upstream) next(t *testing.T) http.Header {
	t.Helper()
	select {
	case h := <-u.received:
		return h
	default:
		t.Fatalf("upstream %s received no request", u.name)
		return nil
	}
}

// startUpstream serves with answer after reporting the request's headers.
func startUpstream(t *testing.T, name string, answer http.HandlerFunc) *upstream {
	u := &upstream{name: name, received: make(chan http.Header, 8)}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		u.received <- r.Header.Clone()
		answer(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

// streams answers with a short chat stream.
func streams(text string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"`+text+`"}}]}`+"\n\n")
		io.WriteString(w, "data: [DONE]\n\n")
	}
}

// heldUntil answers nothing until release is closed or the engine cancels
// the attempt.
func heldUntil(release <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}
}

// fails answers 503 with an OpenAI-style error.
func fails(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, `{"error":{"message":"overloaded","type":"server_error"}}`)
}

// newHedger is a hedger on a then b: a hedge after delay, a retry at once
// after a retryable failure, and no third attempt (the spans are counted).
func newHedger(t *testing.T, tracer core.Tracer, delay time.Duration, a, b *upstream) *core.Hedger {
	t.Helper()
	h, err := core.New(config.Config{
		Route: "traced",
		Upstreams: []config.UpstreamConfig{
			{Name: "A", URL: a.URL},
			{Name: "B", URL: b.URL},
		},
		Delay:       config.DelayConfig{Fixed: config.Duration(delay)},
		MaxAttempts: 2,
	}, core.Options{Tracer: tracer})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func chatRequest(ctx context.Context) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	r.Header.Set("Content-Type", "application/json")
	return r.WithContext(ctx)
}

// serve runs r through h and checks the client got 200 with text.
func serve(t *testing.T, h *core.Hedger, r *http.Request, text string) {
	t.Helper()
	w := httptest.NewRecorder()
	if err := h.Handle(w, r); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), text) {
		t.Fatalf("client got %d %q, want 200 with %q", w.Code, w.Body.String(), text)
	}
}

// newProvider is a real SDK provider whose ended spans the recorder keeps.
func newProvider(t *testing.T, opts ...sdktrace.TracerProviderOption) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(rec)}, opts...)...)
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, rec
}

// tree is a request's spans as the recorder has them: the request span and
// its attempts in index order.
type tree struct {
	request  sdktrace.ReadOnlySpan
	attempts []sdktrace.ReadOnlySpan
}

// spanTree sorts the ended spans named core.SpanRequest and
// core.SpanAttempt; other spans (a parent the test made) are ignored.
func spanTree(t *testing.T, rec *tracetest.SpanRecorder, wantAttempts int) tree {
	t.Helper()
	var tr tree
	byIndex := map[int64]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		switch s.Name() {
		case core.SpanRequest:
			if tr.request != nil {
				t.Fatalf("two %q spans", core.SpanRequest)
			}
			tr.request = s
		case core.SpanAttempt:
			idx, ok := attrs(s)["llmhedge.attempt.index"]
			if !ok {
				t.Fatalf("attempt span without llmhedge.attempt.index: %v", s.Attributes())
			}
			byIndex[idx.AsInt64()] = s
		}
	}
	if tr.request == nil {
		t.Fatalf("no %q span among %d ended spans", core.SpanRequest, len(rec.Ended()))
	}
	if len(byIndex) != wantAttempts {
		t.Fatalf("%d attempt spans, want %d", len(byIndex), wantAttempts)
	}
	for i := 0; i < wantAttempts; i++ {
		s, ok := byIndex[int64(i)]
		if !ok {
			t.Fatalf("no attempt span with index %d", i)
		}
		tr.attempts = append(tr.attempts, s)
	}
	return tr
}

func attrs(s sdktrace.ReadOnlySpan) map[string]attribute.Value {
	m := make(map[string]attribute.Value)
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

// checkAttrs compares s's attributes with want (string, int, int64,
// float64 or bool values); a nil want value means the key must be absent.
func checkAttrs(t *testing.T, what string, s sdktrace.ReadOnlySpan, want map[string]any) {
	t.Helper()
	got := attrs(s)
	for key, w := range want {
		v, ok := got[key]
		if w == nil {
			if ok {
				t.Errorf("%s: attribute %s = %v, want none", what, key, v.String())
			}
			continue
		}
		if !ok {
			t.Errorf("%s: no attribute %s, want %v", what, key, w)
			continue
		}
		var match bool
		switch w := w.(type) {
		case string:
			match = v.Type() == attribute.STRING && v.AsString() == w
		case int:
			match = v.Type() == attribute.INT64 && v.AsInt64() == int64(w)
		case int64:
			match = v.Type() == attribute.INT64 && v.AsInt64() == w
		case bool:
			match = v.Type() == attribute.BOOL && v.AsBool() == w
		case float64:
			match = v.Type() == attribute.FLOAT64 && v.AsFloat64() == w
		default:
			t.Fatalf("checkAttrs: want value %T", w)
		}
		if !match {
			t.Errorf("%s: attribute %s = %s %v, want %v", what, key, v.Type(), v.String(), w)
		}
	}
}

// checkTree checks the request span's parent, the attempts' parents, kinds
// and scope, and that each upstream received its attempt span as parent.
func checkTree(t *testing.T, tr tree, parent trace.SpanContext, received []http.Header, wantState string) {
	t.Helper()
	req := tr.request
	if req.Parent().SpanID() != parent.SpanID() || req.SpanContext().TraceID() != parent.TraceID() {
		t.Errorf("request span's parent %s/%s, want %s/%s", req.SpanContext().TraceID(), req.Parent().SpanID(), parent.TraceID(), parent.SpanID())
	}
	if req.SpanKind() != trace.SpanKindInternal {
		t.Errorf("request span kind %v, want internal", req.SpanKind())
	}
	if got := req.InstrumentationScope().Name; got != oteltrace.ScopeName {
		t.Errorf("request span's scope %q, want %q", got, oteltrace.ScopeName)
	}
	seen := map[string]int{}
	for i, a := range tr.attempts {
		if a.Parent().SpanID() != req.SpanContext().SpanID() || a.SpanContext().TraceID() != parent.TraceID() {
			t.Errorf("attempt %d's parent %s/%s, want the request span %s/%s", i, a.SpanContext().TraceID(), a.Parent().SpanID(), parent.TraceID(), req.SpanContext().SpanID())
		}
		if a.SpanKind() != trace.SpanKindClient {
			t.Errorf("attempt %d span kind %v, want client", i, a.SpanKind())
		}
		if a.StartTime().Before(req.StartTime()) || a.EndTime().After(req.EndTime()) {
			t.Errorf("attempt %d span [%v, %v] outside the request span [%v, %v]", i, a.StartTime(), a.EndTime(), req.StartTime(), req.EndTime())
		}
		want := "00-" + a.SpanContext().TraceID().String() + "-" + a.SpanContext().SpanID().String() + "-01"
		got := received[i].Get("Traceparent")
		if got != want {
			t.Errorf("attempt %d's upstream received traceparent %q, want its span's %q", i, got, want)
		}
		if j, dup := seen[got]; dup {
			t.Errorf("attempts %d and %d sent the same traceparent %q", j, i, got)
		}
		seen[got] = i
		if got := received[i].Get("Tracestate"); got != wantState {
			t.Errorf("attempt %d's upstream received tracestate %q, want %q", i, got, wantState)
		}
	}
}

// hedged runs a request whose primary is held until the test ends, so the
// hedge after the delay wins (B answers only once A's request is in, so
// both attempts reach their upstream), and returns the upstreams' received
// headers and URLs.
func hedged(t *testing.T, tracer core.Tracer, r *http.Request) (received []http.Header, aURL, bURL string) {
	t.Helper()
	release := make(chan struct{})
	defer close(release)
	arrived := make(chan struct{})
	a := startUpstream(t, "A", func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		heldUntil(release)(w, r)
	})
	b := startUpstream(t, "B", func(w http.ResponseWriter, r *http.Request) {
		<-arrived
		streams("from-B")(w, r)
	})
	serve(t, newHedger(t, tracer, 5*time.Millisecond, a, b), r, "from-B")
	return []http.Header{a.next(t), b.next(t)}, a.URL, b.URL
}

// retried runs a request whose primary fails 503, so a retry on B wins at
// once (the hedge delay is far off).
func retried(t *testing.T, tracer core.Tracer, r *http.Request) []http.Header {
	t.Helper()
	a := startUpstream(t, "A", fails)
	b := startUpstream(t, "B", streams("from-B"))
	serve(t, newHedger(t, tracer, time.Hour, a, b), r, "from-B")
	return []http.Header{a.next(t), b.next(t)}
}

func checkHedgedSpans(t *testing.T, tr tree, a, b string) {
	t.Helper()
	checkAttrs(t, "request span", tr.request, map[string]any{
		"llmhedge.route": "traced", "llmhedge.outcome": "ok", "llmhedge.status": 200, "llmhedge.hedged": true,
		"llmhedge.attempts": 2, "llmhedge.hedges_started": 1, "llmhedge.winner_attempt": 1,
		"llmhedge.winner_upstream": "B", "llmhedge.winner_role": core.RoleHedge, "llmhedge.delay_ms": 5.0,
		"gen_ai.request.model": "m",
	})
	checkAttrs(t, "attempt 0", tr.attempts[0], map[string]any{
		"llmhedge.attempt.upstream": "A", "llmhedge.attempt.role": core.RolePrimary,
		"llmhedge.attempt.result": core.ResultLost, "gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
		"server.address": "127.0.0.1", "server.port": port(t, a), "error.type": nil, "gen_ai.provider.name": nil,
	})
	checkAttrs(t, "attempt 1", tr.attempts[1], map[string]any{
		"llmhedge.attempt.upstream": "B", "llmhedge.attempt.role": core.RoleHedge,
		"llmhedge.attempt.result": core.ResultWon, "http.response.status_code": 200,
		"server.address": "127.0.0.1", "server.port": port(t, b), "error.type": nil,
	})
	for i, s := range append([]sdktrace.ReadOnlySpan{tr.request}, tr.attempts...) {
		if s.Status().Code != codes.Unset {
			t.Errorf("span %d (%s) status %v %q, want unset: nothing failed (losing is not failing)", i, s.Name(), s.Status().Code, s.Status().Description)
		}
	}
}

func checkRetriedSpans(t *testing.T, tr tree) {
	t.Helper()
	checkAttrs(t, "request span", tr.request, map[string]any{
		"llmhedge.outcome": "ok", "llmhedge.attempts": 2, "llmhedge.hedges_started": 1, // attempts beyond the first
		"llmhedge.winner_attempt": 1, "llmhedge.winner_upstream": "B", "llmhedge.winner_role": core.RoleRetry,
	})
	checkAttrs(t, "attempt 0", tr.attempts[0], map[string]any{
		"llmhedge.attempt.upstream": "A", "llmhedge.attempt.role": core.RolePrimary,
		"llmhedge.attempt.result": core.ResultFailed, "llmhedge.attempt.error_type": "503",
		"http.response.status_code": 503, "error.type": "503",
	})
	checkAttrs(t, "attempt 1", tr.attempts[1], map[string]any{
		"llmhedge.attempt.upstream": "B", "llmhedge.attempt.role": core.RoleRetry,
		"llmhedge.attempt.result": core.ResultWon, "http.response.status_code": 200, "error.type": nil,
	})
	if st := tr.attempts[0].Status(); st.Code != codes.Error || st.Description == "" {
		t.Errorf("failed attempt's status %v %q, want Error with a reason", st.Code, st.Description)
	}
	for _, s := range []sdktrace.ReadOnlySpan{tr.request, tr.attempts[1]} {
		if s.Status().Code != codes.Unset {
			t.Errorf("%s span %s status %v %q, want unset: only the failed attempt failed", s.Name(), s.SpanContext().SpanID(), s.Status().Code, s.Status().Description)
		}
	}
}

func port(t *testing.T, rawURL string) int {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// withParent starts a recording span of tp, as Caddy's tracing handler
// does, and returns the context carrying it. The client's traceparent
// stays in the request's headers: FromContext must not read it.
func withParent(t *testing.T, tp trace.TracerProvider) (context.Context, trace.Span) {
	ctx, span := tp.Tracer("proxy").Start(context.Background(), "proxy request", trace.WithSpanKind(trace.SpanKindServer))
	t.Cleanup(func() { span.End() })
	return ctx, span
}

func TestFromContextHedged(t *testing.T) {
	tp, rec := newProvider(t)
	ctx, parent := withParent(t, tp)
	r := chatRequest(ctx)
	r.Header.Set("Traceparent", clientTraceparent)
	received, a, b := hedged(t, oteltrace.FromContext(), r)
	tr := spanTree(t, rec, 2)
	checkTree(t, tr, parent.SpanContext(), received, "")
	checkHedgedSpans(t, tr, a, b)
}

func TestFromContextRetryAfterFailure(t *testing.T) {
	tp, rec := newProvider(t)
	ctx, parent := withParent(t, tp)
	received := retried(t, oteltrace.FromContext(), chatRequest(ctx))
	tr := spanTree(t, rec, 2)
	checkTree(t, tr, parent.SpanContext(), received, "")
	checkRetriedSpans(t, tr)
}

func TestNewParentsOnTheTraceparentHeader(t *testing.T) {
	tp, rec := newProvider(t)
	r := chatRequest(context.Background())
	r.Header.Set("Traceparent", clientTraceparent)
	r.Header.Set("Tracestate", clientTracestate)
	received := retried(t, oteltrace.New(tp), r)
	tr := spanTree(t, rec, 2)
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: mustTraceID(t, clientTraceID), SpanID: mustSpanID(t, clientParentID)})
	checkTree(t, tr, parent, received, clientTracestate)
	if !tr.request.Parent().IsRemote() {
		t.Error("request span's parent is not remote, want the client's traceparent")
	}
	checkRetriedSpans(t, tr)
}

func TestNewHedged(t *testing.T) {
	tp, rec := newProvider(t)
	r := chatRequest(context.Background())
	r.Header.Set("Traceparent", clientTraceparent)
	received, a, b := hedged(t, oteltrace.New(tp), r)
	tr := spanTree(t, rec, 2)
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: mustTraceID(t, clientTraceID), SpanID: mustSpanID(t, clientParentID)})
	checkTree(t, tr, parent, received, "")
	checkHedgedSpans(t, tr, a, b)
}

// Without a traceparent New starts a new trace: the request span is a root.
func TestNewWithoutTraceparentStartsATrace(t *testing.T) {
	tp, rec := newProvider(t)
	received := retried(t, oteltrace.New(tp), chatRequest(context.Background()))
	tr := spanTree(t, rec, 2)
	if tr.request.Parent().IsValid() {
		t.Errorf("request span has parent %s, want a root span", tr.request.Parent().SpanID())
	}
	checkTree(t, tr, trace.NewSpanContext(trace.SpanContextConfig{TraceID: tr.request.SpanContext().TraceID()}), received, "")
}

// Requests the tracer does not record cost no span and keep the client's
// trace headers on every attempt.
func TestUnrecordedRequestsKeepTheClientsTraceHeaders(t *testing.T) {
	notSampled := "00-" + clientTraceID + "-" + clientParentID + "-00"
	cases := []struct {
		name      string
		header    string
		tracer    func(tp trace.TracerProvider) core.Tracer
		ctx       func(tp trace.TracerProvider) context.Context
		providers []sdktrace.TracerProviderOption
	}{
		{name: "FromContext, no span in the context", header: clientTraceparent,
			tracer: func(trace.TracerProvider) core.Tracer { return oteltrace.FromContext() },
			ctx:    func(trace.TracerProvider) context.Context { return context.Background() }},
		{name: "FromContext, a remote span context only", header: clientTraceparent,
			tracer: func(trace.TracerProvider) core.Tracer { return oteltrace.FromContext() },
			ctx: func(trace.TracerProvider) context.Context {
				return trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
					TraceID: mustTraceID(t, clientTraceID), SpanID: mustSpanID(t, clientParentID), TraceFlags: trace.FlagsSampled, Remote: true}))
			}},
		{name: "FromContext, the proxy's span not sampled", header: clientTraceparent,
			providers: []sdktrace.TracerProviderOption{sdktrace.WithSampler(sdktrace.NeverSample())},
			tracer:    func(trace.TracerProvider) core.Tracer { return oteltrace.FromContext() },
			ctx: func(tp trace.TracerProvider) context.Context {
				ctx, _ := tp.Tracer("proxy").Start(context.Background(), "proxy request")
				return ctx
			}},
		{name: "New, the client's traceparent not sampled", header: notSampled,
			tracer: func(tp trace.TracerProvider) core.Tracer { return oteltrace.New(tp) },
			ctx:    func(trace.TracerProvider) context.Context { return context.Background() }},
		{name: "New, a sampler that records nothing", header: clientTraceparent,
			providers: []sdktrace.TracerProviderOption{sdktrace.WithSampler(sdktrace.NeverSample())},
			tracer:    func(tp trace.TracerProvider) core.Tracer { return oteltrace.New(tp) },
			ctx:       func(trace.TracerProvider) context.Context { return context.Background() }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tp, rec := newProvider(t, c.providers...)
			r := chatRequest(c.ctx(tp))
			r.Header.Set("Traceparent", c.header)
			r.Header.Set("Tracestate", clientTracestate)
			received := retried(t, c.tracer(tp), r)
			for i, h := range received {
				if got := h.Get("Traceparent"); got != c.header {
					t.Errorf("attempt %d sent traceparent %q, want the client's %q unchanged", i, got, c.header)
				}
				if got := h.Get("Tracestate"); got != clientTracestate {
					t.Errorf("attempt %d sent tracestate %q, want the client's %q", i, got, clientTracestate)
				}
			}
			for _, s := range rec.Ended() {
				if s.Name() == core.SpanRequest || s.Name() == core.SpanAttempt {
					t.Errorf("span %q recorded, want none", s.Name())
				}
			}
			for _, s := range rec.Started() {
				if s.Name() == core.SpanAttempt {
					t.Errorf("span %q started, want none", s.Name())
				}
			}
		})
	}
}

// An idempotency key's hash goes on the request span, never the key; the
// replay says so.
func TestReplayedKeySpan(t *testing.T) {
	tp, rec := newProvider(t)
	a := startUpstream(t, "A", streams("from-A"))
	b := startUpstream(t, "B", streams("from-B"))
	h := newHedger(t, oteltrace.New(tp), time.Hour, a, b)
	for i := 0; i < 2; i++ {
		r := chatRequest(context.Background())
		r.Header.Set("Idempotency-Key", "secret-key-7")
		serve(t, h, r, "from-A")
	}
	var requests []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case core.SpanRequest:
			requests = append(requests, s)
		case core.SpanAttempt:
			if got := attrs(s)["llmhedge.attempt.upstream"].AsString(); got != "A" {
				t.Errorf("attempt on %q, want one on A only", got)
			}
		}
	}
	if len(requests) != 2 {
		t.Fatalf("%d request spans, want 2", len(requests))
	}
	checkAttrs(t, "first request", requests[0], map[string]any{"llmhedge.idempotency": core.IdempotencyLed,
		"llmhedge.idempotency_key_hash": core.KeyHash("secret-key-7"), "llmhedge.attempts": 1})
	checkAttrs(t, "replay", requests[1], map[string]any{"llmhedge.idempotency": core.IdempotencyReplayed,
		"llmhedge.outcome": core.OutcomeReplayed, "llmhedge.idempotency_key_hash": core.KeyHash("secret-key-7")})
	if n := len(a.received) + len(b.received); n != 1 {
		t.Errorf("%d upstream requests, want 1 (the second replayed)", n)
	}
	for _, s := range requests {
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), "secret-key-7") {
				t.Errorf("attribute %s carries the idempotency key", kv.Key)
			}
		}
	}
}

func mustTraceID(t *testing.T, s string) trace.TraceID {
	id, err := trace.TraceIDFromHex(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func mustSpanID(t *testing.T, s string) trace.SpanID {
	id, err := trace.SpanIDFromHex(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// Untraced requests (no recording span in the context) cost FromContext a
// context lookup and no allocation: tracing off costs nothing measurable.
func TestFromContextUntracedAllocatesNothing(t *testing.T) {
	tracer := oteltrace.FromContext()
	r := chatRequest(context.Background())
	start := time.Now()
	if n := testing.AllocsPerRun(100, func() {
		if tracer.Start(r, start) != nil {
			t.Fatal("Start traced a request without a span in its context")
		}
	}); n != 0 {
		t.Errorf("Start of an untraced request allocates %v times, want 0", n)
	}
}

func BenchmarkFromContextUntraced(b *testing.B) {
	tracer := oteltrace.FromContext()
	r := chatRequest(context.Background())
	start := time.Now()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if tracer.Start(r, start) != nil {
			b.Fatal("traced")
		}
	}
}

// BenchmarkTracedRequest prices one traced request's spans (the request's
// and two attempts', ended with a report) with the SDK and a discarding
// processor: what tracing on adds to the engine's own work per request.
func BenchmarkTracedRequest(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(discard{}))
	defer tp.Shutdown(context.Background())
	ctx, parent := tp.Tracer("proxy").Start(context.Background(), "proxy request")
	defer parent.End()
	tracer := oteltrace.FromContext()
	r := chatRequest(ctx)
	start := time.Now()
	rep := &core.Report{Request: r, Route: "bench", Outcome: core.OutcomeOK, Status: 200, Start: start, Total: 60 * time.Millisecond, Winner: 1,
		Model: "m", Attempts: []core.AttemptReport{
			{Index: 0, Upstream: "A", Role: core.RolePrimary, Result: core.ResultLost, Status: 200, Ended: 55 * time.Millisecond, ServerAddress: "a.test", ServerPort: 443},
			{Index: 1, Upstream: "B", Role: core.RoleHedge, Result: core.ResultWon, Status: 200, Started: 50 * time.Millisecond, Ended: 60 * time.Millisecond, ServerAddress: "api.openai.com", ServerPort: 443, Provider: "openai"},
		}}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		tr := tracer.Start(r, start)
		tr.Attempt(0, start)
		tr.Attempt(1, start.Add(50*time.Millisecond))
		tr.End(rep)
	}
}

// discard is a span processor that drops every span.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }
