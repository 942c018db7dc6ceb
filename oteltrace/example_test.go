package oteltrace_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/oteltrace"
)

// A proxy that traces its requests with OpenTelemetry (Caddy's tracing
// handler) puts its span in the request's context; a Hedger with
// FromContext adds the request's span under it and a client span per
// attempt, and each upstream receives its own attempt's span as the
// traceparent's parent.
func ExampleFromContext() {
	sent := make(chan string, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		sent <- r.Header.Get("Traceparent")
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}`+"\n\ndata: [DONE]\n\n")
	}))
	defer upstream.Close()

	h, err := core.New(config.Config{
		Route:     "chat",
		Upstreams: []config.UpstreamConfig{{Name: "primary", URL: upstream.URL}},
		Delay:     config.DelayConfig{Fixed: config.Duration(time.Second)},
	}, core.Options{Tracer: oteltrace.FromContext()})
	if err != nil {
		fmt.Println(err)
		return
	}

	// The proxy's side: a provider (here keeping the spans in memory, in
	// Caddy the one its tracing handler exports with) and its server span.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	ctx, server := tp.Tracer("proxy").Start(context.Background(), "POST /v1/chat/completions")
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	h.ServeHTTP(httptest.NewRecorder(), req.WithContext(ctx))
	server.End()

	names := map[string]string{server.SpanContext().SpanID().String(): "POST /v1/chat/completions"}
	for _, s := range spans.Ended() {
		names[s.SpanContext().SpanID().String()] = s.Name()
	}
	for _, s := range spans.Ended() {
		if s.Name() == "POST /v1/chat/completions" {
			continue
		}
		fmt.Printf("%s (%s) under %s\n", s.Name(), s.SpanKind(), names[s.Parent().SpanID().String()])
		if s.Name() == core.SpanAttempt {
			fmt.Println("  upstream's traceparent names this span:", <-sent == "00-"+s.SpanContext().TraceID().String()+"-"+s.SpanContext().SpanID().String()+"-01")
			for _, kv := range s.Attributes() {
				if kv.Key == "llmhedge.attempt.role" || kv.Key == "llmhedge.attempt.result" {
					fmt.Printf("  %s = %s\n", kv.Key, kv.Value.String())
				}
			}
		}
	}
	// Output:
	// llm_hedge.attempt (client) under llm_hedge
	//   upstream's traceparent names this span: true
	//   llmhedge.attempt.role = primary
	//   llmhedge.attempt.result = won
	// llm_hedge (internal) under POST /v1/chat/completions
}
