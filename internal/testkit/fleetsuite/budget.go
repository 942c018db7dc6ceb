package fleetsuite

import (
	"context"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/metricscheck"
)

// BudgetLeaseBound is the leasing term of the fleet budget's documented
// bound per replica (core/fleetstore/README.md, "Fleet-wide budgets"): hedges ≤ ratio ×
// requests + burst + replicas × 64, the last term only when the fleet's
// bucket starts over while replicas hold leases. The bucket lives through
// this test (every replica syncs it every 250ms), so the bound the test
// holds the fleet to is ratio × requests + burst; the term is logged.
const BudgetLeaseBound = 64

// Budget sends n requests that all want a hedge round-robin through the
// replicas, first on the route without the fleet (today's per-replica
// budgets, each with its own burst), then on the fleet route: the fleet-wide
// hedges started per request must stay within ratio + burst/n (+ the leasing
// bound), while the per-replica baseline is allowed replicas × burst.
// Hedges are counted at the hedges' upstream (B gets nothing but hedges)
// and cross-checked against the replicas' llm_hedge_hedges_started_total.
func (s *Acceptance) Budget(t *testing.T, ctx context.Context, n, concurrency int) {
	replicas := len(s.Replicas)
	type side struct {
		route            string
		requests, hedges int
		metricHedges     float64
		perReplica       string
		took             time.Duration
	}
	measure := func(route string) side {
		a, b := s.upstream(route, "A"), s.upstream(route, "B")
		a.ResetCounters()
		b.ResetCounters()
		before := s.metricSum(t, "llm_hedge_hedges_started_total", map[string]string{"route": route})
		start := time.Now()
		failed, first := s.roundRobin(ctx, route, route, n, concurrency)
		took := time.Since(start)
		if failed != 0 {
			t.Fatalf("%s: %d of %d requests failed; first: %s", route, failed, n, first)
		}
		// A hedge reaches B long before A's answer ends its race (hedges
		// start at 20ms, A answers at 150ms); on a loaded machine one may
		// still be on its way when the race ends (B's count lags the
		// replicas' metrics by a moment), or its timer fired so late that
		// the race ended before its request reached B (B never sees it).
		// The budget governs hedges started: the bounds hold the metric,
		// and B may never see more hedges than the replicas started.
		metric := s.waitMetricSum(t, "llm_hedge_hedges_started_total", map[string]string{"route": route}, before+float64(b.Served())) - before
		wait, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = b.WaitFor(wait, func() bool { return float64(b.Served()) >= metric })
		cancel()
		return side{route: route, requests: int(a.Served()), hedges: int(b.Served()), metricHedges: metric, perReplica: s.countsLine(byReplica(b.Requests())), took: took}
	}
	local := measure(RouteBudgetLocal)
	fleet := measure(RouteBudget)
	fleetBound := budgetRatio + float64(budgetBurst)/float64(n)
	// A local bucket also refills by time (all of burst in
	// core.BudgetRefillTime): the baseline's bound counts what the run's
	// duration gave each replica. The fleet's lease does not.
	localBound := budgetRatio + float64(replicas*budgetBurst)*(1+float64(local.took)/float64(core.BudgetRefillTime))/float64(n)
	rate := func(x side) float64 { return x.metricHedges / float64(n) }
	for _, x := range []side{local, fleet} {
		t.Logf("budget %s: %d requests round-robin over %d replicas, %v hedges started = %.4f per request (the replicas' metrics); upstream B served %d; per replica: %s",
			x.route, n, replicas, x.metricHedges, rate(x), x.hedges, x.perReplica)
		if x.requests != n {
			t.Errorf("%s: upstream A served %d requests, want %d (one primary each)", x.route, x.requests, n)
		}
		if float64(x.hedges) > x.metricHedges {
			t.Errorf("%s: upstream B served %d hedges but the replicas' llm_hedge_hedges_started_total rose by %v: hedges started uncounted", x.route, x.hedges, x.metricHedges)
		}
	}
	t.Logf("ACCEPTANCE budget (ratio %.2f, burst %d, %d replicas, %d requests round-robin, all wanting a hedge): fleet-wide hedges/requests %.4f (bound %.4f = %.2f + %d/%d while the fleet's bucket lives; + %d×%d/%d = %.4f more only if it starts over); per-replica budgets (no fleet) in the same run %.4f (their bound %.4f = %.2f + %d×%d×(1 + %v/%v)/%d)",
		budgetRatio, budgetBurst, replicas, n, rate(fleet), fleetBound, budgetRatio, budgetBurst, n, replicas, BudgetLeaseBound, n, float64(replicas*BudgetLeaseBound)/float64(n),
		rate(local), localBound, budgetRatio, replicas, budgetBurst, local.took.Round(time.Millisecond), core.BudgetRefillTime, n)
	if rate(local) > localBound {
		t.Errorf("per-replica baseline: hedges/requests = %.4f, want at most %.4f (ratio + replicas × burst × (1 + its refill by time) / requests)", rate(local), localBound)
	}
	if rate(fleet) > fleetBound {
		t.Errorf("fleet budget: hedges/requests = %.4f (%v hedges started in %d requests), want at most %.4f (ratio + burst/requests); fleet operation errors on the replicas: %v",
			rate(fleet), fleet.metricHedges, n, fleetBound, s.metricSum(t, "llm_hedge_fleet_operation_errors_total", nil))
	}
}

// metricSum sums a counter over every replica's metrics (labels must match).
func (s *Acceptance) metricSum(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	sum := 0.0
	for _, r := range s.Replicas {
		sum += s.metricOf(t, r, name, labels)
	}
	return sum
}

// metricOf is metric name (labels must match; summed) on replica r.
func (s *Acceptance) metricOf(t *testing.T, r Replica, name string, labels map[string]string) float64 {
	t.Helper()
	text, err := r.Metrics()
	if err != nil {
		t.Fatalf("%s metrics: %v", r.Name, err)
	}
	v, _ := metricscheck.Value(metricscheck.Parse(t, text), name, labels)
	return v
}

// waitMetricSum polls metricSum (the replicas are other processes, which
// count a request when its report is observed, just after its answer
// ended) until it reaches want or 5s pass, and returns the last sum.
func (s *Acceptance) waitMetricSum(t *testing.T, name string, labels map[string]string, want float64) float64 {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := s.metricSum(t, name, labels)
		if got >= want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}
