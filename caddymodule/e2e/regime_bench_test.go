package e2e

import (
	"fmt"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/regimeload"
)

// TestBenchRegimeShift runs the regime-shift benchmark (upstream A 8x
// slower for 30s of every 80s, scaled; see internal/testkit/regimeload)
// through the real Caddy: `primary ordered` against `primary fastest`, one
// site per route. CI runs a few hundred requests per route and only logs;
// LLMHEDGE_BENCH=1 runs 4,000 per route and checks the bounds:
//
//	LLMHEDGE_BENCH=1 go test -run TestBenchRegimeShift -v ./caddymodule/e2e
func TestBenchRegimeShift(t *testing.T) {
	opts := regimeload.EnvOptions(0)
	regimeload.Bench(t, "caddy", startRegimeSites, opts)
}

// startRegimeSites serves each route as a Caddy site of its own.
func startRegimeSites(t *testing.T, routes []regimeload.Route) map[string]string {
	var sites []string
	for _, r := range routes {
		prefer := ""
		if r.PreferA != 0 {
			prefer = fmt.Sprintf("\n\t\t\tprefer_margin %g%%", 100*r.PreferA)
		}
		sites = append(sites, fmt.Sprintf(`	llm_hedge {
		route %s
		primary %s
		upstream %s {
			name A%s
		}
		upstream %s {
			name B
		}
		delay adaptive %v
		budget {
			burst %g
		}
		report_header %s
	}`, r.Name, r.Primary, r.A, prefer, r.B, r.Delay, r.Burst, regimeload.ReportHeader))
	}
	c := startCaddy(t, "", sites...)
	bases := map[string]string{}
	for i, r := range routes {
		bases[r.Name] = c.url(i) + "/v1/"
	}
	return bases
}
