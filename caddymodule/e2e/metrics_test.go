package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// metricValue sums the samples of metric family name whose labels include
// every pair of want (a counter or gauge value, or a histogram's count).
func metricValue(t *testing.T, text, name string, want map[string]string) (float64, bool) {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	family, ok := families[name]
	if !ok {
		return 0, false
	}
	sum, found := 0.0, false
	for _, m := range family.GetMetric() {
		if !hasLabels(m, want) {
			continue
		}
		found = true
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, found
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	matched := 0
	for _, pair := range m.GetLabel() {
		if v, ok := want[pair.GetName()]; ok && v == pair.GetValue() {
			matched++
		}
	}
	return matched == len(want)
}

// TestMetricsOnCaddyMetricsEndpoint: the llm_hedge_* metrics appear on
// Caddy's admin /metrics and on a `metrics` handler, beside Caddy's own,
// and keep counting across a config reload.
func TestMetricsOnCaddyMetricsEndpoint(t *testing.T) {
	a, b := startSims(t)
	c := startCaddy(t, "", hedgeSite(a, b, ""), "\tmetrics")
	ctx := testContext(t)
	if err := streamChat(ctx, sdkClient(c.url(0), "m-1", "A=stall")).fromOnly("B", "m-1"); err != nil {
		t.Fatal(err)
	}
	if err := streamChat(ctx, sdkClient(c.url(0), "m-2", "")).fromOnly("A", "m-2"); err != nil {
		t.Fatal(err)
	}
	c.waitLog("llm_hedge request", 2, nil) // both requests are over and observed

	route := map[string]string{"route": "e2e"}
	with := func(pairs ...string) map[string]string {
		m := map[string]string{"route": "e2e"}
		for i := 0; i+1 < len(pairs); i += 2 {
			m[pairs[i]] = pairs[i+1]
		}
		return m
	}
	check := func(source, text string) {
		for _, tc := range []struct {
			name   string
			labels map[string]string
			want   float64
		}{
			// Both requests, whatever their outcome: the SDK closes the
			// stream at [DONE], which core may count as client_gone
			// (reported in /tmp/core-bugs.md).
			{"llm_hedge_requests_total", route, 2},
			{"llm_hedge_attempts_total", with("upstream", "A", "role", "primary", "result", "lost"), 1},
			{"llm_hedge_attempts_total", with("upstream", "B", "role", "hedge", "result", "won"), 1},
			{"llm_hedge_attempts_total", with("upstream", "A", "role", "primary", "result", "won"), 1},
			{"llm_hedge_hedges_started_total", route, 1},
			{"llm_hedge_hedge_wins_total", with("upstream", "B", "role", "hedge"), 1},
			{"llm_hedge_current_delay_seconds", route, 0.05},
			{"llm_hedge_hedges_in_flight", route, 0},
			{"llm_hedge_ttft_seconds", route, 2},
			{"llm_hedge_upstream_ttft_seconds", with("upstream", "B"), 1},
			{"llm_hedge_cancel_latency_seconds", route, 1},
			{"llm_hedge_request_duration_seconds", route, 2},
			{"llm_hedge_wasted_prompt_tokens_total", route, 0}, // checked for presence below
			// Caddy's own metrics, in the same registry (at least our two
			// requests; the server names depend on the port order).
			{"caddy_http_requests_total", map[string]string{}, 2},
		} {
			got, found := metricValue(t, text, tc.name, tc.labels)
			if !found {
				t.Errorf("%s: no %s%v", source, tc.name, tc.labels)
				continue
			}
			switch tc.name {
			case "llm_hedge_wasted_prompt_tokens_total":
				continue
			case "caddy_http_requests_total":
				if got < tc.want {
					t.Errorf("%s: %s = %v, want at least %v", source, tc.name, got, tc.want)
				}
				continue
			}
			if got != tc.want {
				t.Errorf("%s: %s%v = %v, want %v", source, tc.name, tc.labels, got, tc.want)
			}
		}
	}
	check("admin /metrics", c.metrics())

	// The `metrics` handler of the second site serves the same registry.
	resp, err := http.Get(c.url(1) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	site, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	check("metrics handler", string(site))

	// A reload re-registers the same collectors: counters keep counting,
	// the delay gauge follows the new config.
	if err := c.load(strings.Replace(hedgeSite(a, b, ""), "delay 50ms", "delay 70ms", 1), "\tmetrics"); err != nil {
		t.Fatal(err)
	}
	after := c.metrics()
	if got, _ := metricValue(t, after, "llm_hedge_requests_total", route); got != 2 {
		t.Errorf("after the reload, llm_hedge_requests_total = %v, want 2", got)
	}
	if got, _ := metricValue(t, after, "llm_hedge_current_delay_seconds", route); got != 0.07 {
		t.Errorf("after the reload, llm_hedge_current_delay_seconds = %v, want 0.07", got)
	}
}
