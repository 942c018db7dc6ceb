package envoyfilter_test

import (
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/conformance"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestConformance runs the behaviour every adapter shares
// (internal/testkit/conformance) through the server behind the Envoy
// driver: one server per route.
func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T, env *conformance.Env, routes []conformance.Route) map[string]string {
		urls := map[string]string{}
		for _, r := range routes {
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
`,
			})
			urls[r.Name] = h.front.URL + "/v1/"
		}
		return urls
	})
}
