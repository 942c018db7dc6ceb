package fleete2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/caddybin"
	"github.com/llmhedge/llmhedge/internal/testkit/fleetsuite"
)

// TestFleetAcceptance runs the acceptance scenarios of fleet mode part 2
// through three real Caddy and two real Traefik replicas sharing one real
// redis-server, all in one run (one start of the five replicas):
//
//   - overhead: a fast upstream, no hedge, fleet on against off on one
//     Caddy and one Traefik (requests/s ratio ≥ 0.9), and Redis commands
//     per unkeyed request (≤ 0.1). A benchmark: its numbers are held to
//     the targets only in the full form (LLMHEDGE_FLEET=full, or
//     LLMHEDGE_BENCH=1 for the full overhead alone with the CI counts of
//     the others); the CI form is tiny and only logs them.
//   - budget: every request wants a hedge, ratio 0.05, burst 5, requests
//     round-robin; fleet-wide hedges/requests against the per-replica
//     budgets of the same replicas (a route without the fleet).
//   - cool-down: one 429 Retry-After: 5 on replica 1; the time until
//     replicas 2–5 stop sending to that upstream, p50 and max over trials.
//   - kill switch: llmhedge-ctl pause with traffic hedging every request;
//     the time until no replica starts a hedge, none until resume, through
//     a Caddy reload and a Traefik dynamic-configuration change.
//   - spend cap: a fleet-wide hourly cap of 100 estimated prompt tokens;
//     once reached no hedge starts, retries after failures still run, and
//     the denials metric says spend_cap.
//
// The CI form is small; the acceptance counts run with
//
//	LLMHEDGE_FLEET=full go test -count=1 -run TestFleetAcceptance -v -timeout 30m ./internal/fleete2e
//
// and the full overhead benchmark alone with
//
//	LLMHEDGE_BENCH=1 go test -count=1 -run 'TestFleetAcceptance/overhead' -v ./internal/fleete2e
//
// Every measured number is logged on a line starting with ACCEPTANCE.
func TestFleetAcceptance(t *testing.T) {
	s := fleetsuite.NewAcceptance(t)
	s.Attach(startFleet(t, s))
	// Ends before go test's own -timeout does, so that a hang fails the
	// test with its cleanups (the replicas and Redis stop) instead of
	// killing the binary.
	end := time.Now().Add(25 * time.Minute)
	if d, ok := t.Deadline(); ok {
		end = d.Add(-30 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	// First, while only the fast route has attached to the fleet: every
	// attached route syncs in the background, and the overhead counts the
	// Redis commands of the fast route's traffic.
	t.Run("overhead", func(t *testing.T) {
		form := fleetsuite.OverheadForm{Rounds: 2, WarmUp: 20, PerRound: 100, Conns: 4, CountFor: time.Second}
		if os.Getenv("LLMHEDGE_BENCH") == "1" || os.Getenv("LLMHEDGE_FLEET") == "full" {
			form = fleetsuite.OverheadForm{Rounds: 6, WarmUp: 1000, PerRound: 4000, Conns: 16, CountFor: 20 * time.Second, Assert: true}
		}
		s.Overhead(t, ctx, form)
	})
	t.Run("budget", func(t *testing.T) {
		s.Budget(t, ctx, fleetsuite.Count(100, 2000), 10)
	})
	t.Run("cool-down", func(t *testing.T) {
		s.CoolDownPropagation(t, ctx, fleetsuite.Count(2, 50))
	})
	t.Run("kill switch", func(t *testing.T) {
		ctl := caddybin.GoBuild(t, "./cmd/llmhedge-ctl")
		s.KillSwitch(t, ctx, func(args ...string) (string, error) {
			cmd := exec.Command(ctl, append([]string{"-fleet", s.RedisURL()}, args...)...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				return "", fmt.Errorf("%v: %s", err, stderr.String())
			}
			return string(out), nil
		}, time.Duration(fleetsuite.Count(1, 5))*time.Second)
	})
	t.Run("spend cap", func(t *testing.T) {
		s.SpendCap(t, ctx, fleetsuite.Count(20, 200))
	})
}
