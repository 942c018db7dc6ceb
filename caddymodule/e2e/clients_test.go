package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/clientsuite"
)

// TestClients runs the official SDKs, with their own timeouts and retries,
// through the real Caddy (internal/testkit/clientsuite): one site per route.
func TestClients(t *testing.T) {
	clientsuite.Run(t, func(t *testing.T, env *clientsuite.Env, routes []clientsuite.Route) map[string]string {
		sites := make([]string, 0, len(routes))
		for _, r := range routes {
			extra := ""
			for _, set := range r.Settings() {
				extra += "\t\t" + strings.TrimSpace(set.Name+" "+set.Value) + "\n"
			}
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
