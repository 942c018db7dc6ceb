package traefikplugin

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Standard library only and no select: `yaegi test` runs these too.

const (
	clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpan  = "00f067aa0ba902b7"
	clientTP    = "00-" + clientTrace + "-" + clientSpan + "-01"
)

// spanCollector is an OTLP/HTTP endpoint: each post's body and headers
// go to posts.
type spanCollector struct {
	srv   *httptest.Server
	posts chan collectedPost
}

type collectedPost struct {
	path    string
	header  http.Header
	body    []byte
	timeout bool
}

func startSpanCollector(t *testing.T) *spanCollector {
	c := &spanCollector{posts: make(chan collectedPost, 64)}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(func() { c.srv.Close() })
	return c
}

func (c *spanCollector) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	c.posts <- collectedPost{path: r.URL.Path, header: r.Header.Clone(), body: body}
	w.WriteHeader(http.StatusOK)
}

// nextSpans waits for the next post (the exporter sends within its 1 s
// interval) and returns its spans by name, in order.
func (c *spanCollector) nextSpans(t *testing.T) (collectedPost, []map[string]interface{}) {
	t.Helper()
	posts := c.posts
	timer := time.AfterFunc(10*time.Second, func() { posts <- collectedPost{timeout: true} })
	p := <-posts
	timer.Stop()
	if p.timeout {
		t.Fatal("no spans reached the collector within 10s")
	}
	var generic map[string]interface{}
	if err := json.Unmarshal(p.body, &generic); err != nil {
		t.Fatalf("post is not JSON: %v: %s", err, p.body)
	}
	var spans []map[string]interface{}
	for _, rs := range generic["resourceSpans"].([]interface{}) {
		for _, ss := range rs.(map[string]interface{})["scopeSpans"].([]interface{}) {
			for _, s := range ss.(map[string]interface{})["spans"].([]interface{}) {
				spans = append(spans, s.(map[string]interface{}))
			}
		}
	}
	return p, spans
}

// spanAttr is a span's attribute value as its OTLP JSON (stringValue,
// intValue, ...), nil when absent.
func spanAttr(s map[string]interface{}, key, kind string) interface{} {
	list, _ := s["attributes"].([]interface{})
	for _, a := range list {
		kv := a.(map[string]interface{})
		if kv["key"] == key {
			return kv["value"].(map[string]interface{})[kind]
		}
	}
	return nil
}

// tracedConfig is A and B with tracing to endpoint.
func tracedConfig(a, b *testUpstream, endpoint string) *Config {
	cfg := twoUpstreams(a, b, "10s")
	cfg.Tracing.OTLP.HTTP.Endpoint = endpoint
	cfg.Tracing.ServiceName = "edge"
	cfg.Tracing.OTLP.HTTP.Headers = map[string]string{"X-Collector-Key": "sekrit"}
	return cfg
}

// Through the plugin (compiled, and interpreted by yaegi test): a primary
// that fails with 503 and a retry that wins give the request span under
// the client's span, an attempt span under it for each, each attempt
// sending its own span as its traceparent's parent.
func TestTracedRequestThroughThePlugin(t *testing.T) {
	col := startSpanCollector(t)
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{status: 503} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{} })
	front := frontFor(t, newHedge(t, tracedConfig(a, b, col.srv.URL), "traced@test", nil, nil))
	hdr := http.Header{}
	hdr.Set("Traceparent", clientTP)
	hdr.Set("Tracestate", "congo=t61rcWkgMzE")
	checkWhole(t, readAnswer(post(t, front.URL, "tr-1", true, hdr)), "B", "tr-1", 3)

	sent := []string{a.lastHeader().Get("Traceparent"), b.lastHeader().Get("Traceparent")}
	for i, h := range []http.Header{a.lastHeader(), b.lastHeader()} {
		if got := h.Get("Tracestate"); got != "congo=t61rcWkgMzE" {
			t.Errorf("attempt %d tracestate %q, want the client's", i, got)
		}
	}
	if sent[0] == sent[1] {
		t.Errorf("both attempts sent traceparent %q, want one each", sent[0])
	}
	parents := make([]string, 2)
	for i, tp := range sent {
		parts := strings.Split(tp, "-")
		if len(parts) != 4 || parts[0] != "00" || parts[1] != clientTrace || parts[3] != "01" || len(parts[2]) != 16 {
			t.Fatalf("attempt %d traceparent %q, want 00-%s-<its span>-01", i, tp, clientTrace)
		}
		if parts[2] == clientSpan {
			t.Errorf("attempt %d sent the client's span %s as parent, want its own", i, clientSpan)
		}
		parents[i] = parts[2]
	}

	post, spans := col.nextSpans(t)
	if post.path != "/v1/traces" || post.header.Get("X-Collector-Key") != "sekrit" {
		t.Errorf("post to %s with X-Collector-Key %q, want /v1/traces with the configured header", post.path, post.header.Get("X-Collector-Key"))
	}
	if len(spans) != 3 {
		t.Fatalf("%d spans, want the request and two attempts", len(spans))
	}
	req := spans[0]
	if req["name"] != "llm_hedge" || req["parentSpanId"] != clientSpan || req["traceId"] != clientTrace {
		t.Fatalf("request span %v (parent %v, trace %v), want llm_hedge under %s of %s", req["name"], req["parentSpanId"], req["traceId"], clientSpan, clientTrace)
	}
	for i, s := range spans[1:] {
		if s["name"] != "llm_hedge.attempt" || s["parentSpanId"] != req["spanId"] {
			t.Errorf("attempt %d span %v under %v, want llm_hedge.attempt under the request span %v", i, s["name"], s["parentSpanId"], req["spanId"])
		}
		if s["spanId"] != parents[i] {
			t.Errorf("attempt %d span id %v, but its upstream got parent %s", i, s["spanId"], parents[i])
		}
	}
	for _, c := range []struct {
		span       int
		key, value string
	}{
		{1, "llmhedge.attempt.upstream", "A"}, {1, "llmhedge.attempt.role", "primary"}, {1, "llmhedge.attempt.result", "failed"},
		{1, "error.type", "503"}, {2, "llmhedge.attempt.upstream", "B"}, {2, "llmhedge.attempt.role", "retry"},
		{2, "llmhedge.attempt.result", "won"}, {0, "llmhedge.outcome", "ok"}, {0, "gen_ai.request.model", "m"},
	} {
		if got := spanAttr(spans[c.span], c.key, "stringValue"); got != c.value {
			t.Errorf("span %d %s = %v, want %q", c.span, c.key, got, c.value)
		}
	}
	if got := spanAttr(spans[0], "llmhedge.attempts", "intValue"); got != "2" {
		t.Errorf("request span llmhedge.attempts = %v, want \"2\"", got)
	}
}

// Tracing is off unless an endpoint is set: the client's trace headers
// reach the upstream unchanged and no exporter is made. A parent that is
// not sampled leaves a traced route's request untraced, headers unchanged.
func TestUntracedRequestsKeepTheClientsHeaders(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{} })
	off := newHedge(t, twoUpstreams(a, b, "10s"), "off@test", nil, nil)
	if off.(*Hedge).tracing != nil {
		t.Fatal("tracing is on without tracing.otlp.http.endpoint")
	}
	col := startSpanCollector(t)
	on := newHedge(t, tracedConfig(a, b, col.srv.URL+"/unsampled"), "unsampled@test", nil, nil)
	unsampled := "00-" + clientTrace + "-" + clientSpan + "-00"
	for _, c := range []struct {
		h  http.Handler
		tp string
	}{{off, clientTP}, {on, unsampled}} {
		hdr := http.Header{}
		hdr.Set("Traceparent", c.tp)
		hdr.Set("Tracestate", "congo=t61rcWkgMzE")
		checkWhole(t, readAnswer(post(t, frontFor(t, c.h).URL, "un-1", true, hdr)), "A", "un-1", 3)
		got := a.lastHeader()
		if got.Get("Traceparent") != c.tp || got.Get("Tracestate") != "congo=t61rcWkgMzE" {
			t.Errorf("upstream got traceparent %q tracestate %q, want the client's %q unchanged", got.Get("Traceparent"), got.Get("Tracestate"), c.tp)
		}
	}
	// A sampled request after the unsampled one: the collector's next
	// post holds its spans only.
	sampled := "00-" + strings.Repeat("ab", 16) + "-" + clientSpan + "-01"
	hdr := http.Header{}
	hdr.Set("Traceparent", sampled)
	checkWhole(t, readAnswer(post(t, frontFor(t, on).URL, "un-2", true, hdr)), "A", "un-2", 3)
	_, spans := col.nextSpans(t)
	if len(spans) != 2 {
		t.Fatalf("%d spans posted, want 2 (the sampled request and its attempt)", len(spans))
	}
	for _, s := range spans {
		if s["traceId"] != strings.Repeat("ab", 16) {
			t.Errorf("span %v of trace %v exported, want only the sampled trace's", s["name"], s["traceId"])
		}
	}
}

func TestTracingOptionsAreChecked(t *testing.T) {
	cases := []struct {
		edit func(*Tracing)
		want string
	}{
		{func(c *Tracing) { c.OTLP.HTTP.Endpoint = "ftp://collector:4318" }, `tracing.otlp.http.endpoint: endpoint scheme "ftp"`},
		{func(c *Tracing) { c.OTLP.HTTP.Endpoint = "collector:4318" }, "tracing.otlp.http.endpoint"},
		{func(c *Tracing) { c.OTLP.HTTP.Endpoint = "http://" }, "no host"},
		{func(c *Tracing) { c.SampleRate = 1.5 }, "tracing.sampleRate 1.5"},
		{func(c *Tracing) { c.SampleRate = -0.1 }, "tracing.sampleRate -0.1"},
		{func(c *Tracing) { c.OTLP.HTTP.Headers = map[string]string{"Bad Name": "sekrit"} }, `tracing.otlp.http.headers: header name "Bad Name"`},
		{func(c *Tracing) { c.OTLP.HTTP.Headers = map[string]string{"Authorization": "sekrit\nX: y"} }, "Authorization"},
	}
	for i, c := range cases {
		cfg := CreateConfig()
		cfg.Upstreams = []Upstream{{URL: "http://127.0.0.1:9001"}}
		cfg.Tracing.OTLP.HTTP.Endpoint = "http://127.0.0.1:4318"
		c.edit(&cfg.Tracing)
		_, err := New(context.Background(), http.NotFoundHandler(), cfg, "bad")
		if err == nil {
			t.Errorf("case %d: New accepted it", i)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("case %d: error %q does not mention %q", i, err, c.want)
		}
		if strings.Contains(err.Error(), "sekrit") {
			t.Errorf("case %d: error %q shows a header's value", i, err)
		}
	}
	// Defaults are Traefik's, and off.
	cfg := CreateConfig()
	if cfg.Tracing.ServiceName != "traefik" || cfg.Tracing.SampleRate != 1 || cfg.Tracing.OTLP.HTTP.Endpoint != "" {
		t.Errorf("CreateConfig tracing %+v, want serviceName traefik, sampleRate 1, no endpoint (off)", cfg.Tracing)
	}
	// An endpoint alone is enough; the rate may be 0 (only sampled parents).
	cfg.Upstreams = []Upstream{{URL: "http://127.0.0.1:9001"}}
	cfg.Tracing.OTLP.HTTP.Endpoint = "https://collector.example:4318/v1/traces"
	cfg.Tracing.SampleRate = 0
	if _, err := New(context.Background(), http.NotFoundHandler(), cfg, "good"); err != nil {
		t.Errorf("a valid tracing section: %v", err)
	}
}

// New makes no exporter and starts nothing; every router and reload with
// the same endpoint, service and headers shares one exporter, made on the
// first request.
func TestExportersAreSharedAndMadeLazily(t *testing.T) {
	col := startSpanCollector(t)
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{} })
	endpoint := col.srv.URL + "/shared-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	exportersBefore := len(exporters.exporters)
	goroutinesBefore := goroutinesOfOurs()
	var handlers []http.Handler
	for i := 0; i < 10; i++ {
		cfg := tracedConfig(a, b, endpoint)
		cfg.Route = "shared-router-" + strconv.Itoa(i%2)
		if i >= 5 {
			cfg.Delay = "3s" // a reload with another option
		}
		handlers = append(handlers, newHedge(t, cfg, "router"+strconv.Itoa(i%2), nil, nil))
	}
	if after := goroutinesOfOurs(); len(after) > len(goroutinesBefore) {
		t.Fatalf("New started goroutines: %d before, %d after:\n%s\nbefore:\n%s", len(goroutinesBefore), len(after), strings.Join(after, "\n"), strings.Join(goroutinesBefore, "\n"))
	}
	if n := len(exporters.exporters); n != exportersBefore {
		t.Fatalf("New made %d exporters, want none before a request", n-exportersBefore)
	}
	for i, h := range handlers {
		if _, err := h.(*Hedge).engine(); err != nil {
			t.Fatalf("handler %d: %v", i, err)
		}
	}
	if n := len(exporters.exporters); n != exportersBefore+1 {
		t.Fatalf("10 handlers of one tracing configuration made %d exporters, want 1", n-exportersBefore)
	}
	other := tracedConfig(a, b, endpoint)
	other.Tracing.OTLP.HTTP.Headers = map[string]string{"X-Collector-Key": "another"}
	if _, err := newHedge(t, other, "router0", nil, nil).(*Hedge).engine(); err != nil {
		t.Fatal(err)
	}
	if n := len(exporters.exporters); n != exportersBefore+2 {
		t.Fatalf("other headers: %d exporters made, want 2", n-exportersBefore)
	}
}

// metricsPath shows the exporters' counts once tracing is used.
func TestTraceCountersOnTheMetricsPath(t *testing.T) {
	col := startSpanCollector(t)
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{} })
	cfg := tracedConfig(a, b, col.srv.URL+"/metrics-"+strconv.FormatInt(time.Now().UnixNano(), 10))
	cfg.MetricsPath = "/llmhedge/metrics"
	h := newHedge(t, cfg, "metrics-traced@test", nil, nil)
	checkWhole(t, readAnswer(post(t, frontFor(t, h).URL, "mt-1", true, nil)), "A", "mt-1", 3)
	col.nextSpans(t)
	body := scrape(t, h, http.MethodGet, "/llmhedge/metrics").Body.String()
	for _, name := range []string{"llm_hedge_trace_spans_exported_total", "llm_hedge_trace_spans_dropped_total",
		"llm_hedge_trace_spans_failed_total", "llm_hedge_trace_export_failures_total"} {
		if !strings.Contains(body, "# TYPE "+name+" counter\n"+name+" ") {
			t.Errorf("metrics lack the counter %s:\n%s", name, body)
		}
	}
}
