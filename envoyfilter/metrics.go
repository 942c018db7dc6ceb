package envoyfilter

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/llmhedge/llmhedge/core"
)

// Metrics are the Prometheus metrics of the server, all named llm_hedge_*.
// The request metrics are derived from core.Report (Metrics is a
// core.Observer); the gauges are read from the hedgers in force at scrape
// time.
type Metrics struct {
	// Registry holds every metric below plus the Go and process collectors.
	Registry *prometheus.Registry

	requests      *prometheus.CounterVec
	attempts      *prometheus.CounterVec
	hedgesStarted *prometheus.CounterVec
	hedgeWins     *prometheus.CounterVec
	denials       *prometheus.CounterVec
	ttft          *prometheus.HistogramVec
	cancelLatency *prometheus.HistogramVec
	replays       *prometheus.CounterVec
	joins         *prometheus.CounterVec
	wastedTokens  *prometheus.CounterVec

	streams         *prometheus.CounterVec
	streamsInFlight prometheus.Gauge
	reloads         *prometheus.CounterVec
}

// latencyBuckets cover LLM first-token times: 10ms to 30s.
var latencyBuckets = []float64{.01, .025, .05, .1, .25, .5, .75, 1, 1.5, 2, 3, 5, 10, 20, 30}

// cancelBuckets cover how fast a loser's connection is closed: 100µs to 1s.
var cancelBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}

// NewMetrics registers the metrics in a new registry. hedgers is called at
// scrape time and must call yield for every route in force.
func NewMetrics(hedgers func(yield func(route string, h *core.Hedger))) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_hedge_requests_total",
			Help: "Hedged-route requests by outcome (ok, upstream_error, fatal, timeout, client_gone, stream_failed, rejected, replayed, joined)."},
			[]string{"route", "outcome"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_hedge_attempts_total",
			Help: "Upstream attempts by upstream, role (primary, hedge, retry, single) and result (won, lost, failed, cancelled)."},
			[]string{"route", "upstream", "role", "result"}),
		hedgesStarted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_hedge_hedges_started_total",
			Help: "Attempts started beyond the first (hedges and retries)."}, []string{"route"}),
		hedgeWins: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_hedge_hedge_wins_total",
			Help: "Requests won by an attempt other than the first."}, []string{"route"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_hedge_budget_denials_total",
			Help: "Hedges not started, by reason (budget, concurrency, overload, no_upstream, deadline, tenant, max_attempts, not_idempotent)."},
			[]string{"route", "reason"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "llm_hedge_ttft_seconds",
			Help: "Time to first output event of the winning attempt, from that attempt's start, by upstream.", Buckets: latencyBuckets},
			[]string{"route", "upstream"}),
		cancelLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "llm_hedge_loser_cancel_seconds",
			Help: "Time from the winner's commit to a losing attempt's connection being closed.", Buckets: cancelBuckets},
			[]string{"route", "upstream"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_hedge_idempotent_replays_total",
			Help: "Requests answered from the idempotency store."}, []string{"route"}),
		joins: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_hedge_idempotent_joins_total",
			Help: "Requests that joined an in-flight race with the same idempotency key."}, []string{"route"}),
		wastedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_hedge_wasted_prompt_tokens_total",
			Help: "Estimated prompt tokens (body bytes / 4) sent to attempts that did not win."}, []string{"route"}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_hedge_extproc_streams_total",
			Help: "ext_proc streams by how they were handled (hedged, passthrough, error)."}, []string{"kind"}),
		streamsInFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "llm_hedge_extproc_streams_in_flight",
			Help: "ext_proc streams open now."}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_hedge_config_reloads_total",
			Help: "Configuration reloads by result (ok, error)."}, []string{"result"}),
	}
	m.Registry.MustRegister(m.requests, m.attempts, m.hedgesStarted, m.hedgeWins, m.denials, m.ttft,
		m.cancelLatency, m.replays, m.joins, m.wastedTokens, m.streams, m.streamsInFlight, m.reloads,
		&hedgerGauges{hedgers: hedgers},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Observe records one request's report. It only updates counters, so it
// never blocks the request.
func (m *Metrics) Observe(r *core.Report) {
	route := r.Route
	m.requests.WithLabelValues(route, r.Outcome).Inc()
	for _, a := range r.Attempts {
		m.attempts.WithLabelValues(route, a.Upstream, a.Role, a.Result).Inc()
		if a.Result == core.ResultLost && a.CancelLatency > 0 {
			m.cancelLatency.WithLabelValues(route, a.Upstream).Observe(a.CancelLatency.Seconds())
		}
	}
	if r.HedgesStarted > 0 {
		m.hedgesStarted.WithLabelValues(route).Add(float64(r.HedgesStarted))
	}
	if w := r.WinnerAttempt(); w != nil {
		if r.Winner > 0 {
			m.hedgeWins.WithLabelValues(route).Inc()
		}
		if w.TTFT > 0 {
			m.ttft.WithLabelValues(route, w.Upstream).Observe(w.TTFT.Seconds())
		}
	}
	for _, reason := range r.Denials {
		m.denials.WithLabelValues(route, reason).Inc()
	}
	switch r.Outcome {
	case core.OutcomeReplayed:
		m.replays.WithLabelValues(route).Inc()
	case core.OutcomeJoined:
		m.joins.WithLabelValues(route).Inc()
	}
	if r.WastedPromptTokens > 0 {
		m.wastedTokens.WithLabelValues(route).Add(float64(r.WastedPromptTokens))
	}
}

// hedgerGauges reports, at scrape time, the delay and the hedges in flight
// of every route in force (after a reload: of the new configuration).
type hedgerGauges struct {
	hedgers func(yield func(route string, h *core.Hedger))
}

var (
	delayDesc = prometheus.NewDesc("llm_hedge_current_delay_seconds",
		"Hedge delay a request starting now would use.", []string{"route"}, nil)
	inFlightDesc = prometheus.NewDesc("llm_hedge_hedges_in_flight",
		"Hedge attempts running now.", []string{"route"}, nil)
)

// Describe implements prometheus.Collector.
func (g *hedgerGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- delayDesc
	ch <- inFlightDesc
}

// Collect implements prometheus.Collector.
func (g *hedgerGauges) Collect(ch chan<- prometheus.Metric) {
	if g.hedgers == nil {
		return
	}
	g.hedgers(func(route string, h *core.Hedger) {
		ch <- prometheus.MustNewConstMetric(delayDesc, prometheus.GaugeValue, h.CurrentDelay().Seconds(), route)
		ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(h.HedgesInFlight()), route)
	})
}
