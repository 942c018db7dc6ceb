package fleetsuite

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/lightload"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// OverheadForm sizes the overhead benchmark: rounds of PerRound requests
// per target after a warm-up of WarmUp, over Conns connections.
type OverheadForm struct {
	Rounds, WarmUp, PerRound, Conns int
	// CountFor is how long every replica is loaded at once while the
	// Redis commands are counted.
	CountFor time.Duration
	// Assert holds the measured numbers to the acceptance targets (the
	// full form, on a quiet machine); otherwise they are only logged.
	Assert bool
}

// Overhead compares, on one replica of each kind, the fast route with the
// fleet on against the same proxy's route without it (a fast upstream, no
// hedge fires): requests/s on the fleet route must be at least 0.9× the
// other's. Then it counts the Redis commands the fleet routes of every
// replica send per unkeyed request under load (INFO commandstats after
// CONFIG RESETSTAT; the target is at most 0.1 on average: such requests
// touch Redis only through the replicas' batched syncs and heartbeats).
func (s *Acceptance) Overhead(t *testing.T, ctx context.Context, form OverheadForm) {
	const minRatio, maxCommands = 0.9, 0.1
	kinds := map[string]bool{}
	for _, r := range s.Replicas {
		if kinds[r.Kind] {
			continue
		}
		kinds[r.Kind] = true
		r := r
		targets := func(n int) []lightload.Target {
			return []lightload.Target{s.lightTarget(r, RouteFast, n, form.Conns), s.lightTarget(r, RouteFastLocal, n, form.Conns)}
		}
		_, c, err := lightload.Bench(ctx, form.Rounds, form.WarmUp, form.PerRound, targets)
		if err != nil {
			t.Fatalf("%s overhead: %v", r.Name, err)
		}
		for _, f := range c.Failures() {
			t.Error(f)
		}
		ratio := c.RPS(0) / c.RPS(1)
		t.Logf("ACCEPTANCE overhead %s (%s, fast upstream, no hedge, %d rounds × %d requests over %d connections): fleet on %.0f req/s, %v CPU/request; fleet off %.0f req/s, %v CPU/request; ratio %.3f (goal ≥ %.1f); per round %v",
			r.Kind, r.Name, form.Rounds, form.PerRound, form.Conns, c.RPS(0), c.CPUPerRequest(0), c.RPS(1), c.CPUPerRequest(1), ratio, minRatio, roundRatios(c.RoundRatios(0, 1)))
		if form.Assert && ratio < minRatio {
			t.Errorf("%s: requests/s with the fleet on = %.3f× the fleet off, want at least %.1f×", r.Kind, ratio, minRatio)
		}
	}
	for _, route := range []string{RouteFast, RouteFastLocal} {
		if spare := s.upstream(route, "B"); spare.Served() != 0 {
			t.Errorf("%s: %d requests reached the spare upstream B, want 0 (no hedge on the fast upstream)", route, spare.Served())
		}
	}

	// Redis commands per unkeyed request, every replica loaded at once for
	// the whole window (a fixed count per replica would leave the slowest
	// replicas alone at the end, and the commands, a rate per replica,
	// would be divided by fewer requests).
	c := s.redis(t)
	countCtx, stop := context.WithTimeout(ctx, form.CountFor)
	defer stop()
	redisDo(t, c, "CONFIG", "RESETSTAT")
	began := time.Now()
	var mu sync.Mutex
	requests := 0
	var wg sync.WaitGroup
	for _, r := range s.Replicas {
		r := r
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := lightload.Run(countCtx, s.lightTarget(r, RouteFast, 1<<30, form.Conns).Options)
			mu.Lock()
			requests += res.Requests
			mu.Unlock()
			if res.Failed != 0 {
				t.Errorf("%s: %d requests failed: %v", r.Name, res.Failed, res.Errors)
			}
		}()
	}
	wg.Wait()
	stats := redisDo(t, c, "INFO", "commandstats").Str
	window := time.Since(began)
	calls := redisproc.ParseCalls(stats).Since(nil, "info", "config")
	commands, top := calls.Total(), calls.String()
	perRequest := float64(commands) / float64(requests)
	// The commands are the replicas' syncs and heartbeats, a rate of
	// their own: per request they fall as the request rate rises.
	t.Logf("ACCEPTANCE redis commands per unkeyed request (fleet on, %d replicas loaded at once, %d requests in %v = %.0f req/s): %d commands (%.0f/s, calls inside scripts included) = %.4f per request (target ≤ %.1f); by command: %s",
		len(s.Replicas), requests, window.Round(time.Millisecond), float64(requests)/window.Seconds(), commands, float64(commands)/window.Seconds(), perRequest, maxCommands, top)
	if form.Assert && perRequest > maxCommands {
		t.Errorf("redis commands per unkeyed request = %.4f (%d commands for %d requests), want at most %.1f", perRequest, commands, requests, maxCommands)
	}
}

// lightTarget is the overhead benchmark's target for route on r.
func (s *Acceptance) lightTarget(r Replica, route string, n, conns int) lightload.Target {
	base := strings.TrimPrefix(r.URL(route), "http://")
	addr, prefix := base, ""
	if i := strings.IndexByte(base, '/'); i >= 0 {
		addr, prefix = base[:i], base[i:]
	}
	target := lightload.StreamTarget(r.Name+" "+route, addr, prefix+"/v1/chat/completions", r.PID(), conns, n)
	// The fast upstream answers in well under a millisecond: a request
	// that takes seconds is a failure, and must not hold the run.
	target.Options.Timeout = 3 * time.Second
	return target
}

func roundRatios(rs []float64) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = strconv.FormatFloat(r, 'f', 3, 64)
	}
	return strings.Join(parts, " ")
}
