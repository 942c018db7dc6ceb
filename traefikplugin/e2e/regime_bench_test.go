package e2e

import (
	"fmt"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/regimeload"
)

// TestBenchRegimeShift runs the regime-shift benchmark (upstream A 8x
// slower for 30s of every 80s, scaled; see internal/testkit/regimeload)
// through the real Traefik, the plugin interpreted by Yaegi: `primary
// ordered` against `primary fastest`, one middleware and router per route.
// CI runs a few hundred requests per route and only logs; LLMHEDGE_BENCH=1
// runs 4,000 per route and checks the bounds:
//
//	LLMHEDGE_BENCH=1 go test -run TestBenchRegimeShift -v ./traefikplugin/e2e
func TestBenchRegimeShift(t *testing.T) {
	opts := regimeload.EnvOptions(1.25)
	regimeload.Bench(t, "traefik", startRegimeMiddlewares, opts)
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
