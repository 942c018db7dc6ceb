package envoyfilter_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/protobuf/proto"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/envoyfilter"
)

// otlpSink is an OTLP/HTTP endpoint that keeps the traces of the spans
// named llm_hedge it receives (and the export headers): it tells which
// pipeline exported what. The acceptance against a real backend is
// TestTracesInJaeger.
type otlpSink struct {
	srv     *httptest.Server
	mu      sync.Mutex
	traces  map[string]bool // trace ids of llm_hedge spans
	apiKeys map[string]bool // X-Api-Key headers of the exports
}

func startOTLPSink(t *testing.T) *otlpSink {
	s := &otlpSink{traces: map[string]bool{}, apiKeys: map[string]bool{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "not an OTLP/HTTP protobuf export", http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.apiKeys[r.Header.Get("X-Api-Key")] = true
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					if sp.Name == core.SpanRequest {
						s.traces[hex.EncodeToString(sp.TraceId)] = true
					}
				}
			}
		}
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Write(out)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// has reports whether an llm_hedge span of trace traceID arrived.
func (s *otlpSink) has(traceID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.traces[traceID]
}

func (s *otlpSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.traces)
}

// A reload that leaves the tracing section alone keeps the pipeline; one
// that changes it sends new requests' spans to the new endpoint, while the
// old pipeline still exports what it traced (flushed at Close, or
// shutdown.drain_timeout after the reload); one that turns it off leaves
// the client's traceparent to the upstreams. Export headers come from the
// environment (${NAME}).
func TestTracingReload(t *testing.T) {
	t.Setenv("LLMHEDGE_TRACE_KEY", "otlp-key-1")
	first, second := startOTLPSink(t), startOTLPSink(t)
	head := func(sink *otlpSink) string {
		return fmt.Sprintf("tracing: {endpoint: %q, headers: {X-Api-Key: \"${LLMHEDGE_TRACE_KEY}\"}}", sink.srv.URL)
	}
	rig := newTraceRig(t, head(first), envoyfilter.Options{})
	request := func(traceID string) upstreamCall {
		t.Helper()
		rig.send(traceRequest{route: "retry", script: "A=" + actAnswer + ";B=" + actAnswer, traceparent: traceparentOf(traceID, envoyParent)})
		calls := rig.takeCalls(1)
		rig.report()
		return calls[0]
	}
	const t1, t2, t3, t4 = "11111111111111111111111111111111", "22222222222222222222222222222222",
		"33333333333333333333333333333333", "44444444444444444444444444444444"
	request(t1)
	if err := rig.srv.Reload(rig.config(head(first))); err != nil {
		t.Fatal(err)
	}
	request(t2)
	if err := rig.srv.Reload(rig.config(head(second))); err != nil {
		t.Fatal(err)
	}
	request(t3)
	if err := rig.srv.Reload(rig.config("")); err != nil {
		t.Fatal(err)
	}
	parent := traceparentOf(t4, envoyParent)
	if call := request(t4); call.traceparent != parent {
		t.Errorf("with tracing reloaded off the upstream got traceparent %q, want the client's %q", call.traceparent, parent)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rig.srv.Close(ctx) // flushes both pipelines
	for _, c := range []struct {
		sink  *otlpSink
		name  string
		trace string
		want  bool
	}{
		{first, "first", t1, true}, {first, "first", t2, true}, {first, "first", t3, false},
		{second, "second", t3, true}, {second, "second", t1, false}, {second, "second", t2, false},
	} {
		if got := c.sink.has(c.trace); got != c.want {
			t.Errorf("the %s endpoint has trace %s: %v, want %v", c.name, c.trace, got, c.want)
		}
	}
	if n := first.count() + second.count(); n != 3 {
		t.Errorf("%d traces exported, want 3 (none for the request traced off)", n)
	}
	for _, sink := range []*otlpSink{first, second} {
		sink.mu.Lock()
		if len(sink.apiKeys) != 1 || !sink.apiKeys["otlp-key-1"] {
			t.Errorf("exports carried X-Api-Key %v, want only the expanded otlp-key-1", sink.apiKeys)
		}
		sink.mu.Unlock()
	}
}

// A reload whose tracing section cannot be built changes nothing: the
// routes in force keep their pipeline.
func TestTracingReloadErrorKeepsThePipeline(t *testing.T) {
	sink := startOTLPSink(t)
	rig := newTraceRig(t, fmt.Sprintf("tracing: {endpoint: %q}", sink.srv.URL), envoyfilter.Options{})
	// Parsed while the variable is set; unset at the reload, the pipeline
	// cannot be built.
	t.Setenv("LLMHEDGE_TRACE_KEY_UNSET_AT_RELOAD", "k")
	cfg := rig.config(fmt.Sprintf("tracing: {endpoint: %q, headers: {X-Api-Key: \"${LLMHEDGE_TRACE_KEY_UNSET_AT_RELOAD}\"}}", sink.srv.URL))
	os.Unsetenv("LLMHEDGE_TRACE_KEY_UNSET_AT_RELOAD")
	if err := rig.srv.Reload(cfg); err == nil || !strings.Contains(err.Error(), "LLMHEDGE_TRACE_KEY_UNSET_AT_RELOAD") {
		t.Fatalf("reload error %v, want one naming the unset variable", err)
	}
	const traceID = "55555555555555555555555555555555"
	rig.send(traceRequest{route: "retry", script: "A=" + actAnswer + ";B=" + actAnswer, traceparent: traceparentOf(traceID, envoyParent)})
	rig.takeCalls(1)
	rig.report()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rig.srv.Close(ctx)
	if !sink.has(traceID) {
		t.Errorf("trace %s not exported after the failed reload, want the running pipeline kept", traceID)
	}
}

// With a TracerProvider injected the file's tracing section is not used:
// a reload that changes it names it among the restart-only settings, and
// the server never shuts the injected provider down.
func TestTracingSectionIgnoredWithAnInjectedProvider(t *testing.T) {
	path := filepath.Join(t.TempDir(), "extproc.yaml")
	config := func(rest string) string {
		return "grpc: {listen: \"127.0.0.1:0\"}\nmetrics: {listen: \"off\"}\nroutes: [{name: chat, upstreams: [{url: \"http://127.0.0.1:1\"}]}]\n" + rest
	}
	writeConfig(t, path, config(""))
	logCore, logs := observer.New(zap.InfoLevel)
	rec, tp := newRecorder()
	app, _ := startApp(t, path, zap.New(logCore), envoyfilter.Options{TracerProvider: tp})
	writeConfig(t, path, config("tracing: {endpoint: \"http://127.0.0.1:1\"}\n"))
	if err := app.Reload(); err != nil {
		t.Fatal(err)
	}
	warnings := logs.FilterMessage("restart-only settings changed; they keep their running values until a restart").All()
	if len(warnings) != 1 {
		t.Fatalf("%d restart-only warnings, want 1", len(warnings))
	}
	if got, want := fmt.Sprint(warnings[0].ContextMap()["fields"]), "[tracing]"; got != want {
		t.Fatalf("restart-only warning names %s, want %s", got, want)
	}
	if n := logs.FilterMessage("tracing on").Len(); n != 0 {
		t.Errorf("%d \"tracing on\" lines: the file's section was built, want it ignored", n)
	}
	app.Shutdown(time.Second)
	_, span := tp.Tracer("t").Start(context.Background(), "after")
	span.End()
	if n := len(rec.Ended()); n != 1 {
		t.Errorf("the injected provider recorded %d spans after the server stopped, want 1 (not shut down)", n)
	}
}
