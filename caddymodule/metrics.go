package caddymodule

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmhedge/llmhedge/core"
)

// hedgeMetrics are the llm_hedge_* Prometheus collectors. There is one set
// per process: every config registers the same collectors into its own
// registry, so counters keep counting across config reloads, as a scraper
// expects of a counter.
type hedgeMetrics struct {
	requests      *prometheus.CounterVec
	attempts      *prometheus.CounterVec
	hedgesStarted *prometheus.CounterVec
	hedgeWins     *prometheus.CounterVec
	denials       *prometheus.CounterVec
	idempotency   *prometheus.CounterVec
	wastedTokens  *prometheus.CounterVec
	requestTTFT   *prometheus.HistogramVec
	upstreamTTFT  *prometheus.HistogramVec
	duration      *prometheus.HistogramVec
	cancelLatency *prometheus.HistogramVec
	live          *liveRoutes
}

// ttftBuckets cover LLM times to first token, from a cached answer to a
// stalled provider queue (seconds).
var ttftBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 30, 60}

// cancelBuckets cover the time from a winner's commit to a loser's
// connection being closed (seconds).
var cancelBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

var (
	metricsOnce sync.Once
	metrics     *hedgeMetrics
)

// processMetrics returns the process's collectors, created on first use.
func processMetrics() *hedgeMetrics {
	metricsOnce.Do(func() {
		const ns = "llm_hedge"
		counter := func(name, help string, labels ...string) *prometheus.CounterVec {
			return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
		}
		histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
			return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, Buckets: buckets}, labels)
		}
		metrics = &hedgeMetrics{
			requests: counter("requests_total",
				"Requests handled, by route and outcome (ok, upstream_error, fatal, timeout, client_gone, stream_failed, rejected, replayed, joined).",
				"route", "outcome"),
			attempts: counter("attempts_total",
				"Upstream attempts, by route, upstream, role (primary, hedge, retry, single) and result (won, lost, failed, cancelled).",
				"route", "upstream", "role", "result"),
			hedgesStarted: counter("hedges_started_total",
				"Attempts started beyond the first (hedges and retries), by route.", "route"),
			hedgeWins: counter("hedge_wins_total",
				"Requests won by an attempt other than the first, by route, winning upstream and its role (hedge or retry).",
				"route", "upstream", "role"),
			denials: counter("hedge_denials_total",
				"Hedges not started, by route and reason (budget, concurrency, overload, no_upstream, deadline, tenant, max_attempts, not_idempotent).",
				"route", "reason"),
			idempotency: counter("idempotent_requests_total",
				"Requests answered from the idempotency store (replayed) or by joining an in-flight race (joined).",
				"route", "result"),
			wastedTokens: counter("wasted_prompt_tokens_total",
				"Estimated prompt tokens (body bytes / 4) sent to attempts that did not win, by route.", "route"),
			requestTTFT: histogram("ttft_seconds",
				"Time from the request's arrival to the winner's first output event, as the client sees it, by route.",
				ttftBuckets, "route"),
			upstreamTTFT: histogram("upstream_ttft_seconds",
				"Time from the winning attempt's start to its first output event, by route and upstream.",
				ttftBuckets, "route", "upstream"),
			duration: histogram("request_duration_seconds",
				"Time from the request's arrival to the end of its answer, by route and outcome.",
				prometheus.ExponentialBuckets(0.01, 2, 14), "route", "outcome"),
			cancelLatency: histogram("cancel_latency_seconds",
				"Time from the winner's commit to a losing attempt's connection being closed, by route.",
				cancelBuckets, "route"),
			live: newLiveRoutes(),
		}
	})
	return metrics
}

// collectors lists every collector, for registration.
func (m *hedgeMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.attempts, m.hedgesStarted, m.hedgeWins, m.denials,
		m.idempotency, m.wastedTokens, m.requestTTFT, m.upstreamTTFT, m.duration, m.cancelLatency, m.live}
}

// register adds the collectors to a config's registry. Several handlers of
// one config register the same collectors: that is not an error.
func (m *hedgeMetrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if errors.As(err, &already) && already.ExistingCollector == c {
				continue
			}
			return err
		}
	}
	return nil
}

// observe records one request's report.
func (m *hedgeMetrics) observe(rep *core.Report) {
	route := rep.Route
	m.requests.WithLabelValues(route, rep.Outcome).Inc()
	m.duration.WithLabelValues(route, rep.Outcome).Observe(rep.Total.Seconds())
	switch rep.Outcome {
	case core.OutcomeReplayed, core.OutcomeJoined:
		m.idempotency.WithLabelValues(route, rep.Outcome).Inc()
	}
	for i := range rep.Attempts {
		a := &rep.Attempts[i]
		m.attempts.WithLabelValues(route, a.Upstream, a.Role, a.Result).Inc()
		if a.Result == core.ResultLost && a.CancelLatency > 0 {
			m.cancelLatency.WithLabelValues(route).Observe(a.CancelLatency.Seconds())
		}
	}
	if rep.HedgesStarted > 0 {
		m.hedgesStarted.WithLabelValues(route).Add(float64(rep.HedgesStarted))
	}
	for _, reason := range rep.Denials {
		m.denials.WithLabelValues(route, reason).Inc()
	}
	if rep.WastedPromptTokens > 0 {
		m.wastedTokens.WithLabelValues(route).Add(float64(rep.WastedPromptTokens))
	}
	if w := rep.WinnerAttempt(); w != nil {
		m.requestTTFT.WithLabelValues(route).Observe(rep.TTFT.Seconds())
		if w.TTFT > 0 {
			m.upstreamTTFT.WithLabelValues(route, w.Upstream).Observe(w.TTFT.Seconds())
		}
		if w.Index > 0 {
			m.hedgeWins.WithLabelValues(route, w.Upstream, w.Role).Inc()
		}
	}
}
