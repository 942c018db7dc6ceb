package main

import (
	"fmt"
	"math"
	"time"

	"github.com/llmhedge/llmhedge/internal/stats"
)

// Strategy names, as the JSON output spells them.
const (
	strategySingle   = "single"
	strategyPriority = "priority"
	strategyRaceAll  = "race-all"
	strategyHedge    = "hedge"
)

// strategyTable compares what a client would get, and pay, per strategy,
// computed from the same replayed requests.
type strategyTable struct {
	// Requests is the number of replayed requests every row covers: those
	// the primary, the hedge target and the priority tier all completed.
	Requests int `json:"requests"`
	// Priced: at least one endpoint has a price, so the costs mean
	// something.
	Priced bool          `json:"priced"`
	Rows   []strategyRow `json:"rows"`
	// TargetP99 is -target-p99; Winner names the row that meets it at the
	// lowest cost (ties: fewer extra requests, then the lower p99), ""
	// when no row does or there is no target. Verdict says it in words.
	TargetP99 millis `json:"target_ttft_p99_ms,omitempty"`
	Winner    string `json:"winner,omitempty"`
	Verdict   string `json:"verdict,omitempty"`
}

// strategyRow is one strategy.
type strategyRow struct {
	Name  string `json:"name"`
	Label string `json:"label"`
	// Endpoints are the endpoints the strategy sends to.
	Endpoints []string `json:"endpoints"`
	// Extra is the share of requests sent a second time.
	Extra float64 `json:"extra_requests"`
	outcome
	// CostPer1000 is the USD the strategy pays per 1,000 client requests:
	// every attempt sent is billed in full, its input and output tokens
	// as measured (llmhedge cancels a loser at the winner's first output,
	// but a provider may bill the tokens it generated anyway, so this is
	// the upper bound).
	CostPer1000 float64 `json:"cost_per_1000_usd"`
	// MeetsTarget: the TTFT p99, failures counted as slower than any
	// answer, is within -target-p99.
	MeetsTarget bool `json:"meets_target"`

	ttft []time.Duration // for the chart
}

// strategies builds the table from the paired samples of rec and, when
// there is a priority endpoint, its samples of the same requests.
func strategies(o *options, m *measurement, rec *recommendation) *strategyTable {
	eps := o.Endpoints
	prio := -1
	for i, e := range eps {
		if e.Priority {
			prio = i
		}
	}
	single := &strategyAcc{row: strategyRow{Name: strategySingle, Label: "single request", Endpoints: []string{eps[0].Name}}}
	race := &strategyAcc{row: strategyRow{Name: strategyRaceAll, Label: "race-all (send twice)", Endpoints: []string{eps[0].Name, rec.Secondary}}}
	hedged := &strategyAcc{row: strategyRow{Name: strategyHedge, Label: "hedge at " + rec.Delay, Endpoints: []string{eps[0].Name, rec.Secondary}}}
	accs := []*strategyAcc{single}
	var priority *strategyAcc
	if prio > 0 {
		priority = &strategyAcc{row: strategyRow{Name: strategyPriority, Label: "priority tier", Endpoints: []string{eps[prio].Name}}}
		accs = append(accs, priority)
	}
	accs = append(accs, race, hedged)

	t := &strategyTable{TargetP99: millis(o.TargetP99)}
	for _, e := range eps {
		t.Priced = t.Priced || e.PriceIn > 0 || e.PriceOut > 0
	}
	for _, pr := range rec.pairs {
		if priority != nil && !m.Samples[prio][pr.i].completed() {
			continue // not the same requests
		}
		t.Requests++
		a, b := pr.a, pr.b
		costA, costB := eps[0].cost(a), eps[pr.bEndpoint].cost(b)
		single.add(a.TTFT, a.Total, a.ok(), false, costA)
		if priority != nil {
			p := m.Samples[prio][pr.i]
			priority.add(p.TTFT, p.Total, p.ok(), false, eps[prio].cost(p))
		}
		for _, s := range []struct {
			acc   *strategyAcc
			delay time.Duration
		}{{race, 0}, {hedged, rec.delay}} {
			ttft, total, ok, started := hedge(a, b, s.delay)
			cost := costA
			if started {
				cost += costB
			}
			s.acc.add(ttft, total, ok, started, cost)
		}
	}
	for _, acc := range accs {
		t.Rows = append(t.Rows, acc.finish(t.Requests, o.TargetP99))
	}
	t.pickWinner()
	return t
}

// cost is what endpoint e charges for sample s, in USD.
func (e endpoint) cost(s sample) float64 {
	return (float64(s.InTokens)*e.PriceIn + float64(s.OutTokens)*e.PriceOut) / 1e6
}

// strategyAcc collects one strategy over the requests.
type strategyAcc struct {
	row    strategyRow
	s      strategy
	extra  int
	cost   float64
	ranked []time.Duration // TTFTs with failures as the slowest
}

func (acc *strategyAcc) add(ttft, total time.Duration, ok, second bool, cost float64) {
	acc.s.add(ttft, total, ok)
	if second {
		acc.extra++
	}
	acc.cost += cost
	if !ok {
		ttft = time.Duration(math.MaxInt64)
	}
	acc.ranked = append(acc.ranked, ttft)
}

func (acc *strategyAcc) finish(n int, target time.Duration) strategyRow {
	r := acc.row
	r.outcome = acc.s.outcome()
	r.ttft = acc.s.ttft
	if n > 0 {
		r.Extra = float64(acc.extra) / float64(n)
		r.CostPer1000 = 1000 * acc.cost / float64(n)
	}
	r.MeetsTarget = target > 0 && n > 0 && stats.Quantile(acc.ranked, 0.99) <= target
	return r
}

// pickWinner names the cheapest row that meets the target.
func (t *strategyTable) pickWinner() {
	if t.TargetP99 <= 0 {
		return
	}
	target := formatDuration(time.Duration(t.TargetP99))
	var best *strategyRow
	for i := range t.Rows {
		r := &t.Rows[i]
		if !r.MeetsTarget {
			continue
		}
		if best == nil {
			best = r
			continue
		}
		// Sums of per-request costs differ in their last bits even for
		// equal prices (race-all's a+b against the priority tier's 2a).
		sameCost := math.Abs(r.CostPer1000-best.CostPer1000) <= 1e-9*math.Max(math.Abs(best.CostPer1000), 1e-9)
		if (!sameCost && r.CostPer1000 < best.CostPer1000) ||
			(sameCost && (r.Extra < best.Extra || (r.Extra == best.Extra && r.TTFT.P99 < best.TTFT.P99))) {
			best = r
		}
	}
	if best == nil {
		fastest := &t.Rows[0]
		for i := range t.Rows {
			if t.Rows[i].TTFT.P99 < fastest.TTFT.P99 {
				fastest = &t.Rows[i]
			}
		}
		t.Verdict = fmt.Sprintf("No strategy meets the TTFT p99 target of %s; the fastest is %s with p99 %s.",
			target, fastest.Label, formatDuration(time.Duration(fastest.TTFT.P99)))
		return
	}
	t.Winner = best.Name
	how := "the cheapest that meets it"
	if !t.Priced {
		how = "no prices given (price_in=, price_out=): the fewest extra requests, then the lowest p99"
	}
	t.Verdict = fmt.Sprintf("For a TTFT p99 of at most %s: %s (p99 %s, $%.4f per 1,000 requests), %s.",
		target, best.Label, formatDuration(time.Duration(best.TTFT.P99)), best.CostPer1000, how)
}
