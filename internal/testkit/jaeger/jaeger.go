// Package jaeger gives end-to-end tests a real Jaeger v2 backend (v1.75.0
// of github.com/jaegertracing/jaeger, ./cmd/jaeger, built from its Go module
// by build-jaeger.sh) with in-memory storage: a test sends spans over OTLP
// (HTTP or gRPC) and reads them back through Jaeger's query API.
//
// Start runs one Jaeger per call on free 127.0.0.1 ports: the OTLP
// receiver's gRPC and HTTP ports and the jaeger_query extension's HTTP and
// gRPC ports. The collector's own metrics and traces are off
// (service.telemetry level none) and Jaeger does not trace its own queries
// (enable_tracing: false), so no instance listens on a fixed port such as
// 8888 or sends spans to localhost:4317.
//
// How Jaeger v1.75.0 reports an OTLP span through GET /api/traces/{id}
// (pinned by TestOTLPJSONRoundTrip, which sends OTLP/HTTP JSON by hand):
//
//   - The resource's service.name becomes the process's serviceName; the
//     other resource attributes become process tags (Span.Resource).
//   - The span's kind becomes the tag "span.kind" with the lower-case
//     value "client", "server", "producer", "consumer" or "internal"
//     (Span.Kind). SPAN_KIND_UNSPECIFIED (0) gives no tag.
//   - The parent span ID becomes a CHILD_OF reference (Span.ParentSpanID);
//     a root span has no references.
//   - An error status becomes three tags: "otel.status_code" = "ERROR",
//     "otel.status_description" = the status message (only when it is not
//     empty) and "error" = true (type bool). STATUS_CODE_OK gives
//     "otel.status_code" = "OK"; an unset status gives none of them.
//   - Attribute types are kept: stringValue → type "string", boolValue →
//     "bool", intValue (a decimal string in OTLP JSON) → "int64" with a JSON
//     number value, doubleValue → "float64" with a JSON number value. An
//     int64 beyond ±(2^53-1) (JavaScript's safe integers) comes back as a
//     decimal JSON string, still of type "int64". A double with no fraction
//     (2.0) stays type "float64". This package decodes the values into
//     string, bool, int64 and float64, keeping every digit of an int64.
//   - The receiver also takes intValue as a JSON number (7 as well as "7").
//   - The instrumentation scope becomes the tags "otel.scope.name" and
//     "otel.scope.version" (only when set).
//   - A span event becomes a log (Span.Logs) at the event's time whose
//     fields are the event's attributes plus "event" = the event's name.
//   - Tags come back sorted by key.
//   - startTime and duration are microseconds: nanoseconds of OTLP are
//     truncated to the microsecond.
//   - A trace ID whose high 64 bits are zero comes back as 16 hex digits;
//     Span.TraceID is always the 32-digit form OTLP uses.
//
// Jaeger's UI is not part of the Go module (cmd/query/app/ui/actual is
// empty: release builds embed jaeger-ui's build there), so QueryURL serves
// Jaeger's placeholder page at "/"; the query API under /api is complete.
// The jaeger_query extension's ui.assets_path (a folder holding a
// jaeger-ui build: index.html and static/) serves the real UI instead.
package jaeger

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/caddybin"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
)

// Version is the Jaeger release build-jaeger.sh builds.
const Version = "v1.75.0"

// TraceTimeout bounds how long Trace waits for a trace's spans to be
// queryable. Generous on purpose: spans arriving end the wait at once, so
// the bound only decides how long a missing span takes to fail.
const TraceTimeout = 60 * time.Second

// build is the binary's build script.
var build = caddybin.ScriptBuild{Script: "internal/testkit/jaeger/build-jaeger.sh", What: "build-jaeger.sh (go build of Jaeger)"}

// Binary returns the cached Jaeger binary, building it once per test
// process with internal/testkit/jaeger/build-jaeger.sh (minutes on a cold
// cache; the script keys its cache by version and serialises parallel
// builds with flock).
func Binary(t testing.TB) string {
	t.Helper()
	return build.Binary(t)
}

// Jaeger is a running Jaeger v2 with in-memory storage, started by Start
// and stopped when its test ends.
type Jaeger struct {
	otlpGRPC  int
	otlpHTTP  int
	queryHTTP int
	queryGRPC int
	output    *proc.Buffer
}

// Start runs Jaeger for t on free loopback ports and returns once its
// query API answers and both OTLP ports accept connections (the collector
// starts receivers last, after storage and the exporter). t.Cleanup stops
// it; its log goes to the test's output only when the test failed.
func Start(t testing.TB) *Jaeger {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	// A port found free can be taken by another process before Jaeger
	// binds it: try again with new ports when a bind fails.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		j := &Jaeger{
			otlpGRPC:  proc.FreePort(t),
			otlpHTTP:  proc.FreePort(t),
			queryHTTP: proc.FreePort(t),
			queryGRPC: proc.FreePort(t),
			output:    &proc.Buffer{},
		}
		config := filepath.Join(dir, fmt.Sprintf("jaeger-%d.yaml", attempt))
		proc.WriteFile(t, config, []byte(j.config()))
		lastErr = j.start(t, bin, config)
		if lastErr == nil {
			return j
		}
		if !strings.Contains(lastErr.Error(), "address already in use") {
			break
		}
	}
	t.Fatal("jaeger: " + lastErr.Error())
	return nil
}

// start runs the binary with config and waits until it is ready. On
// success it has registered the cleanup that stops the process.
func (j *Jaeger) start(t testing.TB, bin, config string) error {
	t.Helper()
	args := []string{bin, "--config", config}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout = j.output
	cmd.Stderr = j.output
	// No OTEL_* variable of the test's environment may point Jaeger's own
	// SDK at another collector.
	cmd.Env = withoutOTELEnv(os.Environ())
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	err := proc.WaitReady(args, exited, j.output.String, proc.AllReady(
		proc.HTTPReady(j.QueryURL()+"/api/services"),
		proc.PortReady(j.OTLPGRPCEndpoint()),
		proc.PortReady(strings.TrimPrefix(j.OTLPHTTPEndpoint(), "http://")),
	))
	if err != nil {
		proc.Stop(cmd.Process, exited, 10*time.Second)
		return err
	}
	t.Cleanup(func() {
		if !proc.Stop(cmd.Process, exited, 10*time.Second) {
			t.Errorf("jaeger: did not stop within 10s of SIGTERM; killed")
		}
		if t.Failed() {
			t.Logf("jaeger log:\n%s", j.output.String())
		}
	})
	return nil
}

func withoutOTELEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "OTEL_") {
			out = append(out, kv)
		}
	}
	return out
}

// config is the Jaeger v2 (OpenTelemetry Collector) configuration: OTLP in,
// memory storage, the query extension, nothing else listening.
func (j *Jaeger) config() string {
	return fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: none
    traces:
      level: none
    logs:
      level: info

extensions:
  jaeger_query:
    storage:
      traces: memstore
    enable_tracing: false
    max_clock_skew_adjust: 0s
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d

  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:%d
      http:
        endpoint: 127.0.0.1:%d

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`, j.queryHTTP, j.queryGRPC, j.otlpGRPC, j.otlpHTTP)
}

// OTLPHTTPEndpoint is the OTLP/HTTP receiver's base URL,
// "http://127.0.0.1:PORT": traces are POSTed to /v1/traces (protobuf or
// JSON).
func (j *Jaeger) OTLPHTTPEndpoint() string { return "http://127.0.0.1:" + strconv.Itoa(j.otlpHTTP) }

// OTLPGRPCEndpoint is the OTLP/gRPC receiver's address, "127.0.0.1:PORT"
// (plaintext).
func (j *Jaeger) OTLPGRPCEndpoint() string { return "127.0.0.1:" + strconv.Itoa(j.otlpGRPC) }

// QueryURL is the query service's base URL, "http://127.0.0.1:PORT": the
// HTTP JSON API under /api and the UI (here the placeholder page) at / and
// /trace/{traceID}.
func (j *Jaeger) QueryURL() string { return "http://127.0.0.1:" + strconv.Itoa(j.queryHTTP) }

// QueryGRPCEndpoint is the query service's gRPC address (api_v2 and
// api_v3), "127.0.0.1:PORT".
func (j *Jaeger) QueryGRPCEndpoint() string { return "127.0.0.1:" + strconv.Itoa(j.queryGRPC) }

// Output is everything Jaeger has logged so far.
func (j *Jaeger) Output() string { return j.output.String() }

// Span is one span as Jaeger's query API reports it.
type Span struct {
	TraceID       string // 32 lower-case hex digits
	SpanID        string // 16 lower-case hex digits
	ParentSpanID  string // the CHILD_OF reference's span; "" for a root span
	OperationName string
	Service       string // the process's serviceName (resource service.name)
	Kind          string // the span.kind tag: "client", "server", "internal", ...; "" without one
	Start         time.Time
	Duration      time.Duration // microsecond resolution
	// Tags are the span's tags by key with Jaeger's types: string, bool,
	// int64, float64 ([]byte for binary). They include span.kind,
	// otel.status_code, otel.status_description, error and otel.scope.*.
	Tags map[string]any
	// Resource are the process tags: the resource attributes other than
	// service.name.
	Resource map[string]any
	// StatusCode is the otel.status_code tag ("ERROR", "OK"; "" when unset).
	StatusCode string
	// StatusMessage is the otel.status_description tag.
	StatusMessage string
	// Error is the error tag: true for a span with an error status.
	Error bool
	// Logs are the span's events (Jaeger logs), in Jaeger's order.
	Logs []Log
}

// Log is one span event.
type Log struct {
	Time   time.Time
	Fields map[string]any // the event's name is the field "event"
}

// Trace polls GET /api/traces/{traceID} until the trace has at least
// wantSpans spans and returns them, sorted by start time then span ID. It
// fails t when TraceTimeout passes first, naming how many spans it found.
// traceID is 32 hex digits, as in OTLP and W3C traceparent.
func (j *Jaeger) Trace(t testing.TB, traceID string, wantSpans int) []Span {
	t.Helper()
	deadline := time.Now().Add(TraceTimeout)
	tick := time.NewTicker(50 * time.Millisecond) // polling interval, bounded by deadline
	defer tick.Stop()
	var spans []Span
	var lastErr error
	for {
		var malformed bool
		spans, malformed, lastErr = j.getTrace(traceID)
		if malformed {
			t.Fatalf("jaeger: trace %s: %v", traceID, lastErr)
		}
		if lastErr == nil && len(spans) >= wantSpans {
			return spans
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("jaeger: trace %s: found %d spans within %v, want at least %d", traceID, len(spans), TraceTimeout, wantSpans)
			if lastErr != nil {
				msg += fmt.Sprintf(" (last query: %v)", lastErr)
			}
			for _, s := range spans {
				msg += fmt.Sprintf("\n  %s %s (%s) parent %q", s.SpanID, s.OperationName, s.Service, s.ParentSpanID)
			}
			t.Fatal(msg)
		}
		<-tick.C
	}
}

// getTrace returns the trace's spans; none (and no error) while Jaeger
// answers 404. malformed reports an answer this package cannot read, which
// polling does not mend.
func (j *Jaeger) getTrace(traceID string) (spans []Span, malformed bool, err error) {
	var resp traceResponse
	status, err := j.getJSON("/api/traces/"+traceID, &resp)
	if err != nil {
		return nil, false, err
	}
	if status == http.StatusNotFound {
		return nil, false, nil
	}
	if status != http.StatusOK {
		return nil, false, fmt.Errorf("GET /api/traces/%s: status %d: %v", traceID, status, resp.Errors)
	}
	for _, tr := range resp.Data {
		converted, err := tr.spans()
		if err != nil {
			return nil, true, err
		}
		spans = append(spans, converted...)
	}
	sort.SliceStable(spans, func(a, b int) bool {
		if !spans[a].Start.Equal(spans[b].Start) {
			return spans[a].Start.Before(spans[b].Start)
		}
		return spans[a].SpanID < spans[b].SpanID
	})
	return spans, false, nil
}

// Services returns the service names Jaeger has seen (GET /api/services),
// sorted.
func (j *Jaeger) Services(t testing.TB) []string {
	t.Helper()
	var resp struct {
		Data   []string `json:"data"`
		Errors any      `json:"errors"`
	}
	status, err := j.getJSON("/api/services", &resp)
	if err != nil {
		t.Fatal("jaeger: " + err.Error())
	}
	if status != http.StatusOK {
		t.Fatalf("jaeger: GET /api/services: status %d: %v", status, resp.Errors)
	}
	sort.Strings(resp.Data)
	return resp.Data
}

// getJSON GETs path of the query API and decodes its JSON body into v
// (numbers as json.Number), returning the status code.
func (j *Jaeger) getJSON(path string, v any) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.QueryURL()+path, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return resp.StatusCode, fmt.Errorf("GET %s: status %d, body not JSON: %v: %s", path, resp.StatusCode, err, proc.Tail(string(body), 500))
	}
	return resp.StatusCode, nil
}

// Find returns the spans whose OperationName is name, in order.
func Find(spans []Span, name string) []Span {
	var out []Span
	for _, s := range spans {
		if s.OperationName == name {
			out = append(out, s)
		}
	}
	return out
}

// ByID indexes spans by SpanID.
func ByID(spans []Span) map[string]Span {
	out := make(map[string]Span, len(spans))
	for _, s := range spans {
		out[s.SpanID] = s
	}
	return out
}

// The JSON of Jaeger's HTTP API (internal/uimodel of the module).
type traceResponse struct {
	Data   []apiTrace `json:"data"`
	Errors any        `json:"errors"`
}

type apiTrace struct {
	TraceID   string                `json:"traceID"`
	Spans     []apiSpan             `json:"spans"`
	Processes map[string]apiProcess `json:"processes"`
}

type apiSpan struct {
	TraceID       string         `json:"traceID"`
	SpanID        string         `json:"spanID"`
	OperationName string         `json:"operationName"`
	References    []apiReference `json:"references"`
	StartTime     int64          `json:"startTime"` // µs since the epoch
	Duration      int64          `json:"duration"`  // µs
	Tags          []apiKeyValue  `json:"tags"`
	Logs          []apiLog       `json:"logs"`
	ProcessID     string         `json:"processID"`
	Process       *apiProcess    `json:"process"`
}

type apiReference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

type apiProcess struct {
	ServiceName string        `json:"serviceName"`
	Tags        []apiKeyValue `json:"tags"`
}

type apiLog struct {
	Timestamp int64         `json:"timestamp"` // µs since the epoch
	Fields    []apiKeyValue `json:"fields"`
}

type apiKeyValue struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

func (tr apiTrace) spans() ([]Span, error) {
	out := make([]Span, 0, len(tr.Spans))
	for _, s := range tr.Spans {
		tags, err := tagMap(s.Tags)
		if err != nil {
			return nil, fmt.Errorf("span %s: %v", s.SpanID, err)
		}
		p, ok := tr.Processes[s.ProcessID]
		if s.Process != nil {
			p, ok = *s.Process, true
		}
		if !ok {
			return nil, fmt.Errorf("span %s: process %q not in the trace's processes", s.SpanID, s.ProcessID)
		}
		resource, err := tagMap(p.Tags)
		if err != nil {
			return nil, fmt.Errorf("span %s process: %v", s.SpanID, err)
		}
		span := Span{
			TraceID:       padHex(s.TraceID, 32),
			SpanID:        padHex(s.SpanID, 16),
			OperationName: s.OperationName,
			Service:       p.ServiceName,
			Start:         time.UnixMicro(s.StartTime),
			Duration:      time.Duration(s.Duration) * time.Microsecond,
			Tags:          tags,
			Resource:      resource,
		}
		for _, ref := range s.References {
			if ref.RefType == "CHILD_OF" {
				span.ParentSpanID = padHex(ref.SpanID, 16)
				break
			}
		}
		span.Kind, _ = tags["span.kind"].(string)
		span.StatusCode, _ = tags["otel.status_code"].(string)
		span.StatusMessage, _ = tags["otel.status_description"].(string)
		span.Error, _ = tags["error"].(bool)
		for _, l := range s.Logs {
			fields, err := tagMap(l.Fields)
			if err != nil {
				return nil, fmt.Errorf("span %s log: %v", s.SpanID, err)
			}
			span.Logs = append(span.Logs, Log{Time: time.UnixMicro(l.Timestamp), Fields: fields})
		}
		out = append(out, span)
	}
	return out, nil
}

// tagMap converts Jaeger's typed key-values to Go values of their type.
func tagMap(kvs []apiKeyValue) (map[string]any, error) {
	out := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		v, err := tagValue(kv)
		if err != nil {
			return nil, err
		}
		out[kv.Key] = v
	}
	return out, nil
}

func tagValue(kv apiKeyValue) (any, error) {
	switch kv.Type {
	case "", "string":
		if s, ok := kv.Value.(string); ok {
			return s, nil
		}
	case "bool":
		if b, ok := kv.Value.(bool); ok {
			return b, nil
		}
	case "int64":
		// A JSON number, or a decimal string beyond ±(2^53-1), which
		// JavaScript numbers cannot hold exactly.
		switch v := kv.Value.(type) {
		case json.Number:
			return v.Int64()
		case string:
			return strconv.ParseInt(v, 10, 64)
		}
	case "float64":
		if n, ok := kv.Value.(json.Number); ok {
			return n.Float64()
		}
	case "binary":
		if s, ok := kv.Value.(string); ok {
			return base64.StdEncoding.DecodeString(s)
		}
	}
	return nil, fmt.Errorf("tag %q: value %#v does not fit type %q", kv.Key, kv.Value, kv.Type)
}

// padHex left-pads a hex ID with zeros to n digits: Jaeger prints a trace
// ID whose high half is zero as 16 digits.
func padHex(id string, n int) string {
	if len(id) < n {
		return strings.Repeat("0", n-len(id)) + id
	}
	return id
}
