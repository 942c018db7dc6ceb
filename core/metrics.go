package core

// The llm_hedge_* metrics every adapter exports, declared once here so that
// Caddy and the Envoy server (through the metrics package and Prometheus'
// client) and the Traefik plugin (its own text exposition, under Yaegi)
// export the same names, labels and buckets from the same Report.

// Prometheus metric types, as written after # TYPE.
const (
	MetricCounter   = "counter"
	MetricGauge     = "gauge"
	MetricHistogram = "histogram"
)

// Metric indexes into MetricDefs.
const (
	MetricRequests        int = 0
	MetricAttempts        int = 1
	MetricHedgesStarted   int = 2
	MetricHedgeWins       int = 3
	MetricHedgeDenials    int = 4
	MetricTTFT            int = 5
	MetricUpstreamTTFT    int = 6
	MetricRequestDuration int = 7
	MetricLoserCancel     int = 8
	MetricIdempotent      int = 9
	MetricWastedTokens    int = 10
	MetricCurrentDelay    int = 11
	MetricHedgesInFlight  int = 12
	MetricFleetUp         int = 13
	MetricFleetErrors     int = 14
	MetricFleetDuration   int = 15
	MetricInvalid         int = 16
	MetricSpendCapReached int = 17
	MetricSpendTokens     int = 18
	MetricHedgingPaused   int = 19
	MetricBudgetTokens    int = 20
	MetricFleetReplicas   int = 21
	// MetricFleetEvictionSafe: fleetpolicy.go.
	MetricFleetEvictionSafe int = 22
)

// MetricDef describes one metric.
type MetricDef struct {
	Name    string // full name, llm_hedge_*
	Type    string // MetricCounter, MetricGauge or MetricHistogram
	Help    string
	Labels  []string
	Buckets []float64 // upper bounds in seconds, histograms only
	// FromHedger: a gauge read from each route's Hedger at scrape time
	// (see HedgerGauge), not recorded through a MetricSink.
	FromHedger bool
}

// ttftBuckets cover LLM times to first token, from a cached answer to a
// stalled provider queue (seconds).
var ttftBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 30, 60}

// durationBuckets cover whole answers: 10ms doubling to about 80s.
var durationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}

// cancelBuckets cover the time from a winner's commit to a loser's
// connection being closed (seconds).
// fleetBuckets cover one Redis operation, from a loopback round trip to
// the operation timeout and a blocking read (seconds).
var fleetBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}

var cancelBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

// Every label set is bounded by the configuration: routes and upstreams are
// configured names, the others the constants of observer.go.
var metricDefs = []MetricDef{
	{Name: "llm_hedge_requests_total", Type: MetricCounter,
		Help:   "Requests handled, by route and outcome (ok, upstream_error, fatal, timeout, client_gone, stream_failed, rejected, replayed, joined, invalid).",
		Labels: []string{"route", "outcome"}},
	{Name: "llm_hedge_attempts_total", Type: MetricCounter,
		Help:   "Upstream attempts, by route, upstream, role (primary, hedge, retry, single) and result (won, lost, failed, invalid, cancelled).",
		Labels: []string{"route", "upstream", "role", "result"}},
	{Name: "llm_hedge_hedges_started_total", Type: MetricCounter,
		Help:   "Attempts started beyond the first (hedges and retries), by route.",
		Labels: []string{"route"}},
	{Name: "llm_hedge_hedge_wins_total", Type: MetricCounter,
		Help:   "Requests won by an attempt other than the first, by route, winning upstream and its role (hedge or retry).",
		Labels: []string{"route", "upstream", "role"}},
	{Name: "llm_hedge_hedge_denials_total", Type: MetricCounter,
		Help:   "Hedges not started, by route and reason (budget, concurrency, overload, no_upstream, deadline, tenant, max_attempts, not_idempotent, paused, spend_cap).",
		Labels: []string{"route", "reason"}},
	{Name: "llm_hedge_ttft_seconds", Type: MetricHistogram,
		Help:   "Time from the request's arrival to the winner's first output event, as the client sees it, by route.",
		Labels: []string{"route"}, Buckets: ttftBuckets},
	{Name: "llm_hedge_upstream_ttft_seconds", Type: MetricHistogram,
		Help:   "Time from an attempt's start to its first output event, for every attempt that produced one, by route and upstream.",
		Labels: []string{"route", "upstream"}, Buckets: ttftBuckets},
	{Name: "llm_hedge_request_duration_seconds", Type: MetricHistogram,
		Help:   "Time from the request's arrival to the end of its answer, by route and outcome.",
		Labels: []string{"route", "outcome"}, Buckets: durationBuckets},
	{Name: "llm_hedge_loser_cancel_seconds", Type: MetricHistogram,
		Help:   "Time from the winner's commit to a losing attempt's connection being closed, by route and the loser's upstream.",
		Labels: []string{"route", "upstream"}, Buckets: cancelBuckets},
	{Name: "llm_hedge_idempotent_requests_total", Type: MetricCounter,
		Help:   "Requests answered from the idempotency store (result replayed) or by joining an in-flight race with the same key (joined), by route.",
		Labels: []string{"route", "result"}},
	{Name: "llm_hedge_wasted_prompt_tokens_total", Type: MetricCounter,
		Help:   "Estimated prompt tokens (body bytes / 4) sent to attempts that did not win, by route.",
		Labels: []string{"route"}},
	{Name: "llm_hedge_current_delay_seconds", Type: MetricGauge,
		Help:   "Hedge delay a request starting now would use, by route (adaptive routes follow the TTFT quantile).",
		Labels: []string{"route"}, FromHedger: true},
	{Name: "llm_hedge_hedges_in_flight", Type: MetricGauge,
		Help:   "Hedge attempts running now, by route.",
		Labels: []string{"route"}, FromHedger: true},
	{Name: "llm_hedge_fleet_up", Type: MetricGauge,
		Help:   "1 while the fleet's Redis is in use, 0 while it is away and requests use local state, by fleet (host:port/db).",
		Labels: []string{"fleet"}},
	{Name: "llm_hedge_fleet_operation_errors_total", Type: MetricCounter,
		Help:   "Fleet operations on Redis that failed or timed out, by fleet and operation (claim, append, finish, renew, read, lease, sync, publish, heartbeat).",
		Labels: []string{"fleet", "op"}},
	{Name: "llm_hedge_fleet_operation_duration_seconds", Type: MetricHistogram,
		Help:   "Time of one fleet operation on Redis (a read includes its blocking wait), by fleet and operation.",
		Labels: []string{"fleet", "op"}, Buckets: fleetBuckets},
	{Name: "llm_hedge_invalid_answers_total", Type: MetricCounter,
		Help:   "Attempts whose answer failed a validity check, by route, upstream and check (json, json_schema, finish, no_refusal).",
		Labels: []string{"route", "upstream", "check"}},
	{Name: "llm_hedge_spend_cap_reached", Type: MetricGauge,
		Help:   "1 while the route's hourly spend cap is reached and no hedge starts, by route.",
		Labels: []string{"route"}, FromHedger: true},
	{Name: "llm_hedge_spend_prompt_tokens", Type: MetricGauge,
		Help:   "Estimated extra prompt tokens spent on hedges in the current clock hour, fleet-wide as last read with a fleet, by route.",
		Labels: []string{"route"}, FromHedger: true},
	{Name: "llm_hedge_hedging_paused", Type: MetricGauge,
		Help:   "1 while the kill switch (this process's or the fleet's) pauses the route's hedging, by route.",
		Labels: []string{"route"}, FromHedger: true},
	{Name: "llm_hedge_budget_tokens", Type: MetricGauge,
		Help:   "Hedge tokens this replica may spend now (its lease of the fleet's bucket, or its own bucket), by route.",
		Labels: []string{"route"}, FromHedger: true},
	{Name: "llm_hedge_fleet_replicas", Type: MetricGauge,
		Help:   "Live replicas of the fleet as this one last counted them (from the heartbeats), by fleet.",
		Labels: []string{"fleet"}},
	{Name: "llm_hedge_fleet_eviction_policy_safe", Type: MetricGauge,
		Help:   "1 when the fleet's Redis has maxmemory-policy noeviction, 0 when it may evict fleet keys (a live lease: a second generation); absent while Redis refuses CONFIG GET, by fleet.",
		Labels: []string{"fleet"}},
}

// HedgerGauge returns the value of gauge metric (one whose FromHedger is
// set) for h's route now.
func HedgerGauge(metric int, h *Hedger) float64 {
	switch metric {
	case MetricCurrentDelay:
		return h.CurrentDelay().Seconds()
	case MetricHedgesInFlight:
		return float64(h.HedgesInFlight())
	case MetricSpendCapReached:
		_, capped := h.SpendTokens()
		if capped {
			return 1
		}
		return 0
	case MetricSpendTokens:
		tokens, _ := h.SpendTokens()
		return float64(tokens)
	case MetricHedgingPaused:
		if h.SwitchInForce().Paused {
			return 1
		}
		return 0
	case MetricBudgetTokens:
		return h.BudgetTokens()
	}
	return 0
}

// MetricDefs returns the metrics, indexed by the Metric* constants. The
// slice is a copy; its label and bucket slices are shared and must not be
// changed.
func MetricDefs() []MetricDef {
	defs := make([]MetricDef, len(metricDefs))
	copy(defs, metricDefs)
	return defs
}

// MetricSink receives the samples of a Report (and of a Fleet). Record
// adds v to a counter, observes v in a histogram, or sets a gauge that is
// not read from a Hedger (MetricFleetUp); labels are in the order of the
// metric's MetricDef.Labels.
type MetricSink interface {
	Record(metric int, labels []string, v float64)
}

// ReportMetrics records r's samples in sink: the one place that decides what
// a request adds to which metric. The gauges (current delay, hedges in
// flight) are read from a Hedger at scrape time instead.
func ReportMetrics(r *Report, sink MetricSink) {
	route := r.Route
	sink.Record(MetricRequests, []string{route, r.Outcome}, 1)
	sink.Record(MetricRequestDuration, []string{route, r.Outcome}, r.Total.Seconds())
	if r.Outcome == OutcomeReplayed || r.Outcome == OutcomeJoined {
		sink.Record(MetricIdempotent, []string{route, r.Outcome}, 1)
	}
	for i := range r.Attempts {
		a := &r.Attempts[i]
		sink.Record(MetricAttempts, []string{route, a.Upstream, a.Role, a.Result}, 1)
		if a.TTFT > 0 {
			sink.Record(MetricUpstreamTTFT, []string{route, a.Upstream}, a.TTFT.Seconds())
		}
		if a.Invalid != "" {
			sink.Record(MetricInvalid, []string{route, a.Upstream, a.Invalid}, 1)
		}
		if a.Result == ResultLost && a.CancelLatency > 0 {
			sink.Record(MetricLoserCancel, []string{route, a.Upstream}, a.CancelLatency.Seconds())
		}
	}
	if r.HedgesStarted > 0 {
		sink.Record(MetricHedgesStarted, []string{route}, float64(r.HedgesStarted))
	}
	for _, reason := range r.Denials {
		sink.Record(MetricHedgeDenials, []string{route, reason}, 1)
	}
	if r.WastedPromptTokens > 0 {
		sink.Record(MetricWastedTokens, []string{route}, float64(r.WastedPromptTokens))
	}
	w := r.WinnerAttempt()
	if w == nil {
		return
	}
	sink.Record(MetricTTFT, []string{route}, r.TTFT.Seconds())
	if w.Index > 0 {
		sink.Record(MetricHedgeWins, []string{route, w.Upstream, w.Role}, 1)
	}
}
