package lighttrace

import (
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
)

// The tracer's costs per request, compiled (go test -bench) and
// interpreted as Traefik runs it (yaegi test -bench):
//
//	go test -run '^$' -bench . -benchmem ./lighttrace
//	GOPATH=... GO111MODULE=off yaegi test -run '^$' -bench . github.com/llmhedge/llmhedge/lighttrace

// reportSpans are the spans of hedgedReport (without its denials: a
// typical request has none), as End queues them.
func reportSpans() []span {
	r := hedgedReport(time.Now())
	r.Denials = nil
	out := []span{{traceID: clientTrace, spanID: clientSpan, start: r.Start, data: core.SpanOf(r)}}
	for i := range r.Attempts {
		out = append(out, span{traceID: clientTrace, spanID: newSpanID(), parentID: clientSpan, start: r.Start, data: core.AttemptSpanOf(r, i)})
	}
	return out
}

// BenchmarkEncodeRequest encodes one request's spans (the request and two
// attempts) within a batch of 510.
func BenchmarkEncodeRequest(b *testing.B) {
	one := reportSpans()
	var batch []span
	for len(batch) < 510 {
		batch = append(batch, one...)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 170 {
		encodeBatch("edge", batch)
	}
}

// BenchmarkStartAttemptsEnd is a request's tracer calls: Start, two
// attempts and End (core.SpanOf and AttemptSpanOf included), queued to an
// exporter that never sends.
func BenchmarkStartAttemptsEnd(b *testing.B) {
	e, err := NewExporter(Options{Endpoint: "http://127.0.0.1:1", MaxQueue: 1 << 30, BatchSize: 1 << 30, Interval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	tr := NewTracer(e, 1)
	req := requestWith(clientTP, "")
	r := hedgedReport(time.Now())
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t := tr.Start(req, time.Now())
		t.Attempt(0, time.Now())
		t.Attempt(1, time.Now())
		t.End(r)
	}
	b.StopTimer()
	e.mu.Lock()
	e.queue = nil
	e.mu.Unlock()
}
