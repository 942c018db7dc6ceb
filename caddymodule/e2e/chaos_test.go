package e2e

import (
	"fmt"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/chaos"
)

// TestChaos runs the fault-injection suite (internal/testkit/chaos) through the
// real Caddy: its stdout and stderr (JSON logs) are captured for the
// canary check, its goroutines read from the admin API's pprof endpoint and
// its sockets counted from /proc. LLMHEDGE_CHAOS=full runs 10,000
// scenarios.
func TestChaos(t *testing.T) {
	env := chaos.NewEnv(t)
	site := fmt.Sprintf(`	llm_hedge {
		route chaos
		upstream %s {
			name A
		}
		upstream %s {
			name B
			header_up Authorization %q
		}
		delay %s
		timeout %s
		max_attempts %d
		budget {
			ratio off
			max_concurrent_hedges off
			cool_down 1ms
			max_cool_down 1ms
			overload_rate 1
			breaker_failures 1000000
			breaker_open 1ms
		}
		log_level info
	}`, env.URLA, env.URLB, env.AuthB, chaos.Delay, chaos.Timeout, chaos.MaxAttempts)
	c := startCaddy(t, "", site)
	chaos.Run(t, env, chaos.Target{
		Name:       "caddy",
		BaseURL:    c.url(0),
		PID:        c.cmd.Process.Pid,
		Goroutines: chaos.PprofGoroutines(c.admin),
		Logs:       c.logs,
	}, chaos.Requests(), chaos.Seed())
}
