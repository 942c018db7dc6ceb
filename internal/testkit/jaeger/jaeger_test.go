package jaeger

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// TestOTLPJSONRoundTrip sends one trace of two spans as OTLP/HTTP JSON,
// written by hand, and reads it back through the query API: it pins down
// how Jaeger reports each OTLP field (see the package documentation).
func TestOTLPJSONRoundTrip(t *testing.T) {
	j := Start(t)

	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		rootID  = "00f067aa0ba902b7"
		childID = "b7ad6b7169203331"
		service = "llmhedge-jaeger-kit"
	)
	// Whole microseconds: Jaeger keeps microseconds.
	start := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	childStart := start.Add(10 * time.Millisecond)
	childEnd := childStart.Add(25*time.Millisecond + 7*time.Microsecond)
	rootEnd := start.Add(50 * time.Millisecond)
	nanos := func(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }
	const bigInt = int64(9007199254740993) // 2^53+1: lost if read as a float64

	body := map[string]any{
		"resourceSpans": []any{map[string]any{
			"resource": map[string]any{"attributes": []any{
				attr("service.name", map[string]any{"stringValue": service}),
				attr("deployment.environment", map[string]any{"stringValue": "test"}),
			}},
			"scopeSpans": []any{map[string]any{
				"scope": map[string]any{"name": "llmhedge/test", "version": "0.1.0"},
				"spans": []any{
					map[string]any{
						"traceId":           traceID,
						"spanId":            rootID,
						"name":              "hedge",
						"kind":              2, // SERVER
						"startTimeUnixNano": nanos(start),
						"endTimeUnixNano":   nanos(rootEnd),
						"attributes": []any{
							attr("http.route", map[string]any{"stringValue": "/v1/chat/completions"}),
						},
						"status": map[string]any{"code": 1}, // OK
					},
					map[string]any{
						"traceId":           traceID,
						"spanId":            childID,
						"parentSpanId":      rootID,
						"name":              "attempt",
						"kind":              3, // CLIENT
						"startTimeUnixNano": nanos(childStart),
						"endTimeUnixNano":   nanos(childEnd),
						"attributes": []any{
							attr("llm.provider", map[string]any{"stringValue": "openai"}),
							attr("attempt.index", map[string]any{"intValue": "2"}),
							attr("big.int", map[string]any{"intValue": strconv.FormatInt(bigInt, 10)}),
							attr("hedge.won", map[string]any{"boolValue": true}),
							attr("hedge.delay_ratio", map[string]any{"doubleValue": 0.75}),
							attr("hedge.budget", map[string]any{"doubleValue": 2.0}), // marshalled as 2
						},
						"events": []any{map[string]any{
							"timeUnixNano": nanos(childStart.Add(time.Millisecond)),
							"name":         "first.byte",
							"attributes":   []any{attr("bytes", map[string]any{"intValue": "42"})},
						}},
						"status": map[string]any{"code": 2, "message": "upstream 503"}, // ERROR
					},
				},
			}},
		}},
	}
	postOTLPJSON(t, j.OTLPHTTPEndpoint()+"/v1/traces", body)

	spans := j.Trace(t, traceID, 2)
	if len(spans) != 2 {
		t.Fatalf("got %d spans, want 2: %+v", len(spans), spans)
	}
	byID := ByID(spans)
	root, child := byID[rootID], byID[childID]
	if got := Find(spans, "hedge"); len(got) != 1 || got[0].SpanID != rootID {
		t.Fatalf("Find(hedge) = %+v, want the root span", got)
	}
	if got := Find(spans, "attempt"); len(got) != 1 || got[0].SpanID != childID {
		t.Fatalf("Find(attempt) = %+v, want the child span", got)
	}

	// The root span.
	checkSpan(t, root, Span{
		TraceID:       traceID,
		SpanID:        rootID,
		ParentSpanID:  "",
		OperationName: "hedge",
		Service:       service,
		Kind:          "server",
		Start:         start,
		Duration:      rootEnd.Sub(start),
		StatusCode:    "OK",
	})
	checkTags(t, "root", root.Tags, map[string]any{
		"http.route":         "/v1/chat/completions",
		"span.kind":          "server",
		"otel.status_code":   "OK",
		"otel.scope.name":    "llmhedge/test",
		"otel.scope.version": "0.1.0",
	})

	// The child span: parent link, kind, typed tags, error status.
	checkSpan(t, child, Span{
		TraceID:       traceID,
		SpanID:        childID,
		ParentSpanID:  rootID,
		OperationName: "attempt",
		Service:       service,
		Kind:          "client",
		Start:         childStart,
		Duration:      childEnd.Sub(childStart),
		StatusCode:    "ERROR",
		StatusMessage: "upstream 503",
		Error:         true,
	})
	checkTags(t, "child", child.Tags, map[string]any{
		"llm.provider":            "openai",
		"attempt.index":           int64(2),
		"big.int":                 bigInt,
		"hedge.won":               true,
		"hedge.delay_ratio":       0.75,
		"hedge.budget":            2.0,
		"span.kind":               "client",
		"otel.status_code":        "ERROR",
		"otel.status_description": "upstream 503",
		"error":                   true,
		"otel.scope.name":         "llmhedge/test",
		"otel.scope.version":      "0.1.0",
	})
	if want := map[string]any{"deployment.environment": "test"}; !reflect.DeepEqual(child.Resource, want) {
		t.Errorf("child Resource = %#v, want %#v", child.Resource, want)
	}
	if len(child.Logs) != 1 {
		t.Fatalf("child Logs = %+v, want one event", child.Logs)
	}
	if l := child.Logs[0]; !l.Time.Equal(childStart.Add(time.Millisecond)) ||
		!reflect.DeepEqual(l.Fields, map[string]any{"event": "first.byte", "bytes": int64(42)}) {
		t.Errorf("child Logs[0] = %+v, want event first.byte with bytes=42 at %v", l, childStart.Add(time.Millisecond))
	}
	if len(root.Logs) != 0 {
		t.Errorf("root Logs = %+v, want none", root.Logs)
	}

	if got := j.Services(t); !reflect.DeepEqual(got, []string{service}) {
		t.Errorf("Services = %q, want [%q]", got, service)
	}
}

// A trace ID whose high 64 bits are zero comes back as 16 hex digits from
// Jaeger; Span.TraceID is still the 32-digit form.
func TestShortTraceIDIsPadded(t *testing.T) {
	j := Start(t)
	const traceID = "0000000000000000a3ce929d0e0e4736"
	now := time.Now()
	postOTLPJSON(t, j.OTLPHTTPEndpoint()+"/v1/traces", map[string]any{
		"resourceSpans": []any{map[string]any{
			"resource": map[string]any{"attributes": []any{attr("service.name", map[string]any{"stringValue": "short"})}},
			"scopeSpans": []any{map[string]any{"spans": []any{map[string]any{
				"traceId":           traceID,
				"spanId":            "0000000000000001",
				"name":              "only",
				"kind":              1, // INTERNAL
				"startTimeUnixNano": strconv.FormatInt(now.UnixNano(), 10),
				"endTimeUnixNano":   strconv.FormatInt(now.Add(time.Millisecond).UnixNano(), 10),
			}}}},
		}},
	})
	spans := j.Trace(t, traceID, 1)
	s := spans[0]
	if s.TraceID != traceID || s.SpanID != "0000000000000001" || s.Kind != "internal" || s.StatusCode != "" || s.Error {
		t.Fatalf("span = %+v, want trace %s, span 0000000000000001, kind internal, no status", s, traceID)
	}
	for _, key := range []string{"otel.status_code", "otel.status_description", "error", "otel.scope.name"} {
		if v, ok := s.Tags[key]; ok {
			t.Errorf("tag %s = %#v, want none for an unset status and an empty scope", key, v)
		}
	}
}

func attr(key string, value map[string]any) map[string]any {
	return map[string]any{"key": key, "value": value}
}

// postOTLPJSON posts body as OTLP/HTTP JSON and fails t unless the
// receiver accepts it.
func postOTLPJSON(t *testing.T, url string, body any) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	reply, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s: %s", url, resp.Status, reply)
	}
}

func checkSpan(t *testing.T, got, want Span) {
	t.Helper()
	if got.TraceID != want.TraceID || got.SpanID != want.SpanID || got.ParentSpanID != want.ParentSpanID ||
		got.OperationName != want.OperationName || got.Service != want.Service || got.Kind != want.Kind ||
		!got.Start.Equal(want.Start) || got.Duration != want.Duration ||
		got.StatusCode != want.StatusCode || got.StatusMessage != want.StatusMessage || got.Error != want.Error {
		t.Errorf("span %s:\n got  trace=%s span=%s parent=%q op=%q service=%q kind=%q start=%v duration=%v status=%q/%q error=%v\n want trace=%s span=%s parent=%q op=%q service=%q kind=%q start=%v duration=%v status=%q/%q error=%v",
			want.SpanID,
			got.TraceID, got.SpanID, got.ParentSpanID, got.OperationName, got.Service, got.Kind, got.Start, got.Duration, got.StatusCode, got.StatusMessage, got.Error,
			want.TraceID, want.SpanID, want.ParentSpanID, want.OperationName, want.Service, want.Kind, want.Start, want.Duration, want.StatusCode, want.StatusMessage, want.Error)
	}
}

// checkTags wants exactly the tags of want, each with its Go type.
func checkTags(t *testing.T, name string, got, want map[string]any) {
	t.Helper()
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s: tag %s missing; tags %#v", name, k, got)
			continue
		}
		if reflect.TypeOf(g) != reflect.TypeOf(w) || g != w {
			t.Errorf("%s: tag %s = %#v (%T), want %#v (%T)", name, k, g, g, w, w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected tag %s = %#v (%T)", name, k, g, g)
		}
	}
}
