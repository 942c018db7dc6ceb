package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/internal/metricscheck"
)

// metricValue sums the samples of metric family name whose labels include
// every pair of want (see metricscheck.Value).
func metricValue(t *testing.T, text, name string, want map[string]string) (float64, bool) {
	t.Helper()
	return metricscheck.Value(metricscheck.Parse(t, text), name, want)
}

// TestMetricsOnCaddyMetricsEndpoint: after metricscheck.Traffic the
// llm_hedge_* metrics of core.MetricDefs appear on
// Caddy's admin /metrics and on a `metrics` handler, beside Caddy's own,
// and keep counting across a config reload.
func TestMetricsOnCaddyMetricsEndpoint(t *testing.T) {
	a, b := startSims(t)
	// The budget holds one hedge (burst 1, a ratio that earns no other in
	// two requests): m-1's. m-2 cannot hedge however slow A is.
	c := startCaddy(t, "", hedgeSite(a, b, "\t\tbudget {\n\t\t\tratio 0.01\n\t\t\tburst 1\n\t\t}"), "\tmetrics")
	ctx := testContext(t)
	if err := streamChat(ctx, sdkClient(c.url(0), "m-1", "A=stall")).fromOnly("B", "m-1"); err != nil {
		t.Fatal(err)
	}
	if err := streamChat(ctx, sdkClient(c.url(0), "m-2", "")).fromOnly("A", "m-2"); err != nil {
		t.Fatal(err)
	}
	c.waitLog("llm_hedge request", 2, nil) // both requests are over and observed

	route := map[string]string{"route": "e2e"}
	check := func(source, text string) {
		// The names, types, labels and values every adapter is held to
		// after this traffic (the Envoy server and the Traefik plugin too).
		metricscheck.Check(t, source, text, "e2e", 0.05)
		// Caddy's own metrics, in the same registry (at least our two
		// requests; the server names depend on the port order).
		if got, _ := metricValue(t, text, "caddy_http_requests_total", map[string]string{}); got < 2 {
			t.Errorf("%s: caddy_http_requests_total = %v, want at least 2", source, got)
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
