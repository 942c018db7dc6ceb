package e2e

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
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
	a := &llmsim.Structured{Name: "A", Valid: false, Delay: 5 * time.Millisecond, Gap: 2 * time.Millisecond}
	b := &llmsim.Structured{Name: "B", Valid: true, Delay: 40 * time.Millisecond, Gap: 2 * time.Millisecond}
	as, bs := llmsim.StartStructured(a), llmsim.StartStructured(b)
	defer as.Close()
	defer bs.Close()
	ab := [][2]string{{"A", as.URL}, {"B", bs.URL}}
	onlyB := [][2]string{{"B", bs.URL}}
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
	t.Logf("A+B, validate [json_schema]: %s", validated.Summary())
	t.Logf("A+B, no validate:            %s", plain.Summary())
	t.Logf("B alone, no validate:        %s", direct.Summary())
	t.Logf("B alone, validate:           %s", directValidated.Summary())
	if validated.Invalid != 0 {
		t.Errorf("with validate: %d of %d answers invalid, want 0", validated.Invalid, n)
	} else if validated.Valid != n {
		t.Errorf("with validate: %d of %d answers valid (%d failed: %v), want all", validated.Valid, n, validated.Failed, validated.Errors)
	}
	if plain.Invalid != n {
		t.Errorf("without validate: %d of %d answers invalid, want all (A's fast answer wins)", plain.Invalid, n)
	}
	if directValidated.Valid != n {
		t.Errorf("B alone with validate: %d of %d answers valid (%d failed: %v), want all", directValidated.Valid, n, directValidated.Failed, directValidated.Errors)
	}
}
