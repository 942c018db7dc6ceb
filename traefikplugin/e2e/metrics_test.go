package e2e

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/llmhedge/llmhedge/internal/metricscheck"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestMetricsPathThroughTraefik: after metricscheck.Traffic through real
// Traefik (the plugin interpreted by Yaegi), metricsPath answers with
// core.MetricDefs' names, types, label names and buckets, the same the Caddy
// module and the Envoy server are checked against. The two requests go
// through two routers whose middlewares share the route: the counts are
// process-wide.
func TestMetricsPathThroughTraefik(t *testing.T) {
	wl := functionalWorkload()
	a, b := llmsim.Start("A", wl), llmsim.Start("B", wl)
	defer a.Close()
	defer b.Close()
	ab := [][2]string{{"A", a.URL}, {"B", b.URL}}
	// One hedge in the budget's bucket and next to no refill: request 1 (A
	// stalls) hedges, request 2 cannot, however long A takes on a loaded
	// machine (metricscheck wants exactly one hedge started).
	cfg := pluginConfig(ab, "route: names", "delay: 200ms", "log: stderr", "metricsPath: /llmhedge/metrics",
		"budget:", "  ratio: 0.01", "  burst: 1")
	d := newDynamic("m1").
		hedge("hedge-names1", cfg).route("names1", "noop@internal", "hedge-names1").
		hedge("hedge-names2", cfg).route("names2", "noop@internal", "hedge-names2")
	tr := startTraefik(t, "INFO", d)
	ctx := context.Background()

	for _, req := range []struct{ router, id, behavior, from string }{
		{"names1", "names-1", "A=stall", "B"},
		{"names2", "names-2", "", "A"},
	} {
		r := streamChat(ctx, sdk(tr.URL+"/"+req.router+"/v1/"), req.id, req.behavior, nil)
		if up, ok := r.whole(req.id, wl.WithDefaults().Tokens); !ok {
			t.Fatalf("%s: %s", req.id, r.notWhole(req.id, wl.WithDefaults().Tokens))
		} else if up != req.from {
			t.Fatalf("%s answered by %q, want %s", req.id, up, req.from)
		}
		// The line is written after the request's metrics are counted.
		tr.waitLogLine(`"middleware":"hedge-` + req.router + `@file"`)
	}
	resp, err := http.Get(tr.URL + "/names1/llmhedge/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("metricsPath through Traefik: status %d: %s", resp.StatusCode, body)
	}
	metricscheck.Check(t, "real Traefik metricsPath", string(body), "names", 0.2)
}
