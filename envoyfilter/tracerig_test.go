package envoyfilter_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
)

// The tracing tests' rig: an ext_proc server behind the Envoy driver with
// three routes over two scripted upstreams, A and B, that record the trace
// headers of every request they get and do what the request's
// X-Trace-Test header tells them ("A=hold;B=answer").

// headerScript tells each upstream what to do with a request.
const headerScript = "X-Trace-Test"

// Upstream actions of headerScript.
const (
	actAnswer     = "answer"      // stream an answer at once
	actAnswerJSON = "answer_json" // stream an answer whose content is JSON
	actHold       = "hold"        // answer nothing until the request is cancelled
	act503        = "503"         // fail with 503 at once
)

// traceRoutes: "hedge" hedges after 50ms; the others never hedge (a 10s
// delay), so a second attempt is a retry; "validated" holds answers to the
// json check. One route per scenario: a failure's cool-down on one route
// does not move another's primary.
const traceRoutes = `
  - name: hedge
    match: {headers: [{name: x-route, value: hedge}]}
    upstreams: [{name: A, url: "{A}"}, {name: B, url: "{B}"}]
    delay: 50ms
  - name: retry
    match: {headers: [{name: x-route, value: retry}]}
    upstreams: [{name: A, url: "{A}"}, {name: B, url: "{B}"}]
    delay: 10s
  - name: replay
    match: {headers: [{name: x-route, value: replay}]}
    upstreams: [{name: A, url: "{A}"}, {name: B, url: "{B}"}]
    delay: 10s
  - name: validated
    match: {headers: [{name: x-route, value: validated}]}
    upstreams: [{name: A, url: "{A}"}, {name: B, url: "{B}"}]
    delay: 10s
    validate: [json]
`

// upstreamCall is one request an upstream received.
type upstreamCall struct {
	upstream    string
	traceparent string
	tracestate  string
	// cancelled is closed when a held request is cancelled.
	cancelled chan struct{}
}

// scriptedUpstream is one upstream of the rig.
type scriptedUpstream struct {
	name  string
	srv   *httptest.Server
	calls chan upstreamCall
}

func startScriptedUpstream(name string, calls chan upstreamCall) *scriptedUpstream {
	u := &scriptedUpstream{name: name, calls: calls}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	return u
}

func (u *scriptedUpstream) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	call := upstreamCall{upstream: u.name, traceparent: r.Header.Get("Traceparent"), tracestate: r.Header.Get("Tracestate"),
		cancelled: make(chan struct{})}
	u.calls <- call
	switch action := scriptFor(r.Header.Get(headerScript), u.name); action {
	case actHold:
		<-r.Context().Done()
		close(call.cancelled)
	case act503:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"overloaded","type":"server_error"}}`)
	case actAnswer, actAnswerJSON:
		content := "Hello from " + u.name
		if action == actAnswerJSON {
			content = `{"from":"` + u.name + `"}`
		}
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := func(delta, finish string) string {
			return fmt.Sprintf(`data: {"id":"c-%s","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":"%s","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n",
				u.name, u.name, delta, finish)
		}
		io.WriteString(w, chunk(`{"role":"assistant","content":""}`, "null")+
			chunk(fmt.Sprintf(`{"content":%q}`, content), "null")+chunk(`{}`, `"stop"`)+"data: [DONE]\n\n")
	default:
		http.Error(w, "no script for "+u.name, http.StatusTeapot)
	}
}

// scriptFor is upstream name's action in script "A=hold;B=answer".
func scriptFor(script, name string) string {
	for _, part := range strings.Split(script, ";") {
		if k, v, ok := strings.Cut(part, "="); ok && k == name {
			return v
		}
	}
	return ""
}

// metadataConn is the driver's gRPC connection, with the initial
// metadata Envoy adds when its tracing is on: the traceparent of its
// ext_proc span, queued by the test before each request.
type metadataConn struct {
	grpc.ClientConnInterface
	next chan metadata.MD
}

func (c *metadataConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	select {
	case md := <-c.next:
		ctx = metadata.NewOutgoingContext(ctx, md)
	default:
	}
	return c.ClientConnInterface.NewStream(ctx, desc, method, opts...)
}

// traceRig is the server, its upstreams and the driver.
type traceRig struct {
	t        *testing.T
	A, B     *scriptedUpstream
	calls    chan upstreamCall
	srv      *envoyfilter.Server
	front    *httptest.Server
	metadata chan metadata.MD
	reports  chan *core.Report
}

// newTraceRig starts the rig; head is the YAML before the routes (the
// tracing section), opts the server's options.
func newTraceRig(t *testing.T, head string, opts envoyfilter.Options) *traceRig {
	t.Helper()
	rig := &traceRig{t: t, calls: make(chan upstreamCall, 16), metadata: make(chan metadata.MD, 1), reports: make(chan *core.Report, 16)}
	rig.A = startScriptedUpstream("A", rig.calls)
	rig.B = startScriptedUpstream("B", rig.calls)
	cfg := rig.config(head)
	var err error
	opts.Observer = core.ObserverFunc(func(r *core.Report) { rig.reports <- r })
	rig.srv, err = envoyfilter.NewServer(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	gs, conn := serveGRPC(t, rig.srv)
	driver := envoydriver.New(&metadataConn{ClientConnInterface: conn, next: rig.metadata}, envoydriver.Config{})
	rig.front = httptest.NewServer(driver)
	t.Cleanup(func() {
		rig.front.CloseClientConnections()
		rig.front.Close()
		driver.Close()
		conn.Close()
		gs.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rig.srv.Close(ctx)
		cancel()
		rig.A.srv.Close()
		rig.B.srv.Close()
	})
	return rig
}

// config is the rig's configuration with head (the tracing section)
// before its routes.
func (rig *traceRig) config(head string) *envoyfilter.FileConfig {
	rig.t.Helper()
	routes := strings.NewReplacer("{A}", rig.A.srv.URL, "{B}", rig.B.srv.URL).Replace(traceRoutes)
	cfg, err := envoyfilter.ParseConfig([]byte("metrics: {listen: \"off\"}\nlog: {requests: false}\n" + head + "\nroutes:" + routes))
	if err != nil {
		rig.t.Fatalf("config: %v", err)
	}
	return cfg
}

// traceRequest is one request of a scenario.
type traceRequest struct {
	route  string // x-route
	script string // X-Trace-Test
	// traceparent and tracestate are the request headers' (the client's
	// context); grpcTraceparent, if set, goes in the stream's metadata (the
	// context of Envoy's ext_proc span).
	traceparent, tracestate string
	grpcTraceparent         string
	idempotencyKey          string
}

// send runs req through the driver and returns the answer's body; the
// answer must be a 200.
func (rig *traceRig) send(req traceRequest) string {
	rig.t.Helper()
	if req.grpcTraceparent != "" {
		rig.metadata <- metadata.Pairs("traceparent", req.grpcTraceparent)
	}
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	r, _ := http.NewRequest(http.MethodPost, rig.front.URL+"/v1/chat/completions", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer sk-trace-test")
	r.Header.Set("X-Route", req.route)
	r.Header.Set(headerScript, req.script)
	if req.traceparent != "" {
		r.Header.Set("Traceparent", req.traceparent)
	}
	if req.tracestate != "" {
		r.Header.Set("Tracestate", req.tracestate)
	}
	if req.idempotencyKey != "" {
		r.Header.Set("Idempotency-Key", req.idempotencyKey)
	}
	resp, err := rig.front.Client().Do(r)
	if err != nil {
		rig.t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		rig.t.Fatalf("reading the answer: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		rig.t.Fatalf("status %d, want 200: %s", resp.StatusCode, got)
	}
	return string(got)
}

// takeCalls returns the next n upstream calls, in arrival order.
func (rig *traceRig) takeCalls(n int) []upstreamCall {
	rig.t.Helper()
	out := make([]upstreamCall, 0, n)
	for len(out) < n {
		select {
		case c := <-rig.calls:
			out = append(out, c)
		case <-time.After(10 * time.Second):
			rig.t.Fatalf("%d upstream calls within 10s, want %d", len(out), n)
		}
	}
	return out
}

// noMoreCalls fails when an upstream got a call nobody expected.
func (rig *traceRig) noMoreCalls() {
	rig.t.Helper()
	select {
	case c := <-rig.calls:
		rig.t.Fatalf("unexpected call to upstream %s (traceparent %q)", c.upstream, c.traceparent)
	default:
	}
}

// report waits for the next request report.
func (rig *traceRig) report() *core.Report {
	rig.t.Helper()
	select {
	case r := <-rig.reports:
		return r
	case <-time.After(10 * time.Second):
		rig.t.Fatal("no report within 10s")
		return nil
	}
}

// waitClosed waits until ch is closed.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
	}
}

// traceparentOf builds a sampled W3C traceparent.
func traceparentOf(traceID, spanID string) string { return "00-" + traceID + "-" + spanID + "-01" }

// parseTraceparent splits a traceparent into its trace and parent ids.
func parseTraceparent(t *testing.T, v string) (traceID, parentID string) {
	t.Helper()
	parts := strings.Split(v, "-")
	if len(parts) != 4 || parts[0] != "00" || len(parts[1]) != 32 || len(parts[2]) != 16 {
		t.Fatalf("traceparent %q is not a W3C traceparent", v)
	}
	return parts[1], parts[2]
}

// spanView is a span as the checks read it, from the SDK's memory or
// from Jaeger's query API.
type spanView struct {
	traceID, spanID, parentID string
	name, kind                string // kind in lower case: internal, client, ...
	service                   string // "" from the SDK
	failed                    bool
	attrs                     map[string]any // string, int64, bool, float64 or []string
}

// viewOfSDK converts a span the SDK recorded.
func viewOfSDK(s sdktrace.ReadOnlySpan) spanView {
	v := spanView{traceID: s.SpanContext().TraceID().String(), spanID: s.SpanContext().SpanID().String(), name: s.Name(),
		kind: strings.ToLower(s.SpanKind().String()), failed: s.Status().Code == codes.Error, attrs: map[string]any{}}
	if s.Parent().IsValid() {
		v.parentID = s.Parent().SpanID().String()
	}
	for _, kv := range s.Attributes() {
		switch kv.Value.Type() {
		case attribute.STRING:
			v.attrs[string(kv.Key)] = kv.Value.AsString()
		case attribute.INT64:
			v.attrs[string(kv.Key)] = kv.Value.AsInt64()
		case attribute.BOOL:
			v.attrs[string(kv.Key)] = kv.Value.AsBool()
		case attribute.FLOAT64:
			v.attrs[string(kv.Key)] = kv.Value.AsFloat64()
		case attribute.STRINGSLICE:
			v.attrs[string(kv.Key)] = kv.Value.AsStringSlice()
		}
	}
	return v
}

// attemptWant is what one attempt's span must say.
type attemptWant struct {
	upstream, role, result string
	errorType              string // "": the span has no error.type and no error status
}

// treeWant is what a request's spans must say.
type treeWant struct {
	traceID, parentID string
	attempts          []attemptWant
	// attrs are attributes the request span must have, with these values.
	attrs map[string]any
	// failed: the request span has an error status.
	failed bool
}

// checkTree checks the spans of one request: one llm_hedge span, a child
// of parentID in trace traceID, with its attempts' spans as its children,
// each attempt's upstream call carrying a traceparent whose parent is that
// attempt's span, all different. It returns the request span.
func checkTree(t *testing.T, spans []spanView, want treeWant, calls []upstreamCall) spanView {
	t.Helper()
	var reqs, attempts []spanView
	for _, s := range spans {
		if s.traceID != want.traceID {
			continue
		}
		switch s.name {
		case core.SpanRequest:
			reqs = append(reqs, s)
		case core.SpanAttempt:
			attempts = append(attempts, s)
		}
	}
	if len(reqs) != 1 {
		t.Fatalf("trace %s has %d %s spans, want 1", want.traceID, len(reqs), core.SpanRequest)
	}
	req := reqs[0]
	if req.parentID != want.parentID {
		t.Errorf("%s's parent is %q, want the traceparent's span %q", core.SpanRequest, req.parentID, want.parentID)
	}
	if req.kind != "internal" {
		t.Errorf("%s's kind is %q, want internal", core.SpanRequest, req.kind)
	}
	if req.failed != want.failed {
		t.Errorf("%s failed = %v, want %v", core.SpanRequest, req.failed, want.failed)
	}
	for k, v := range want.attrs {
		if got, ok := req.attrs[k]; !ok || fmt.Sprint(got) != fmt.Sprint(v) {
			t.Errorf("%s attribute %s = %v, want %v", core.SpanRequest, k, got, v)
		}
	}
	if got := req.attrs["llmhedge.attempts"]; fmt.Sprint(got) != fmt.Sprint(len(want.attempts)) {
		t.Errorf("%s attribute llmhedge.attempts = %v, want %d", core.SpanRequest, got, len(want.attempts))
	}
	if len(attempts) != len(want.attempts) {
		t.Fatalf("trace %s has %d %s spans, want %d", want.traceID, len(attempts), core.SpanAttempt, len(want.attempts))
	}
	sort.Slice(attempts, func(i, j int) bool {
		return fmt.Sprint(attempts[i].attrs["llmhedge.attempt.index"]) < fmt.Sprint(attempts[j].attrs["llmhedge.attempt.index"])
	})
	byID := map[string]spanView{}
	for i, a := range attempts {
		w := want.attempts[i]
		byID[a.spanID] = a
		if a.parentID != req.spanID {
			t.Errorf("attempt %d's parent is %q, want %s's span %q", i, a.parentID, core.SpanRequest, req.spanID)
		}
		if a.kind != "client" {
			t.Errorf("attempt %d's kind is %q, want client", i, a.kind)
		}
		for k, v := range map[string]any{"llmhedge.attempt.index": int64(i), "llmhedge.attempt.upstream": w.upstream,
			"llmhedge.attempt.role": w.role, "llmhedge.attempt.result": w.result, "gen_ai.operation.name": "chat",
			"gen_ai.request.model": "m", "server.address": "127.0.0.1"} {
			if got := a.attrs[k]; fmt.Sprint(got) != fmt.Sprint(v) {
				t.Errorf("attempt %d attribute %s = %v, want %v", i, k, got, v)
			}
		}
		got, has := a.attrs["error.type"]
		switch {
		case w.errorType == "" && has:
			t.Errorf("attempt %d has error.type %v, want none", i, got)
		case w.errorType != "" && fmt.Sprint(got) != w.errorType:
			t.Errorf("attempt %d attribute error.type = %v, want %q", i, got, w.errorType)
		}
		if a.failed != (w.errorType != "") {
			t.Errorf("attempt %d's error status = %v, want %v", i, a.failed, w.errorType != "")
		}
	}
	if len(calls) != len(attempts) {
		t.Fatalf("%d upstream calls, want one per attempt (%d)", len(calls), len(attempts))
	}
	seen := map[string]bool{}
	for _, c := range calls {
		traceID, parentID := parseTraceparent(t, c.traceparent)
		if traceID != want.traceID {
			t.Errorf("upstream %s got trace %s, want %s", c.upstream, traceID, want.traceID)
		}
		if seen[parentID] {
			t.Errorf("upstream %s got traceparent %s, sent to another attempt too", c.upstream, c.traceparent)
		}
		seen[parentID] = true
		a, ok := byID[parentID]
		if !ok {
			t.Errorf("upstream %s got parent span %s, want one of the attempt spans", c.upstream, parentID)
			continue
		}
		if a.attrs["llmhedge.attempt.upstream"] != c.upstream {
			t.Errorf("upstream %s got the context of the attempt span to %v", c.upstream, a.attrs["llmhedge.attempt.upstream"])
		}
	}
	return req
}

// recorder keeps the spans the SDK ends and tells when a request span
// (the last of a request's spans to end) has ended.
type recorder struct {
	*tracetest.SpanRecorder
	requestEnded chan trace.SpanContext
}

func newRecorder() (*recorder, *sdktrace.TracerProvider) {
	r := &recorder{SpanRecorder: tracetest.NewSpanRecorder(), requestEnded: make(chan trace.SpanContext, 16)}
	return r, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r))
}

func (r *recorder) OnEnd(s sdktrace.ReadOnlySpan) {
	r.SpanRecorder.OnEnd(s)
	if s.Name() == core.SpanRequest {
		r.requestEnded <- s.SpanContext()
	}
}

// spans waits for the end of the request span of trace traceID (any
// trace's when ""), and returns it and every span ended so far.
func (r *recorder) spans(t *testing.T, traceID string) (trace.SpanContext, []spanView) {
	t.Helper()
	var sc trace.SpanContext
	for {
		select {
		case sc = <-r.requestEnded:
		case <-time.After(10 * time.Second):
			t.Fatalf("no request span of trace %q ended within 10s", traceID)
		}
		if traceID == "" || sc.TraceID().String() == traceID {
			break
		}
	}
	var out []spanView
	for _, s := range r.Ended() {
		out = append(out, viewOfSDK(s))
	}
	return sc, out
}
