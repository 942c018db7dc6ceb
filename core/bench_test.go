package core

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/stream"
)

// The per-request cost of the engine on the path that matters for
// throughput: one streamed Chat Completions answer from a fast upstream, no
// hedge firing. `yaegi test -bench Handle ./core` prices it interpreted, as
// Traefik runs it; `go test -bench Handle ./core` compiled.

// benchChunk is one Chat Completions chunk in the shape real upstreams (and
// llmsim) send.
func benchChunk(delta, finish string) string {
	return `data: {"id":"chatcmpl-F-bench","object":"chat.completion.chunk","created":1700000000,"model":"gpt-x",` +
		`"system_fingerprint":"F","choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":` + finish + `}]}` + "\n\n"
}

// benchEvents is a 20-token answer, one event per network read.
func benchEvents() [][]byte {
	events := [][]byte{[]byte(benchChunk(`{"role":"assistant","content":""}`, "null"))}
	for i := 0; i < 20; i++ {
		events = append(events, []byte(benchChunk(`{"content":" tok`+strconv.Itoa(i)+`"}`, "null")))
	}
	events = append(events, []byte(benchChunk(`{}`, `"stop"`)+"data: [DONE]\n\n"))
	return events
}

// streamTransport answers every request at once with the same stream, one
// event per Read (io.MultiReader reads one reader at a time), from compiled
// readers as a real transport's body is.
type streamTransport struct{ events [][]byte }

func (s *streamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	h := make(http.Header)
	h.Set("Content-Type", "text/event-stream")
	readers := make([]io.Reader, len(s.events))
	for i, e := range s.events {
		readers[i] = bytes.NewReader(e)
	}
	body := io.NopCloser(io.MultiReader(readers...))
	return &http.Response{StatusCode: 200, Header: h, Body: body, Request: req}, nil
}

func BenchmarkHandleStream(b *testing.B) {
	events := benchEvents()
	want := 0
	for _, e := range events {
		want += len(e)
	}
	var tr http.RoundTripper = &streamTransport{events: events}
	var clock Clock = SystemClock{}
	cfg := config.Config{
		Upstreams: []config.UpstreamConfig{{Name: "F", URL: "http://f.test"}, {Name: "G", URL: "http://g.test"}},
		Delay:     config.DelayConfig{Fixed: config.Duration(30 * time.Second)},
	}
	h, err := New(cfg, Options{Transport: tr, Clock: clock})
	if err != nil {
		b.Fatal(err)
	}
	body := `{"model":"gpt-x","stream":true,"messages":[{"role":"user","content":"say something"}]}`
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		if err := h.Handle(rec, r); err != nil {
			b.Fatal(err)
		}
		if rec.Code != 200 {
			b.Fatalf("rec.Code = %v, want 200", rec.Code)
		} else if rec.Body.Len() != want {
			b.Fatalf("rec.Body.Len() = %v, want %v", rec.Body.Len(), want)
		}
	}
}

// BenchmarkDetectFirstToken prices the detector on the two events it parses
// on the common path: the role chunk and the first token.
func BenchmarkDetectFirstToken(b *testing.B) {
	events := benchEvents()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		d := stream.NewDetector(stream.FormatSSE, config.RuleAuto, 0)
		if v, _ := stream.Feed(d, events[0]); v != stream.VerdictPending {
			b.Fatal("role chunk decided")
		}
		if v, _ := stream.Feed(d, events[1]); v != stream.VerdictOutput {
			b.Fatal("token chunk not output")
		}
	}
}
