package caddymodule

import (
	"context"
	"net/http/httptest"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

const testTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// Outside Caddy's tracing handler (no span in the request's context) the
// handler makes no span and the upstream gets the client's traceparent.
func TestServeHTTPUntracedKeepsTheClientsTraceparent(t *testing.T) {
	a, b := startSims(t)
	h, _ := provisionForTest(t, "", a, b)
	r, _ := caddyRequest("untraced-1", "")
	r.Header.Set("Traceparent", testTraceparent)
	r.Header.Set("Tracestate", "vendor=client")
	if err := h.ServeHTTP(httptest.NewRecorder(), r, forbiddenNext(t)); err != nil {
		t.Fatal(err)
	}
	reqs := a.Server.Requests()
	if len(reqs) != 1 {
		t.Fatalf("A received %d requests, want 1", len(reqs))
	}
	if got := reqs[0].Header.Get("Traceparent"); got != testTraceparent {
		t.Errorf("upstream received traceparent %q, want the client's %q", got, testTraceparent)
	}
	if got := reqs[0].Header.Get("Tracestate"); got != "vendor=client" {
		t.Errorf("upstream received tracestate %q, want the client's", got)
	}
}

// Under a recording span (what Caddy's tracing handler puts in the
// context) the request's span is its child, each attempt's span the
// request span's child, and each upstream gets its attempt's span as
// parent.
func TestServeHTTPTracedUnderTheContextsSpan(t *testing.T) {
	a, b := startSims(t)
	h, _ := provisionForTest(t, "", a, b)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })

	r, _ := caddyRequest("traced-1", "A=stall")
	r.Header.Set("Traceparent", testTraceparent)
	ctx, server := tp.Tracer("caddy").Start(r.Context(), "handler", trace.WithSpanKind(trace.SpanKindServer))
	if err := h.ServeHTTP(httptest.NewRecorder(), r.WithContext(ctx), forbiddenNext(t)); err != nil {
		t.Fatal(err)
	}
	server.End()

	var request sdktrace.ReadOnlySpan
	attempts := map[string]sdktrace.ReadOnlySpan{} // by upstream name
	for _, s := range rec.Ended() {
		switch s.Name() {
		case core.SpanRequest:
			request = s
		case core.SpanAttempt:
			for _, kv := range s.Attributes() {
				if kv.Key == "llmhedge.attempt.upstream" {
					attempts[kv.Value.AsString()] = s
				}
			}
		}
	}
	if request == nil {
		t.Fatalf("no %q span among %d", core.SpanRequest, len(rec.Ended()))
	}
	if request.Parent().SpanID() != server.SpanContext().SpanID() {
		t.Errorf("request span's parent %s, want the context's span %s", request.Parent().SpanID(), server.SpanContext().SpanID())
	}
	for name, sim := range map[string]*llmsim.Running{"A": a, "B": b} {
		s, ok := attempts[name]
		if !ok {
			t.Errorf("no attempt span for upstream %s", name)
			continue
		}
		if s.Parent().SpanID() != request.SpanContext().SpanID() {
			t.Errorf("attempt on %s: parent %s, want the request span %s", name, s.Parent().SpanID(), request.SpanContext().SpanID())
		}
		reqs := sim.Server.Requests()
		if len(reqs) != 1 {
			t.Errorf("%s received %d requests, want 1", name, len(reqs))
			continue
		}
		want := "00-" + s.SpanContext().TraceID().String() + "-" + s.SpanContext().SpanID().String() + "-01"
		if got := reqs[0].Header.Get("Traceparent"); got != want {
			t.Errorf("%s received traceparent %q, want its attempt span's %q", name, got, want)
		}
	}
}
