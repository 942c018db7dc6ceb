package e2e

import (
	"fmt"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/regimeload"
)

// TestBenchRegimeShift is regimeload's regime-shift benchmark through the
// real Caddy, one site per route; its long form (regimeload.EnvOptions) is
// LLMHEDGE_BENCH=1 go test -run TestBenchRegimeShift -v ./caddymodule/e2e.
func TestBenchRegimeShift(t *testing.T) {
	regimeload.Bench(t, "caddy", startRegimeSites, regimeload.EnvOptions(0))
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
