package envoyfilter_test

import (
	"context"
	"io"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmhedge/llmhedge/internal/metricscheck"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestMetricNamesSharedWithOtherAdapters: after metricscheck.Traffic the
// server's /metrics carries core.MetricDefs' names, types, label names and
// buckets, the same the Caddy module and the Traefik plugin are checked
// against.
func TestMetricNamesSharedWithOtherAdapters(t *testing.T) {
	// The budget holds one hedge (burst 1, a ratio that earns no other in
	// two requests): names-1's. names-2 cannot hedge however slow A is.
	h := newHarness(t, harnessOptions{routes: defaultRoutes + "    budget: {ratio: 0.01, burst: 1}\n"})
	for _, req := range []struct{ id, behavior, from string }{{"names-1", "A=stall", "B"}, {"names-2", "", "A"}} {
		text, from, err := streamChat(context.Background(), h.client(), simHeaders(req.id, req.behavior)...)
		if err != nil {
			t.Fatalf("%s: %v", req.id, err)
		} else if text != llmsim.ExpectedChatText(req.id, tokens) {
			t.Fatalf("%s: text = %q, want %q", req.id, text, llmsim.ExpectedChatText(req.id, tokens))
		} else if !from[req.from] {
			t.Fatalf("%s: %q from %v, %v; want %s's whole answer", req.id, text, from, err, req.from)
		} else if len(from) != 1 {
			t.Fatalf("%s: len(from) = %v, want 1", req.id, len(from))
		}
		h.report() // observed: counted
	}
	srv := httptest.NewServer(promhttp.HandlerFor(h.srv.Metrics().Registry, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	metricscheck.Check(t, "envoy server /metrics", string(body), "chat", 0.1,
		"llm_hedge_extproc_streams_total", "llm_hedge_extproc_streams_in_flight", "llm_hedge_config_reloads_total")
}
