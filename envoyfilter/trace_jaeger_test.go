package envoyfilter_test

import (
	"fmt"
	"testing"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/jaeger"
)

// viewOfJaeger converts a span read from Jaeger's query API.
func viewOfJaeger(s jaeger.Span) spanView {
	return spanView{traceID: s.TraceID, spanID: s.SpanID, parentID: s.ParentSpanID, name: s.OperationName, kind: s.Kind,
		service: s.Service, failed: s.Error, attrs: s.Tags}
}

// TestTracesInJaeger runs the scenarios through the server configured to
// export to a real Jaeger (built from its Go module, in-memory storage)
// over OTLP/HTTP and over OTLP/gRPC, each request with the traceparent of
// a known trace, and checks the span trees through Jaeger's query API:
// llm_hedge a child of the traceparent's span, the attempts its children
// with their role, result and upstream, error.type on the failed one,
// llmhedge.idempotency on the replayed key, llmhedge.validation on the
// validated answer, and each upstream's traceparent parented on its
// attempt's span. Skipped with -short (it builds Jaeger on a cold cache).
func TestTracesInJaeger(t *testing.T) {
	j := jaeger.Start(t)
	// The batch span processor exports every 50ms instead of 5s (the
	// standard variable, which the server leaves to the SDK).
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	for p, c := range []struct {
		name, tracing, service string
	}{
		{"http", fmt.Sprintf("tracing: {endpoint: %q}", j.OTLPHTTPEndpoint()), envoyfilter.DefaultTracingServiceName},
		{"grpc", fmt.Sprintf("tracing: {endpoint: %q, protocol: grpc, service_name: llmhedge-envoy-grpc, sample_ratio: 0.5}",
			"http://"+j.OTLPGRPCEndpoint()), "llmhedge-envoy-grpc"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rig := newTraceRig(t, c.tracing, envoyfilter.Options{})
			for i, sc := range traceScenarios {
				t.Run(sc.name, func(t *testing.T) {
					traceID := scenarioTraceID(fmt.Sprintf("%02x", 0xb0+p), i)
					want, calls := sc.run(t, rig, traceID)
					spans := j.Trace(t, traceID, 1+len(want.attempts))
					views := make([]spanView, 0, len(spans))
					for _, s := range spans {
						views = append(views, viewOfJaeger(s))
						if s.Service != c.service {
							t.Errorf("span %s of service %q, want %q", s.OperationName, s.Service, c.service)
						}
					}
					checkTree(t, views, want, calls)
				})
			}
			// What Envoy itself sends: its ext_proc span's context in the
			// stream's metadata, the client's in the headers.
			t.Run("envoy-metadata", func(t *testing.T) {
				traceID := scenarioTraceID(fmt.Sprintf("%02x", 0xb0+p), 9)
				const extprocRPC = "53995c3f42cd8ad8"
				rig.send(traceRequest{route: "retry", script: "A=" + actAnswer + ";B=" + actAnswer,
					traceparent: traceparentOf(traceID, envoyParent), grpcTraceparent: traceparentOf(traceID, extprocRPC)})
				calls := rig.takeCalls(1)
				rig.report()
				var views []spanView
				for _, s := range j.Trace(t, traceID, 2) {
					views = append(views, viewOfJaeger(s))
				}
				checkTree(t, views, treeWant{traceID: traceID, parentID: extprocRPC,
					attempts: []attemptWant{{calls[0].upstream, core.RolePrimary, core.ResultWon, ""}}}, calls)
			})
		})
	}
}
