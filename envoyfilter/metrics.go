package envoyfilter

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/metrics"
)

// Metrics are the Prometheus metrics of the server, all named llm_hedge_*.
// The request metrics are the ones every adapter exports (package metrics,
// fed from core.Report: Metrics is a core.Observer) and the gauges are read
// from the hedgers in force at scrape time; the ext_proc stream and reload
// metrics are the server's own.
type Metrics struct {
	// Registry holds every metric below plus the Go and process collectors.
	Registry *prometheus.Registry

	*metrics.Set

	streams         *prometheus.CounterVec
	streamsInFlight prometheus.Gauge
	reloads         *prometheus.CounterVec
}

// NewMetrics registers the metrics in a new registry. hedgers is called at
// scrape time and must call yield for every route in force.
func NewMetrics(hedgers func(yield func(route string, h *core.Hedger))) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Set:      metrics.New(),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_hedge_extproc_streams_total",
			Help: "ext_proc streams by how they were handled (hedged, passthrough, error)."}, []string{"kind"}),
		streamsInFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "llm_hedge_extproc_streams_in_flight",
			Help: "ext_proc streams open now."}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_hedge_config_reloads_total",
			Help: "Configuration reloads by result (ok, error)."}, []string{"result"}),
	}
	m.Registry.MustRegister(m.Collectors()...)
	m.Registry.MustRegister(m.streams, m.streamsInFlight, m.reloads, metrics.Gauges(hedgers),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
