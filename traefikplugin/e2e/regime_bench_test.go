package e2e

import (
	"fmt"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/regimeload"
)

// TestBenchRegimeShift is regimeload's regime-shift benchmark through the
// real Traefik (the plugin interpreted by Yaegi), one middleware and router
// per route; its long form (regimeload.EnvOptions) is LLMHEDGE_BENCH=1 go
// test -run TestBenchRegimeShift -v ./traefikplugin/e2e.
func TestBenchRegimeShift(t *testing.T) {
	regimeload.Bench(t, "traefik", startRegimeMiddlewares, regimeload.EnvOptions(1.25))
}

// startRegimeMiddlewares serves each route under /<route>/ through a
// plugin middleware of its own.
func startRegimeMiddlewares(t *testing.T, routes []regimeload.Route) map[string]string {
	d := newDynamic("regime")
	for _, r := range routes {
		prefer := ""
		if r.PreferA != 0 {
			prefer = fmt.Sprintf("\n    preferMargin: %g", r.PreferA)
		}
		cfg := fmt.Sprintf(`route: %s
primary: %s
upstreams:
  - name: A
    url: %s%s
  - name: B
    url: %s
delayMode: adaptive
delay: %v
budget:
  burst: %g
reportHeader: %s
log: off
`, r.Name, r.Primary, r.A, prefer, r.B, r.Delay, r.Burst, regimeload.ReportHeader)
		d.hedge("hedge-"+r.Name, cfg).route(r.Name, "noop@internal", "hedge-"+r.Name)
	}
	tr := startTraefik(t, "ERROR", d)
	bases := map[string]string{}
	for _, r := range routes {
		bases[r.Name] = tr.URL + "/" + r.Name + "/v1/"
	}
	return bases
}
