package e2e

import (
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/conformance"
)

// TestConformance runs the behaviour every adapter shares
// (internal/testkit/conformance) through the real Traefik: one plugin
// middleware and router per route, in one Traefik.
func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T, env *conformance.Env, routes []conformance.Route) map[string]string {
		ab := [][2]string{{"A", env.A.URL}, {"B", env.B.URL}}
		d := newDynamic("conformance")
		for _, r := range routes {
			d.hedge("hedge-"+r.Name, pluginConfig(ab, "delay: "+r.Delay.String(), "log: off")).
				route(r.Name, "noop@internal", "hedge-"+r.Name)
		}
		tr := startTraefik(t, "INFO", d)
		urls := map[string]string{}
		for _, r := range routes {
			urls[r.Name] = tr.URL + "/" + r.Name + "/v1/"
		}
		return urls
	})
}
