package e2e

import (
	"fmt"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/conformance"
)

// TestConformance runs the behaviour every adapter shares
// (internal/testkit/conformance) through the real Caddy: one site per
// route, each with its own llm_hedge route.
func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T, env *conformance.Env, routes []conformance.Route) map[string]string {
		sites := make([]string, 0, len(routes))
		for _, r := range routes {
			sites = append(sites, fmt.Sprintf(`	llm_hedge {
		route %s
		upstream %s {
			name A
		}
		upstream %s {
			name B
		}
		delay %s
	}`, r.Name, env.A.URL, env.B.URL, r.Delay))
		}
		c := startCaddy(t, "", sites...)
		urls := map[string]string{}
		for i, r := range routes {
			urls[r.Name] = c.url(i) + "/v1/"
		}
		return urls
	})
}
