package e2e

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/validitysuite"
)

// TestValidate: through real Traefik (the plugin interpreted by Yaegi),
// with `validate: [json_schema]` the client never receives the fast
// upstream's schema-invalid answer; without it the invalid fast answer wins
// (today's behaviour). A route to the valid upstream alone, with and
// without validate, gives the cost of the check. 20 requests a route, 200
// with LLMHEDGE_BENCH=1.
func TestValidate(t *testing.T) {
	n := 20
	if os.Getenv("LLMHEDGE_BENCH") == "1" {
		n = 200
	}
	aURL, bURL := validitysuite.Sims(t)
	ab := [][2]string{{"A", aURL}, {"B", bURL}}
	onlyB := [][2]string{{"B", bURL}}
	d := newDynamic("g1").
		hedge("hedge-val", pluginConfig(ab, "delay: 500ms", "validate: [json_schema]", "log: off")).
		route("val", "noop@internal", "hedge-val").
		hedge("hedge-plain", pluginConfig(ab, "delay: 500ms", "log: off")).
		route("plain", "noop@internal", "hedge-plain").
		hedge("hedge-direct", pluginConfig(onlyB, "delay: 500ms", "log: off")).
		route("direct", "noop@internal", "hedge-direct").
		hedge("hedge-directval", pluginConfig(onlyB, "delay: 500ms", "validate: [json_schema]", "log: off")).
		route("directval", "noop@internal", "hedge-directval")
	tr := startTraefik(t, "INFO", d)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client := &http.Client{}
	validated := llmsim.StructuredLoad(ctx, client, tr.URL+"/val", n, 5)
	plain := llmsim.StructuredLoad(ctx, client, tr.URL+"/plain", n, 5)
	direct := llmsim.StructuredLoad(ctx, client, tr.URL+"/direct", n, 5)
	directValidated := llmsim.StructuredLoad(ctx, client, tr.URL+"/directval", n, 5)
	validitysuite.Check(t, validitysuite.Results{N: n, Validated: validated, Plain: plain, Direct: direct, DirectValidated: directValidated})
}
