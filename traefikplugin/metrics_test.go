package traefikplugin

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core"
)

// chatRequest is a streaming chat request for a handler served in-process.
func chatRequest(id string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Request-Id", id)
	return r
}

func scrape(t *testing.T, h http.Handler, method, path string) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(method, path, nil))
	return w
}

func TestMetricsPathAnswersTheSharedMetrics(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{ttft: -1} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{} })
	cfg := twoUpstreams(a, b, "20ms")
	cfg.MetricsPath = "/llmhedge/metrics"
	h := newHedge(t, cfg, "metrics@test", nil, nil)
	// Served in-process: the report is counted before ServeHTTP returns.
	w := httptest.NewRecorder()
	h.ServeHTTP(w, chatRequest("m1"))
	if w.Code != http.StatusOK {
		t.Fatalf("status %d, want 200", w.Code)
	}

	// Another middleware (another router) with the path answers the same
	// process-wide store.
	cfg2 := twoUpstreams(a, b, "20ms")
	cfg2.MetricsPath = "/llmhedge/metrics"
	other := newHedge(t, cfg2, "metrics-other@test", nil, nil)
	got := scrape(t, other, http.MethodGet, "/llmhedge/metrics")
	if got.Code != http.StatusOK {
		t.Fatalf("metrics path: got.Code = %v, want http.StatusOK", got.Code)
	} else if got.Header().Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" {
		t.Fatalf("metrics path: got.Header().Get(\"Content-Type\") = %q, want \"text/plain; version=0.0.4; charset=utf-8\"", got.Header().Get("Content-Type"))
	}
	text := got.Body.String()
	for _, want := range []string{
		"# HELP llm_hedge_requests_total Requests handled,",
		"# TYPE llm_hedge_requests_total counter\n",
		`llm_hedge_requests_total{route="metrics@test",outcome="ok"} 1` + "\n",
		`llm_hedge_hedge_wins_total{route="metrics@test",upstream="B",role="hedge"} 1` + "\n",
		"# TYPE llm_hedge_ttft_seconds histogram\n",
		`llm_hedge_ttft_seconds_bucket{route="metrics@test",le="60"} 1` + "\n",
		`llm_hedge_ttft_seconds_bucket{route="metrics@test",le="+Inf"} 1` + "\n",
		`llm_hedge_ttft_seconds_count{route="metrics@test"} 1` + "\n",
		`llm_hedge_loser_cancel_seconds_count{route="metrics@test",upstream="A"} 1` + "\n",
		"# TYPE llm_hedge_current_delay_seconds gauge\n",
		`llm_hedge_current_delay_seconds{route="metrics@test"} 0.02` + "\n",
		`llm_hedge_hedges_in_flight{route="metrics@test"} 0` + "\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the scrape lacks %q", want)
		}
	}
	if !strings.HasSuffix(text, "\n") {
		t.Errorf("the scrape does not end with a newline")
	}

	if got := scrape(t, other, http.MethodPost, "/llmhedge/metrics"); got.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST to the metrics path: status %d, want 405", got.Code)
	}
}

func TestMetricsPathOffByDefault(t *testing.T) {
	if p := CreateConfig().MetricsPath; p != "" {
		t.Fatalf("default metricsPath %q, want off", p)
	}
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{} })
	h := newHedge(t, twoUpstreams(a, b, "20ms"), "unmetered@test", nil, nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, chatRequest("u1"))
	if w.Code != http.StatusOK {
		t.Fatalf("status %d, want 200", w.Code)
	}
	// The path is not answered but proxied like any other.
	if got := scrape(t, h, http.MethodGet, "/llmhedge/metrics"); strings.Contains(got.Body.String(), "llm_hedge_") {
		t.Fatalf("a middleware without metricsPath answered it: %q", got.Body.String())
	}
	// Its requests are not counted: the store has no series of its route.
	if text := string(sharedMetrics.exposition()); strings.Contains(text, `route="unmetered@test"`) {
		t.Errorf("a middleware without metricsPath was counted:\n%s", text)
	}
}

func TestMetricsPathMustBeAPath(t *testing.T) {
	cfg := CreateConfig()
	cfg.Upstreams = []Upstream{{Name: "A", URL: "http://127.0.0.1:1"}}
	cfg.MetricsPath = "llmhedge/metrics"
	if _, err := New(context.Background(), nil, cfg, "bad"); err == nil {
		t.Fatalf("New: err = nil, want an error")
	} else if !strings.Contains(err.Error(), `metricsPath "llmhedge/metrics" must start with /`) {
		t.Fatalf("New: err.Error() = %q, want it to contain `metricsPath \"llmhedge/metrics\" must start with /`", err.Error())
	}
}

func TestMetricsExpositionEscapesLabelValues(t *testing.T) {
	s := &metricStore{}
	s.Record(0, []string{"a\"b\\c\nd", "ok"}, 1)
	s.Record(0, []string{"a\"b\\c\nd", "ok"}, 2)
	want := `llm_hedge_requests_total{route="a\"b\\c\nd",outcome="ok"} 3` + "\n"
	if text := string(s.exposition()); !strings.Contains(text, want) {
		t.Errorf("exposition\n%s\nlacks %s", text, want)
	}
}

// A gauge recorded through the sink (the fleet's up and replicas) is set,
// not added up, and appears in the exposition.
func TestMetricsRecordedGaugesAreSet(t *testing.T) {
	s := &metricStore{}
	s.Record(core.MetricFleetUp, []string{"redis:6379/0"}, 1)
	s.Record(core.MetricFleetUp, []string{"redis:6379/0"}, 0)
	s.Record(core.MetricFleetReplicas, []string{"redis:6379/0"}, 5)
	text := string(s.exposition())
	for _, want := range []string{`llm_hedge_fleet_up{fleet="redis:6379/0"} 0`, `llm_hedge_fleet_replicas{fleet="redis:6379/0"} 5`} {
		if !strings.Contains(text, want) {
			t.Errorf("exposition lacks %q:\n%s", want, text)
		}
	}
}
