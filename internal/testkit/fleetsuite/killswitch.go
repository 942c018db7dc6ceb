package fleetsuite

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/loadloop"
)

// switchGoal is how soon a fleet switch must hold on every replica.
const switchGoal = time.Second

// KillSwitch runs traffic that hedges every request (the switch route: A
// answers long after the delay, no budget) through every replica, then
// pauses the route with ctl (llmhedge-ctl's arguments after -fleet): the
// time from the pause until the last hedge any replica starts must be at
// most 1 s, and no hedge may start after that until the resume, through a
// reload of every replica (Caddy's POST /load, a rewritten Traefik
// dynamic configuration) made while paused. settle is how long the paused
// traffic runs before and after the reloads. After the resume every
// replica hedges again.
func (s *Acceptance) KillSwitch(t *testing.T, ctx context.Context, ctl func(args ...string) (string, error), settle time.Duration) {
	b := s.upstream(RouteSwitch, "B")
	b.ResetCounters()
	s.upstream(RouteSwitch, "A").ResetCounters()
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	wait := loadloop.Workers(2*len(s.Replicas), stop, func(w, i int) {
		r := s.Replicas[(w+i)%len(s.Replicas)]
		status, err := s.post(ctx, r, RouteSwitch, fmt.Sprintf("switch-%d-%d", w, i), "")
		sent.Add(1)
		if err != nil || status != 200 {
			// A graceful reload may drop a request on a closing
			// connection (see caddymodule/e2e's reload test): counted,
			// not a failure of the switch.
			failed.Add(1)
			firstErr.CompareAndSwap(nil, fmt.Sprintf("%s: status %d, %v", r.Name, status, err))
		}
	})
	stopped := false
	stopTraffic := func() {
		if !stopped {
			stopped = true
			close(stop)
			wait()
		}
	}
	defer stopTraffic()

	// Hedging works on every replica before the pause.
	s.waitHedgesFromAll(t, ctx, b, time.Time{}, "before the pause")

	pausedAt := time.Now()
	if _, err := ctl("pause", "-route", RouteSwitch); err != nil {
		t.Fatalf("llmhedge-ctl pause -route %s: %v", RouteSwitch, err)
	}
	waitUntil(ctx, pausedAt.Add(switchGoal+settle))
	last := lastHedges(b.Requests(), pausedAt)
	var stopTimes []time.Duration
	for _, r := range s.Replicas {
		stopTimes = append(stopTimes, last[r.Name])
	}
	slowest := quantile(stopTimes, 1)
	// What llmhedge-ctl status and the metrics show of the paused fleet.
	shown, statusNote := s.waitStatusPaused(t, ctl)
	pausedGauge := s.gaugeLine(t, "llm_hedge_hedging_paused", map[string]string{"route": RouteSwitch})
	if !s.allReplicas(t, "llm_hedge_hedging_paused", map[string]string{"route": RouteSwitch}, 1) {
		t.Errorf("kill switch: llm_hedge_hedging_paused{route=%s} while paused: %s, want 1 on every replica", RouteSwitch, pausedGauge)
	}

	// Reload every replica while paused; the pause must hold through it.
	for _, r := range s.Replicas {
		if err := r.Reload(); err != nil {
			t.Fatalf("reload of %s: %v", r.Name, err)
		}
	}
	reloadedAt := time.Now()
	waitUntil(ctx, reloadedAt.Add(settle))
	resumedAt := time.Now()
	if _, err := ctl("resume", "-route", RouteSwitch); err != nil {
		t.Fatalf("llmhedge-ctl resume -route %s: %v", RouteSwitch, err)
	}
	var late []string
	for _, req := range b.Requests() {
		if req.At.After(pausedAt.Add(switchGoal)) && req.At.Before(resumedAt) {
			late = append(late, fmt.Sprintf("%s at pause+%v", req.Header.Get(ReplicaHeader), req.At.Sub(pausedAt).Round(time.Millisecond)))
		}
	}
	resumed := s.waitHedgesFromAll(t, ctx, b, resumedAt, "after the resume")
	stopTraffic()
	t.Logf("ACCEPTANCE kill switch (llmhedge-ctl pause -route %s with %d clients hedging every request on %d replicas): last hedge started %v after the pause (goal ≤ %v; per replica %s); %d hedges from pause+%v until the resume %v later, through a reload of every replica at pause+%v; every replica hedged again %v after the resume; %d requests, %d failed during reloads",
		RouteSwitch, 2*len(s.Replicas), len(s.Replicas), slowest.Round(time.Millisecond), switchGoal, s.durationsLine(last), len(late), switchGoal,
		resumedAt.Sub(pausedAt).Round(time.Millisecond), reloadedAt.Sub(pausedAt).Round(time.Millisecond), resumed.Round(time.Millisecond), sent.Load(), failed.Load())
	t.Logf("while paused, route %s: llmhedge-ctl status shows %s%s; llm_hedge_hedging_paused %s", RouteSwitch, shown, statusNote, pausedGauge)
	if want := s.pausedLine(); shown != want {
		t.Errorf("llmhedge-ctl status while paused: route %s on the live replicas %q, want %q%s", RouteSwitch, shown, want, statusNote)
	}
	// wall clock: how soon the switch holds on every replica is the
	// acceptance goal under test (switchGoal), and the hedges counted late
	// are those after it.
	if slowest > switchGoal {
		t.Errorf("kill switch: a replica started a hedge %v after the pause, want within %v (per replica: %s)", slowest, switchGoal, s.durationsLine(last))
	}
	if len(late) > 0 {
		t.Errorf("kill switch: %d hedges started while paused (after pause+%v, before the resume): %s", len(late), switchGoal, strings.Join(first(late, 10), ", "))
	}
	if f := failed.Load(); f > sent.Load()/10 {
		t.Errorf("%d of %d requests failed during the kill switch scenario (first: %v), want only the few a graceful reload drops", f, sent.Load(), firstErr.Load())
	}
}

// waitStatusPaused reads llmhedge-ctl status until it lists the switch
// route paused on every replica, for one heartbeat TTL at most (a replica
// reports its switch in its next heartbeat, every FleetHeartbeatInterval;
// a heartbeat that failed under load is written again at the next one).
// It returns the last statusSwitches line and, when the first read was not
// yet all paused, a note of what the first read showed, how long the wait
// took and the replicas' failed heartbeat writes.
func (s *Acceptance) waitStatusPaused(t *testing.T, ctl func(args ...string) (string, error)) (string, string) {
	t.Helper()
	want := s.pausedLine()
	began := time.Now()
	shown, heartbeats := s.statusSwitches(t, ctl)
	if shown == want {
		return shown, ""
	}
	firstShown, firstHeartbeats := shown, heartbeats
	for time.Since(began) < fleetstore.HeartbeatTTL && shown != want {
		time.Sleep(100 * time.Millisecond) // another process's heartbeat
		shown, _ = s.statusSwitches(t, ctl)
	}
	return shown, fmt.Sprintf(" (after %v; the first read showed %q, heartbeats: %s; failed heartbeat writes %s)",
		time.Since(began).Round(time.Millisecond), firstShown, firstHeartbeats,
		s.gaugeLine(t, "llm_hedge_fleet_operation_errors_total", map[string]string{"op": "heartbeat"}))
}

// statusSwitches is the switch route's switch on every live replica as
// llmhedge-ctl status -json lists them: "caddy=paused ..." sorted, one
// entry per replica (kind=switch), and every heartbeat in brief (for a
// failure's message).
func (s *Acceptance) statusSwitches(t *testing.T, ctl func(args ...string) (string, error)) (string, string) {
	t.Helper()
	out, err := ctl("-json", "status")
	if err != nil {
		t.Fatalf("llmhedge-ctl status: %v", err)
	}
	var rep struct {
		Replicas []struct {
			fleetstore.ReplicaStatus
			AgeMS int64 `json:"heartbeat_age_ms"`
		} `json:"replicas"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("llmhedge-ctl -json status: %v in %q", err, out)
	}
	var entries, heartbeats []string
	for _, r := range rep.Replicas {
		var routes []string
		for _, route := range r.Routes {
			routes = append(routes, route.Name)
			if route.Name == RouteSwitch {
				entries = append(entries, r.Kind+"="+route.Switch)
			}
		}
		heartbeats = append(heartbeats, fmt.Sprintf("%s %s pid %d %dms ago [%s]", r.Kind, r.ID, r.PID, r.AgeMS, strings.Join(routes, " ")))
	}
	sort.Strings(entries)
	return strings.Join(entries, " "), strings.Join(heartbeats, "; ")
}

// pausedLine is statusSwitches' answer when every replica is paused.
func (s *Acceptance) pausedLine() string {
	var entries []string
	for _, r := range s.Replicas {
		entries = append(entries, r.Kind+"=paused")
	}
	sort.Strings(entries)
	return strings.Join(entries, " ")
}

// lastHedges is, per replica, how long after since its last hedge reached
// the hedges' upstream (0: none after since).
func lastHedges(reqs []llmsim.Request, since time.Time) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, req := range reqs {
		if d := req.At.Sub(since); d > out[req.Header.Get(ReplicaHeader)] {
			out[req.Header.Get(ReplicaHeader)] = d
		}
	}
	return out
}

// waitHedgesFromAll waits (10s at most) until b has a hedge from every
// replica after since, and returns how long after since the last
// replica's first one came.
func (s *Acceptance) waitHedgesFromAll(t *testing.T, ctx context.Context, b *llmsim.Running, since time.Time, when string) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var slowest time.Duration
	var missing []string
	err := b.WaitFor(ctx, func() bool {
		firstAt := map[string]time.Time{}
		for _, req := range b.Requests() {
			name := req.Header.Get(ReplicaHeader)
			if req.At.After(since) && firstAt[name].IsZero() {
				firstAt[name] = req.At
			}
		}
		slowest, missing = 0, nil
		for _, r := range s.Replicas {
			if firstAt[r.Name].IsZero() {
				missing = append(missing, r.Name)
			} else if d := firstAt[r.Name].Sub(since); d > slowest {
				slowest = d
			}
		}
		return len(missing) == 0
	})
	if err != nil {
		t.Fatalf("%s: no hedge from %v within 10s", when, missing)
	}
	return slowest
}

// durationsLine renders per-replica durations in replica order.
func (s *Acceptance) durationsLine(ds map[string]time.Duration) string {
	parts := make([]string, 0, len(s.Replicas))
	for _, r := range s.Replicas {
		parts = append(parts, fmt.Sprintf("%s=%v", r.Name, ds[r.Name].Round(time.Millisecond)))
	}
	return strings.Join(parts, " ")
}

// waitUntil waits until at (a load phase's wall-clock end) or ctx's end.
func waitUntil(ctx context.Context, at time.Time) {
	timer := time.NewTimer(time.Until(at))
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
}

func first(xs []string, n int) []string {
	if len(xs) > n {
		return xs[:n]
	}
	return xs
}
