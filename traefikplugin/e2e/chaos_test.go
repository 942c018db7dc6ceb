package e2e

import (
	"fmt"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/chaos"
)

// TestChaos runs the fault-injection suite (internal/testkit/chaos) through the
// real Traefik, the plugin interpreted by Yaegi: Traefik's output at INFO
// (with the plugin's request log lines) is captured for the canary check,
// its goroutines read from the debug API's pprof endpoint and its sockets
// counted from /proc. LLMHEDGE_CHAOS=full runs 10,000 scenarios.
func TestChaos(t *testing.T) {
	env := chaos.NewEnv(t)
	cfg := fmt.Sprintf(`upstreams:
  - name: A
    url: %q
  - name: B
    url: %q
    setHeaders:
      Authorization: %q
delay: %s
timeout: %s
maxAttempts: %d
budget:
  ratio: -1
  maxConcurrentHedges: -1
  coolDown: 1ms
  maxCoolDown: 1ms
  overloadRate: 1
  breakerFailures: 1000000
  breakerOpen: 1ms
`, env.URLA, env.URLB, env.AuthB, chaos.Delay, chaos.Timeout, chaos.MaxAttempts)
	d := newDynamic("chaos").hedge("hedge", cfg).route("chaos", "noop@internal", "hedge")
	tr, api := startTraefikWithDebugAPI(t, "INFO", d)
	chaos.Run(t, env, chaos.Target{
		Name:       "traefik",
		BaseURL:    tr.URL + "/chaos",
		PID:        tr.cmd.Process.Pid,
		Goroutines: chaos.PprofGoroutines(api.url),
		Logs:       tr.logs.String,
	}, chaos.Requests(), chaos.Seed())
}
