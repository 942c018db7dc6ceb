// Package oteltrace traces the engine's requests with OpenTelemetry's SDK:
// a core.Tracer for the adapters that can import it (Caddy and the Envoy
// server). Each request gets an internal span, core.SpanRequest, and each
// upstream attempt a client span under it, core.SpanAttempt, whose context
// the attempt's upstream receives as its traceparent. Names, attributes
// and status come from core.SpanOf and core.AttemptSpanOf, the vocabulary
// every adapter shares (the Traefik plugin's standard-library tracer too).
package oteltrace

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmhedge/llmhedge/core"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/llmhedge/llmhedge"

// Tracer is a core.Tracer. The zero value is not usable: see FromContext
// and New.
type Tracer struct {
	tracer trace.Tracer // nil: the tracer of the span in the request's context
}

// FromContext traces the requests whose context carries a recording span
// (Caddy's tracing handler puts its span there), as children of that span,
// exported by the provider that made it. Other requests are not traced and
// cost one context lookup.
func FromContext() *Tracer { return &Tracer{} }

// New traces every request with tp; a request's parent is the trace
// context of its headers (the traceparent Envoy sends), a new trace when it
// has none. Whether a request is recorded is tp's sampler's decision.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{tracer: tp.Tracer(ScopeName)}
}

// propagator writes and reads W3C trace context: traceparent and
// tracestate.
var propagator = propagation.TraceContext{}

// Start implements core.Tracer.
func (t *Tracer) Start(r *http.Request, start time.Time) core.Trace {
	ctx := r.Context()
	tracer := t.tracer
	if tracer == nil {
		parent := trace.SpanFromContext(ctx)
		if !parent.IsRecording() {
			return nil
		}
		tracer = parent.TracerProvider().Tracer(ScopeName)
	} else {
		ctx = propagator.Extract(ctx, propagation.HeaderCarrier(r.Header))
	}
	ctx, span := tracer.Start(ctx, core.SpanRequest, trace.WithTimestamp(start), trace.WithSpanKind(trace.SpanKindInternal))
	if !span.IsRecording() {
		// Not sampled: the attempts keep the caller's headers.
		span.End()
		return nil
	}
	return &requestTrace{tracer: tracer, ctx: ctx, span: span}
}

// requestTrace is one request's spans; the engine calls it from the
// request's goroutine only.
type requestTrace struct {
	tracer   trace.Tracer
	ctx      context.Context
	span     trace.Span
	attempts []trace.Span
}

// Attempt implements core.Trace.
func (rt *requestTrace) Attempt(index int, start time.Time) (string, string) {
	ctx, span := rt.tracer.Start(rt.ctx, core.SpanAttempt, trace.WithTimestamp(start), trace.WithSpanKind(trace.SpanKindClient))
	for len(rt.attempts) <= index {
		rt.attempts = append(rt.attempts, nil)
	}
	rt.attempts[index] = span
	carrier := make(propagation.MapCarrier, 2)
	propagator.Inject(ctx, carrier)
	return carrier["traceparent"], carrier["tracestate"]
}

// End implements core.Trace.
func (rt *requestTrace) End(r *core.Report) {
	ended := make([]bool, len(rt.attempts))
	for i := range r.Attempts {
		if n := r.Attempts[i].Index; n >= 0 && n < len(rt.attempts) && rt.attempts[n] != nil && !ended[n] {
			end(rt.attempts[n], core.AttemptSpanOf(r, i))
			ended[n] = true
		}
	}
	for n, span := range rt.attempts {
		if span != nil && !ended[n] {
			span.End() // not in the report (a panic cut it short)
		}
	}
	end(rt.span, core.SpanOf(r))
}

// end ends span as d describes it.
func end(span trace.Span, d core.SpanData) {
	span.SetAttributes(Attributes(d.Attributes)...)
	if d.Failed {
		span.SetStatus(codes.Error, d.ErrorMessage)
	}
	span.End(trace.WithTimestamp(d.End))
}

// Attributes converts the engine's fields to OpenTelemetry attributes.
func Attributes(fields []core.LogField) []attribute.KeyValue {
	out := make([]attribute.KeyValue, 0, len(fields))
	for _, f := range fields {
		switch f.Kind {
		case core.LogString:
			out = append(out, attribute.String(f.Key, f.Str))
		case core.LogInt:
			out = append(out, attribute.Int64(f.Key, f.Int))
		case core.LogBool:
			out = append(out, attribute.Bool(f.Key, f.Bool))
		case core.LogMillis:
			out = append(out, attribute.Float64(f.Key, f.Millis))
		case core.LogStrings:
			out = append(out, attribute.StringSlice(f.Key, f.Strs))
		}
	}
	return out
}
