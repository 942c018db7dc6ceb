// Package lighttrace is a tracer for llmhedge's engine (core.Tracer) in the
// standard library only, for where OpenTelemetry's SDK cannot go: the
// Traefik plugin, which Yaegi interprets. It reads and writes W3C Trace
// Context (traceparent, tracestate) and exports spans with OTLP/HTTP in its
// JSON encoding to a collector (Jaeger, the OpenTelemetry Collector,
// Tempo, ...).
//
// A request with a valid traceparent continues its trace: its span is a
// child of the header's span, and a parent that is not sampled leaves the
// request untraced (its attempts carry the client's headers unchanged).
// Without one, a new trace starts, sampled at the tracer's rate. Each
// attempt gets a span of its own, a child of the request's, and sends it
// as the parent in its traceparent.
//
// An Exporter queues finished spans (bounded: over its bound spans are
// dropped and counted) and posts them in batches from one goroutine,
// started with the first span, never before, and ended when the queue is
// empty: an exporter nobody uses holds no goroutine of its own (its idle
// connection to the collector is closed after 90 s). The code keeps to
// what Yaegi v0.16.1 runs safely (no select; see CONTRIBUTING.md).
package lighttrace

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"time"

	"github.com/llmhedge/llmhedge/core"
)

// Tracer is a core.Tracer whose spans go to an Exporter.
type Tracer struct {
	exp *Exporter
	// all: every new trace is sampled (rate 1). Otherwise a new trace is
	// sampled when its id's last 63 bits are below threshold (the
	// OpenTelemetry SDK's TraceIDRatioBased rule).
	all       bool
	threshold uint64
}

// NewTracer returns a tracer exporting to e. sampleRate (0 to 1) is the
// share of new traces sampled; a request that continues a trace follows
// its parent's sampled flag, as OpenTelemetry's parent-based sampler does.
// It starts nothing.
func NewTracer(e *Exporter, sampleRate float64) *Tracer {
	t := &Tracer{exp: e}
	switch {
	case sampleRate >= 1:
		t.all = true
	case sampleRate > 0:
		t.threshold = uint64(sampleRate * (1 << 63))
	}
	return t
}

// Start implements core.Tracer: nil when r is not traced. Its common
// case, a request without traceparent, calls one function: under Yaegi
// each call allocates its whole frame.
func (t *Tracer) Start(r *http.Request, _ time.Time) core.Trace {
	if len(r.Header["Traceparent"]) == 0 {
		tr := newRoot(t)
		if tr == nil {
			return nil
		}
		return tr
	}
	tr := continueTrace(t, r.Header)
	if tr == nil {
		return nil
	}
	return tr
}

// continueTrace begins a request's trace from its traceparent: a child of
// the client's span when it is valid and sampled (nil when it is not
// sampled), a new trace when it is invalid.
func continueTrace(t *Tracer, h http.Header) *trace {
	p, state, ok := requestParent(h)
	if !ok {
		return newRoot(t)
	}
	if !p.sampled {
		return nil
	}
	return &trace{exp: t.exp, traceID: p.traceID, parentID: p.spanID, tracestate: state, spanID: newSpanID()}
}

// newRoot begins a new trace, or returns nil when the sampler drops it.
func newRoot(t *Tracer) *trace {
	b := make([]byte, 24) // the trace id, then the request span's id
	rand.Read(b)          // crypto/rand: compiled, never fails on supported platforms
	if !t.all && binary.BigEndian.Uint64(b[8:16])>>1 >= t.threshold {
		return nil
	}
	ids := hex.EncodeToString(b)
	for ids[:32] == zeroTraceID || ids[32:] == zeroSpanID {
		ids = hex.EncodeToString(randomBytes(24))
	}
	return &trace{exp: t.exp, traceID: ids[:32], spanID: ids[32:]}
}

// trace is one request's spans until End. Its methods are called on the
// request's goroutine only.
type trace struct {
	exp        *Exporter
	traceID    string
	spanID     string // the request's span
	parentID   string // the client's span; "" for a new trace
	tracestate string
	attempts   []string // each attempt's span id, by index
}

// Attempt implements core.Trace: a span id for attempt index, sent as the
// parent of its upstream's trace.
func (t *trace) Attempt(index int, _ time.Time) (string, string) {
	b := make([]byte, 8)
	rand.Read(b)
	id := hex.EncodeToString(b)
	if id == zeroSpanID {
		id = newSpanID()
	}
	if index == len(t.attempts) {
		t.attempts = append(t.attempts, id) // attempts start in order
	} else {
		t.attempts = setAttempt(t.attempts, index, id)
	}
	tp := "00-" + t.traceID + "-" + id + "-01"
	state := t.tracestate
	return tp, state
}

// setAttempt stores id at index of ids, growing it as needed.
func setAttempt(ids []string, index int, id string) []string {
	for len(ids) <= index {
		ids = append(ids, "")
	}
	ids[index] = id
	return ids
}

// End implements core.Trace: the request's span (from r.Start) and one
// span per attempt (from its start), children of the request's, queued
// for export.
func (t *trace) End(r *core.Report) {
	spans := make([]span, 0, 1+len(r.Attempts))
	spans = append(spans, span{traceID: t.traceID, spanID: t.spanID, parentID: t.parentID, start: r.Start, data: core.SpanOf(r)})
	for i := range r.Attempts {
		spans = append(spans, attemptSpan(t, r, i))
	}
	enqueue(t.exp, spans)
}

// attemptSpan is attempt i's span; an attempt that never had a span id
// (none is known to the engine today) gets one here.
func attemptSpan(t *trace, r *core.Report, i int) span {
	a := &r.Attempts[i]
	id := ""
	if a.Index >= 0 && a.Index < len(t.attempts) {
		id = t.attempts[a.Index]
	}
	if id == "" {
		id = newSpanID()
	}
	return span{traceID: t.traceID, spanID: id, parentID: t.spanID, start: r.Start.Add(a.Started), data: core.AttemptSpanOf(r, i)}
}

// span is a finished span waiting for export.
type span struct {
	traceID  string
	spanID   string
	parentID string
	start    time.Time
	data     core.SpanData
}
