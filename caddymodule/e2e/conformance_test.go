package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/clientsuite"
	"github.com/llmhedge/llmhedge/internal/testkit/conformance"
)

// TestConformance runs the behaviour every adapter shares
// (internal/testkit/conformance) through the real Caddy: one site per
// route, each with its own llm_hedge route.
func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T, env *conformance.Env, routes []conformance.Route) map[string]string {
		var sites, names []string
		for _, r := range routes {
			sites = append(sites, abSite(r.Name, env.A.URL, env.B.URL, r.Delay, ""))
			names = append(names, r.Name)
		}
		return siteURLs(startCaddy(t, "", sites...), names, "/v1/")
	})
}

// TestClients runs the official SDKs, with their own timeouts and retries,
// through the real Caddy (internal/testkit/clientsuite): one site per route.
func TestClients(t *testing.T) {
	clientsuite.Run(t, func(t *testing.T, env *clientsuite.Env, routes []clientsuite.Route) map[string]string {
		var sites, names []string
		for _, r := range routes {
			sites = append(sites, abSite(r.Name, env.A.URL, env.B.URL, r.Delay, r.Extra(caddyfileSetting)))
			names = append(names, r.Name)
		}
		return siteURLs(startCaddy(t, "", sites...), names, "")
	})
}

// abSite is the llm_hedge site of route name over upstreams A (a) and B
// (b) with a fixed hedge delay and extra lines in its block.
func abSite(name, a, b string, delay time.Duration, extra string) string {
	return fmt.Sprintf(`	llm_hedge {
		route %s
		upstream %s {
			name A
		}
		upstream %s {
			name B
		}
		delay %s
%s	}`, name, a, b, delay, extra)
}

// siteURLs maps the name of each of c's sites (names in their order) to
// its URL followed by suffix.
func siteURLs(c *caddyProc, names []string, suffix string) map[string]string {
	urls := map[string]string{}
	for i, name := range names {
		urls[name] = c.url(i) + suffix
	}
	return urls
}

// caddyfileSetting writes a route setting as a Caddyfile line of the
// llm_hedge block (a flag is its name alone).
func caddyfileSetting(set clientsuite.Setting) string {
	return "\t\t" + strings.TrimSpace(set.Name+" "+set.Value) + "\n"
}
