package e2e

import (
	"fmt"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/clientsuite"
)

// TestClients runs the official SDKs, with their own timeouts and retries,
// through the real Traefik with the plugin interpreted by Yaegi
// (internal/testkit/clientsuite): one middleware and router per route.
func TestClients(t *testing.T) {
	clientsuite.Run(t, func(t *testing.T, env *clientsuite.Env, routes []clientsuite.Route) map[string]string {
		ab := [][2]string{{"A", env.A.URL}, {"B", env.B.URL}}
		d := newDynamic("clients")
		for _, r := range routes {
			extra := []string{"delay: " + r.Delay.String(), "log: off"}
			if r.Timeout > 0 {
				extra = append(extra, "timeout: "+r.Timeout.String())
			}
			if r.MaxAttempts > 0 {
				extra = append(extra, fmt.Sprintf("maxAttempts: %d", r.MaxAttempts))
			}
			if r.EarlyHeaders != "" {
				extra = append(extra, fmt.Sprintf("earlyHeaders: %q", r.EarlyHeaders))
			}
			if r.HedgeStoredResponses {
				extra = append(extra, "hedgeStoredResponses: true")
			}
			d.hedge("hedge-"+r.Name, pluginConfig(ab, extra...)).route(r.Name, "noop@internal", "hedge-"+r.Name)
		}
		tr := startTraefik(t, "INFO", d)
		urls := map[string]string{}
		for _, r := range routes {
			urls[r.Name] = tr.URL + "/" + r.Name
		}
		return urls
	})
}
