package fleetsuite

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// spendCapTokens is the spend route's hourly cap on estimated extra prompt
// tokens: a handful of hedges of the suite's request (about 18 tokens
// each: body bytes / 4).
const spendCapTokens = 100

// SpendCap drives the spend route (every request wants a hedge, a budget
// that never runs dry, a fleet-wide cap of spendCapTokens per hour) with
// traffic through every replica until each replica reports the cap
// reached (llm_hedge_spend_cap_reached 1); then n more requests start no
// hedge, a request whose primary fails is still retried on every replica,
// and each replica's llm_hedge_hedge_denials_total says spend_cap. The
// window is the clock hour: a scenario that would straddle its end waits
// for the next hour first.
func (s *Acceptance) SpendCap(t *testing.T, ctx context.Context, n int) {
	// wall clock: the cap's window is the clock hour itself.
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 30*time.Second {
		t.Logf("spend cap: %v left in this hour's window, waiting for the next one", left.Round(time.Second))
		waitUntil(ctx, time.Now().Add(left+time.Second))
	}
	hour := time.Now().Truncate(time.Hour)
	a, b := s.upstream(RouteSpend, "A"), s.upstream(RouteSpend, "B")
	capped := map[string]string{"route": RouteSpend}
	// Traffic until every replica sees the cap.
	deadline := time.Now().Add(20 * time.Second)
	sent := 0
	for {
		failed, first := s.roundRobin(ctx, RouteSpend, fmt.Sprintf("spend-fill-%d", sent), len(s.Replicas), len(s.Replicas))
		sent += len(s.Replicas)
		if failed != 0 {
			t.Fatalf("spend: %d requests failed while filling the cap; first: %s", failed, first)
		}
		if s.allReplicas(t, "llm_hedge_spend_cap_reached", capped, 1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("spend: after %d requests (%d hedges) not every replica reports llm_hedge_spend_cap_reached 1: %s",
				sent, b.Served(), s.gaugeLine(t, "llm_hedge_spend_cap_reached", capped))
		}
	}
	hedgesToCap := int(b.Served())
	spent := s.gaugeLine(t, "llm_hedge_spend_prompt_tokens", capped)

	// Capped: no hedge starts.
	b.ResetCounters()
	a.ResetCounters()
	deniedBefore := s.metricSum(t, "llm_hedge_hedge_denials_total", map[string]string{"route": RouteSpend, "reason": "spend_cap"})
	if failed, first := s.roundRobin(ctx, RouteSpend, "spend-capped", n, len(s.Replicas)); failed != 0 {
		t.Fatalf("spend: %d of %d requests failed after the cap; first: %s", failed, n, first)
	}
	hedgesAfter := byReplica(b.Requests())
	denied := s.waitMetricSum(t, "llm_hedge_hedge_denials_total", map[string]string{"route": RouteSpend, "reason": "spend_cap"}, deniedBefore+float64(n)) - deniedBefore

	// Retries after failures still run: A fails the primary, B answers.
	var noRetry []string
	for _, r := range s.Replicas {
		id := "spend-retry-" + r.Name
		status, err := s.post(ctx, r, RouteSpend, id, "A=status:500")
		if err != nil || status != http.StatusOK || b.Attempts(id) != 1 {
			noRetry = append(noRetry, fmt.Sprintf("%s (status %d, %v, B saw %d)", r.Name, status, err, b.Attempts(id)))
		}
	}
	if now := time.Now().Truncate(time.Hour); !now.Equal(hour) {
		t.Fatalf("spend: the clock hour (the cap's window) ended during the scenario; run it again")
	}
	reasons := s.gaugeLine(t, "llm_hedge_hedge_denials_total", map[string]string{"route": RouteSpend, "reason": "spend_cap"})
	t.Logf("ACCEPTANCE spend cap (%d estimated prompt tokens per hour, fleet-wide, %d replicas): %d hedges started before every replica reported the cap (%d requests); spend as each replica last read it: %s; then %d requests: %d hedges (per replica %s), %v hedges denied with reason spend_cap (per replica, since its start: %s); retries after a failed primary: %d of %d replicas retried",
		spendCapTokens, len(s.Replicas), hedgesToCap, sent, spent, n, sumCounts(hedgesAfter), s.countsLine(hedgesAfter), denied, reasons, len(s.Replicas)-len(noRetry), len(s.Replicas))
	if len(hedgesAfter) > 0 {
		t.Errorf("spend cap reached: %d hedges started on the next %d requests, want 0 (per replica %s)", sumCounts(hedgesAfter), n, s.countsLine(hedgesAfter))
	}
	if denied < float64(n) {
		t.Errorf("spend cap reached: llm_hedge_hedge_denials_total{reason=spend_cap} rose by %v over %d requests that each wanted a hedge, want %d", denied, n, n)
	}
	if len(noRetry) > 0 {
		t.Errorf("spend cap reached: a failed primary was not retried on B on %v, want retries to still run", noRetry)
	}
}

// allReplicas reports whether metric name (labels) is want on every replica.
func (s *Acceptance) allReplicas(t *testing.T, name string, labels map[string]string, want float64) bool {
	t.Helper()
	for _, r := range s.Replicas {
		if s.metricOf(t, r, name, labels) != want {
			return false
		}
	}
	return true
}

// gaugeLine renders metric name (labels) of every replica: "caddy-1=1 ...".
func (s *Acceptance) gaugeLine(t *testing.T, name string, labels map[string]string) string {
	t.Helper()
	line := ""
	for i, r := range s.Replicas {
		if i > 0 {
			line += " "
		}
		line += fmt.Sprintf("%s=%v", r.Name, s.metricOf(t, r, name, labels))
	}
	return line
}

func sumCounts(m map[string]int) int {
	n := 0
	for _, c := range m {
		n += c
	}
	return n
}
