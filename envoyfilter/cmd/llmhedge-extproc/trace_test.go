package main

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/jaeger"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// The command with a tracing section exports the request's spans to a
// real Jaeger, parented on the request's traceparent, and flushes them
// when SIGTERM stops it: the batch processor's 5 s timer never fires in
// the process's short life. The export header's value (from the
// environment) never reaches the log.
func TestTracingOfTheCommand(t *testing.T) {
	j := jaeger.Start(t)
	up := llmsim.Start("A", llmsim.Fast())
	defer up.Close()
	const secret = "sk-otlp-never-logged"
	t.Setenv("LLMHEDGE_TEST_OTLP_KEY", secret) // the child inherits it
	path := filepath.Join(t.TempDir(), "extproc.yaml")
	cfg := `
grpc: {listen: "127.0.0.1:0"}
metrics: {listen: "off"}
shutdown: {drain_timeout: 1s, health_grace: 0s}
tracing:
  endpoint: "` + j.OTLPHTTPEndpoint() + `"
  headers: {authorization: "Bearer ${LLMHEDGE_TEST_OTLP_KEY}"}
routes:
  - name: chat
    upstreams: [{name: A, url: "` + up.URL + `"}]
    delay: 10s
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "-config", path)
	on := p.waitLog(t, "tracing on")
	if on["endpoint"] != j.OTLPHTTPEndpoint() || on["service"] != "llmhedge-envoy" || on["protocol"] != "http/protobuf" {
		t.Errorf("tracing on: %v, want endpoint %s, service llmhedge-envoy, protocol http/protobuf", on, j.OTLPHTTPEndpoint())
	}
	serving := p.waitLog(t, "llmhedge-extproc serving")
	go func() {
		for range p.logs { // keep the process's stderr flowing
		}
	}()
	conn, err := grpc.NewClient(serving["grpc"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	driver := envoydriver.New(conn, envoydriver.Config{})
	front := httptest.NewServer(driver)
	defer front.Close()

	const traceID, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	c := openai.NewClient(option.WithBaseURL(front.URL+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0),
		option.WithHeader(llmsim.HeaderRequest, "traced-1"), option.WithHeader("traceparent", "00-"+traceID+"-"+parent+"-01"))
	resp, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if err != nil {
		t.Fatal(err)
	}
	if want := llmsim.ExpectedChatText("traced-1", 20); resp.Choices[0].Message.Content != want {
		t.Fatalf("answer %q, want %q", resp.Choices[0].Message.Content, want)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.wait(t); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.out())
	}
	spans := j.Trace(t, traceID, 2)
	reqs := jaeger.Find(spans, core.SpanRequest)
	attempts := jaeger.Find(spans, core.SpanAttempt)
	if len(reqs) != 1 || len(attempts) != 1 {
		t.Fatalf("%d %s and %d %s spans, want 1 and 1", len(reqs), core.SpanRequest, len(attempts), core.SpanAttempt)
	}
	if reqs[0].ParentSpanID != parent || reqs[0].Service != "llmhedge-envoy" {
		t.Errorf("%s: parent %q service %q, want %q llmhedge-envoy", core.SpanRequest, reqs[0].ParentSpanID, reqs[0].Service, parent)
	}
	if attempts[0].ParentSpanID != reqs[0].SpanID || attempts[0].Tags["llmhedge.attempt.result"] != core.ResultWon {
		t.Errorf("attempt: parent %q result %v, want %q won", attempts[0].ParentSpanID, attempts[0].Tags["llmhedge.attempt.result"], reqs[0].SpanID)
	}
	if strings.Contains(p.out(), secret) {
		t.Errorf("the process's output holds the export header's value")
	}
	driver.Close()
}
