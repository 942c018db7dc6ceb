package caddymodule

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmhedge/llmhedge/metrics"
)

// hedgeMetrics are the llm_hedge_* Prometheus collectors (package metrics,
// the names every adapter shares). There is one set per process: every
// config registers the same collectors into its own registry, so counters
// keep counting across config reloads, as a scraper expects of a counter.
type hedgeMetrics struct {
	*metrics.Set
	live   *liveRoutes
	gauges prometheus.Collector
}

var (
	metricsOnce sync.Once
	procMetrics *hedgeMetrics
)

// processMetrics returns the process's collectors, created on first use.
func processMetrics() *hedgeMetrics {
	metricsOnce.Do(func() {
		live := newLiveRoutes()
		procMetrics = &hedgeMetrics{Set: metrics.New(), live: live, gauges: metrics.Gauges(live.each)}
	})
	return procMetrics
}

// register adds the collectors to a config's registry. Several handlers of
// one config register the same collectors: that is not an error.
func (m *hedgeMetrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	return metrics.Register(reg, append(m.Collectors(), m.gauges)...)
}
