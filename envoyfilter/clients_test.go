package envoyfilter_test

import (
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/clientsuite"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestClients runs the official SDKs, with their own timeouts and retries,
// through the server behind the Envoy driver
// (internal/testkit/clientsuite): one server per route, in
// FULL_DUPLEX_STREAMED mode with streamed immediate responses, the only
// mode in which early headers reach the client before the winner.
func TestClients(t *testing.T) {
	clientsuite.Run(t, func(t *testing.T, env *clientsuite.Env, routes []clientsuite.Route) map[string]string {
		urls := map[string]string{}
		for _, r := range routes {
			extra := r.Extra(yamlSetting)
			h := newHarness(t, harnessOptions{
				sims: &[2]*llmsim.Running{env.A, env.B},
				routes: `
  - name: ` + r.Name + `
    match:
      path_prefixes: [/v1/]
    upstreams:
      - {name: A, url: "{A}"}
      - {name: B, url: "{B}"}
    delay: ` + r.Delay.String() + `
` + extra,
			})
			urls[r.Name] = h.front.URL
		}
		return urls
	})
}
