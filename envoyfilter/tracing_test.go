package envoyfilter_test

import (
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/envoyfilter"
)

// envoyParent is the span id of the traceparent the tests' requests carry:
// the span of the proxy in front.
const envoyParent = "00f067aa0ba902b7"

// traceScenario is one request whose spans the tracing tests check, run
// through a rig with a trace id of its own.
type traceScenario struct {
	name string
	// run sends the request(s) and returns what the spans of the one
	// checked (the last) must say, and the upstream calls it made.
	run func(t *testing.T, rig *traceRig, traceID string) (treeWant, []upstreamCall)
}

// traceScenarios: (a) a hedge wins over a held primary, (b) a primary
// fails with 503 and a retry wins, (c) a replayed idempotency key, (d) a
// validated answer after an invalid one.
var traceScenarios = []traceScenario{
	{"hedge", func(t *testing.T, rig *traceRig, traceID string) (treeWant, []upstreamCall) {
		body := rig.send(traceRequest{route: "hedge", script: "A=" + actHold + ";B=" + actAnswer,
			traceparent: traceparentOf(traceID, envoyParent), tracestate: "vendor=client"})
		if !strings.Contains(body, "Hello from B") {
			t.Fatalf("answer %q, want B's", body)
		}
		calls := rig.takeCalls(2)
		if calls[0].upstream != "A" {
			// The hedge's call arrived first: the primary's took longer
			// than the hedge's 50ms delay to reach its upstream.
			calls[0], calls[1] = calls[1], calls[0]
		}
		waitClosed(t, calls[0].cancelled, "the held primary's cancellation")
		rig.report()
		for _, c := range calls {
			if c.tracestate != "vendor=client" {
				t.Errorf("upstream %s got tracestate %q, want the client's kept", c.upstream, c.tracestate)
			}
		}
		return treeWant{traceID: traceID, parentID: envoyParent,
			attempts: []attemptWant{{"A", core.RolePrimary, core.ResultLost, ""}, {"B", core.RoleHedge, core.ResultWon, ""}},
			attrs: map[string]any{"llmhedge.route": "hedge", "llmhedge.outcome": core.OutcomeOK, "llmhedge.hedged": true,
				"llmhedge.winner_attempt": 1, "llmhedge.winner_upstream": "B", "llmhedge.winner_role": core.RoleHedge,
				"llmhedge.status": 200, "gen_ai.request.model": "m"}}, calls
	}},
	{"retry", func(t *testing.T, rig *traceRig, traceID string) (treeWant, []upstreamCall) {
		body := rig.send(traceRequest{route: "retry", script: "A=" + act503 + ";B=" + actAnswer,
			traceparent: traceparentOf(traceID, envoyParent)})
		if !strings.Contains(body, "Hello from B") {
			t.Fatalf("answer %q, want B's", body)
		}
		calls := rig.takeCalls(2)
		rig.report()
		return treeWant{traceID: traceID, parentID: envoyParent,
			attempts: []attemptWant{{"A", core.RolePrimary, core.ResultFailed, "503"}, {"B", core.RoleRetry, core.ResultWon, ""}},
			attrs: map[string]any{"llmhedge.route": "retry", "llmhedge.outcome": core.OutcomeOK, "llmhedge.winner_attempt": 1,
				"llmhedge.winner_role": core.RoleRetry}}, calls
	}},
	{"replayed", func(t *testing.T, rig *traceRig, traceID string) (treeWant, []upstreamCall) {
		const key = "trace-key-secret-1"
		first := rig.send(traceRequest{route: "replay", script: "A=" + actAnswer, idempotencyKey: key + traceID})
		rig.takeCalls(1)
		rig.report()
		second := rig.send(traceRequest{route: "replay", script: "A=" + actAnswer, idempotencyKey: key + traceID,
			traceparent: traceparentOf(traceID, envoyParent)})
		if second != first {
			t.Fatalf("replayed answer %q, want the first answer %q", second, first)
		}
		rig.report()
		rig.noMoreCalls()
		return treeWant{traceID: traceID, parentID: envoyParent,
			attrs: map[string]any{"llmhedge.route": "replay", "llmhedge.outcome": core.OutcomeReplayed, "llmhedge.idempotency": core.IdempotencyReplayed,
				"llmhedge.idempotency_key_hash": core.KeyHash(key + traceID)}}, nil
	}},
	{"validated", func(t *testing.T, rig *traceRig, traceID string) (treeWant, []upstreamCall) {
		body := rig.send(traceRequest{route: "validated", script: "A=" + actAnswer + ";B=" + actAnswerJSON,
			traceparent: traceparentOf(traceID, envoyParent)})
		if !strings.Contains(body, `{\"from\":\"B\"}`) {
			t.Fatalf("answer %q, want B's JSON", body)
		}
		calls := rig.takeCalls(2)
		rig.report()
		return treeWant{traceID: traceID, parentID: envoyParent,
			attempts: []attemptWant{{"A", core.RolePrimary, core.ResultInvalid, "upstream_bad_response"}, {"B", core.RoleRetry, core.ResultWon, ""}},
			attrs: map[string]any{"llmhedge.route": "validated", "llmhedge.outcome": core.OutcomeOK,
				"llmhedge.validation": core.ValidationPassed, "llmhedge.winner_upstream": "B"}}, calls
	}},
}

// scenarioTraceID is scenario i's trace id in a run named by prefix (two
// hex digits).
func scenarioTraceID(prefix string, i int) string {
	return "4bf92f3577b34da6a3ce929d0e0e" + prefix + "0" + string(rune('0'+i))
}

// With a TracerProvider injected (the SDK, spans kept in memory), each
// scenario's spans form the tree checkTree describes, under the
// traceparent of the request headers.
func TestTraceSpansInMemory(t *testing.T) {
	rec, tp := newRecorder()
	rig := newTraceRig(t, "", envoyfilter.Options{TracerProvider: tp})
	for i, sc := range traceScenarios {
		t.Run(sc.name, func(t *testing.T) {
			traceID := scenarioTraceID("aa", i)
			want, calls := sc.run(t, rig, traceID)
			_, spans := rec.spans(t, traceID)
			req := checkTree(t, spans, want, calls)
			for k, v := range req.attrs {
				if s, ok := v.(string); ok && strings.Contains(s, "trace-key-secret") {
					t.Errorf("attribute %s carries the idempotency key itself", k)
				}
			}
		})
	}
}

// Envoy puts the context of its ext_proc span in the stream's gRPC
// metadata, not in the request headers (those are the client's): the
// request span is a child of the metadata's span, and the upstreams get
// the attempts' contexts, not the client's. Without metadata the request
// headers' context is the parent; with neither, the span starts a trace.
func TestTraceParentFromEnvoyMetadata(t *testing.T) {
	rec, tp := newRecorder()
	rig := newTraceRig(t, "", envoyfilter.Options{TracerProvider: tp})
	const (
		traceID    = "0af7651916cd43dd8448eb211c80319c"
		client     = "b7ad6b7169203331"
		extprocRPC = "53995c3f42cd8ad8"
	)
	rig.send(traceRequest{route: "retry", script: "A=" + actAnswer, traceparent: traceparentOf(traceID, client),
		grpcTraceparent: traceparentOf(traceID, extprocRPC)})
	calls := rig.takeCalls(1)
	rig.report()
	_, spans := rec.spans(t, traceID)
	checkTree(t, spans, treeWant{traceID: traceID, parentID: extprocRPC,
		attempts: []attemptWant{{"A", core.RolePrimary, core.ResultWon, ""}}}, calls)

	// Metadata without a valid traceparent: the request headers' context.
	rig.send(traceRequest{route: "retry", script: "A=" + actAnswer, traceparent: traceparentOf(traceID, client),
		grpcTraceparent: "00-garbage"})
	calls = rig.takeCalls(1)
	rig.report()
	sc, spans := rec.spans(t, traceID)
	var last []spanView
	for _, s := range spans {
		if s.spanID == sc.SpanID().String() || s.parentID == sc.SpanID().String() {
			last = append(last, s)
		}
	}
	checkTree(t, last, treeWant{traceID: traceID, parentID: client,
		attempts: []attemptWant{{"A", core.RolePrimary, core.ResultWon, ""}}}, calls)

	// Neither: a new trace, whose attempt's context the upstream gets.
	rig.send(traceRequest{route: "retry", script: "A=" + actAnswer})
	calls = rig.takeCalls(1)
	rig.report()
	sc, spans = rec.spans(t, "")
	last = last[:0]
	for _, s := range spans {
		if s.traceID == sc.TraceID().String() {
			last = append(last, s)
		}
	}
	checkTree(t, last, treeWant{traceID: sc.TraceID().String(), parentID: "",
		attempts: []attemptWant{{"A", core.RolePrimary, core.ResultWon, ""}}}, calls)
}

// An unsampled parent is honoured (parent-based sampling): no span, and
// the upstream gets the client's traceparent unchanged, as without tracing.
func TestTraceUnsampledParentIsHonoured(t *testing.T) {
	rec, tp := newRecorder()
	rig := newTraceRig(t, "", envoyfilter.Options{TracerProvider: tp})
	unsampled := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
	rig.send(traceRequest{route: "retry", script: "A=" + actAnswer, traceparent: unsampled})
	calls := rig.takeCalls(1)
	rig.report()
	if calls[0].traceparent != unsampled {
		t.Errorf("upstream got traceparent %q, want the client's %q", calls[0].traceparent, unsampled)
	}
	if n := len(rec.Ended()); n != 0 {
		t.Errorf("%d spans recorded for an unsampled parent, want 0", n)
	}
}

// Tracing off (the default): no tracer, and the client's trace headers go
// to the upstream unchanged.
func TestTracingOffKeepsTheClientsHeaders(t *testing.T) {
	rig := newTraceRig(t, "", envoyfilter.Options{})
	parent := traceparentOf("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
	rig.send(traceRequest{route: "retry", script: "A=" + actAnswer, traceparent: parent, tracestate: "vendor=client",
		grpcTraceparent: traceparentOf("0af7651916cd43dd8448eb211c80319c", "53995c3f42cd8ad8")})
	calls := rig.takeCalls(1)
	if calls[0].traceparent != parent || calls[0].tracestate != "vendor=client" {
		t.Errorf("upstream got traceparent %q tracestate %q, want the client's %q %q", calls[0].traceparent, calls[0].tracestate,
			parent, "vendor=client")
	}
}

// The tracing section: off by default, its errors named.
func TestTracingConfig(t *testing.T) {
	cfg, err := envoyfilter.ParseConfig([]byte("routes: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tracing.On() {
		t.Fatal("tracing is on by default, want off")
	}
	if *cfg.Tracing.SampleRatio != 1 || cfg.Tracing.Timeout.String() != "10s" {
		t.Fatalf("defaults: sample_ratio %v timeout %v, want 1 and 10s", *cfg.Tracing.SampleRatio, cfg.Tracing.Timeout)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	if cfg, _ := envoyfilter.ParseConfig([]byte("routes: []\n")); cfg.Tracing.On() {
		t.Fatal("OTEL_EXPORTER_OTLP_ENDPOINT alone turned tracing on, want off")
	}
	for _, c := range []struct{ yaml, want string }{
		{`tracing: {endpoint: "127.0.0.1:4318"}`, `tracing.endpoint: want http://host:port`},
		{`tracing: {endpoint: "http://127.0.0.1:4317/x", protocol: grpc}`, "an OTLP/gRPC endpoint has none"},
		{`tracing: {endpoint: "http://user:s3cr3t-pw@collector:4318"}`, "put them in tracing.headers"},
		{`tracing: {endpoint: "http://c:4318", protocol: thrift}`, `tracing.protocol "thrift": want http/protobuf or grpc`},
		{`tracing: {endpoint: "http://c:4318", sample_ratio: 1.5}`, "tracing.sample_ratio 1.5: want 0..1"},
		{`tracing: {endpoint: "http://c:4318", timeout: -1s}`, "tracing.timeout must be positive"},
		{`tracing: {endpoint: "http://c:4318", headers: {"bad name": x}}`, `name "bad name" is not a valid header name`},
		{`tracing: {endpoint: "http://c:4318", headers: {x-api-key: "${LLMHEDGE_UNSET_TRACE_KEY}"}}`,
			"tracing.headers x-api-key: environment variable LLMHEDGE_UNSET_TRACE_KEY is not set"},
		{`tracing: {service_name: svc}`, "tracing: settings without tracing.endpoint or tracing.enabled: true"},
	} {
		_, err := envoyfilter.ParseConfig([]byte(c.yaml + "\nroutes: []\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one with %q", c.yaml, err, c.want)
		} else if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: error %q repeats the endpoint's password", c.yaml, err)
		}
	}
	t.Setenv("LLMHEDGE_TRACE_KEY", "secret-otlp-key")
	cfg, err = envoyfilter.ParseConfig([]byte(`tracing: {enabled: true, headers: {x-api-key: "${LLMHEDGE_TRACE_KEY}"}}` + "\nroutes: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Tracing.On() {
		t.Fatal("enabled: true without an endpoint: tracing off, want on (the endpoint from the environment)")
	}
	off, err := envoyfilter.ParseConfig([]byte(`tracing: {enabled: false, endpoint: "http://c:4318"}` + "\nroutes: []\n"))
	if err != nil || off.Tracing.On() {
		t.Fatalf("enabled: false with an endpoint: on %v, err %v; want off", off.Tracing.On(), err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, err := envoyfilter.ParseConfig([]byte(`tracing: {endpoint: "http://c:4318"}` + "\nroutes: []\n")); err == nil ||
		!strings.Contains(err.Error(), "from OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=http/json: error %v, want one naming the variable", err)
	}
}
