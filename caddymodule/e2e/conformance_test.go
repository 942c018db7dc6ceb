package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/clientsuite"
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

// TestClients runs the official SDKs, with their own timeouts and retries,
// through the real Caddy (internal/testkit/clientsuite): one site per route.
func TestClients(t *testing.T) {
	clientsuite.Run(t, func(t *testing.T, env *clientsuite.Env, routes []clientsuite.Route) map[string]string {
		sites := make([]string, 0, len(routes))
		for _, r := range routes {
			extra := r.Extra(caddyfileSetting)
			sites = append(sites, fmt.Sprintf(`	llm_hedge {
		route %s
		upstream %s {
			name A
		}
		upstream %s {
			name B
		}
		delay %s
%s	}`, r.Name, env.A.URL, env.B.URL, r.Delay, extra))
		}
		c := startCaddy(t, "", sites...)
		urls := map[string]string{}
		for i, r := range routes {
			urls[r.Name] = c.url(i)
		}
		return urls
	})
}

// caddyfileSetting writes a route setting as a Caddyfile line of the
// llm_hedge block (a flag is its name alone).
func caddyfileSetting(set clientsuite.Setting) string {
	return "\t\t" + strings.TrimSpace(set.Name+" "+set.Value) + "\n"
}
