// Package metrics exports the llm_hedge_* metrics (declared in core's
// MetricDefs) through Prometheus' client, for the adapters that have a
// Prometheus registry: the Caddy module registers a Set in Caddy's registry,
// the Envoy ext_proc server in its own. The Traefik plugin writes the same
// metrics itself (Traefik gives plugins no registry).
package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/llmhedge/llmhedge/core"
)

// Set is one set of the request metrics. Observe it with every Report.
type Set struct {
	defs       []core.MetricDef
	counters   []*prometheus.CounterVec   // by metric index, nil for others
	histograms []*prometheus.HistogramVec // by metric index, nil for others
	gauges     []*prometheus.GaugeVec     // set through Record (the fleet's), nil for others
	collectors []prometheus.Collector
}

// New returns a new Set of the counters and histograms of core.MetricDefs.
func New() *Set {
	defs := core.MetricDefs()
	s := &Set{
		defs:       defs,
		counters:   make([]*prometheus.CounterVec, len(defs)),
		histograms: make([]*prometheus.HistogramVec, len(defs)),
		gauges:     make([]*prometheus.GaugeVec, len(defs)),
	}
	for i, d := range defs {
		switch d.Type {
		case core.MetricCounter:
			s.counters[i] = prometheus.NewCounterVec(prometheus.CounterOpts{Name: d.Name, Help: d.Help}, d.Labels)
			s.collectors = append(s.collectors, s.counters[i])
		case core.MetricHistogram:
			s.histograms[i] = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: d.Name, Help: d.Help, Buckets: d.Buckets}, d.Labels)
			s.collectors = append(s.collectors, s.histograms[i])
		case core.MetricGauge:
			if d.FromHedger {
				continue // read from the hedgers at scrape time (Gauges)
			}
			s.gauges[i] = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: d.Name, Help: d.Help}, d.Labels)
			s.collectors = append(s.collectors, s.gauges[i])
		}
	}
	return s
}

// Observe records one request's report (core.Observer). It only updates
// counters and histograms, so it never blocks the request.
func (s *Set) Observe(r *core.Report) { core.ReportMetrics(r, s) }

// Record implements core.MetricSink.
func (s *Set) Record(metric int, labels []string, v float64) {
	if c := s.counters[metric]; c != nil {
		c.WithLabelValues(labels...).Add(v)
	} else if h := s.histograms[metric]; h != nil {
		h.WithLabelValues(labels...).Observe(v)
	} else if g := s.gauges[metric]; g != nil {
		g.WithLabelValues(labels...).Set(v)
	}
}

// Collectors returns the Set's collectors, for registration.
func (s *Set) Collectors() []prometheus.Collector { return s.collectors }

// Register adds the collectors to reg. Collectors already registered there
// (another handler of the same configuration did) are not an error.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
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

// Gauges returns a collector of the gauges read at scrape time (core's
// MetricDefs with FromHedger: the current delay, the hedges in flight, the
// spend, the kill switch, the budget level) of every route each yields
// (one hedger per route name).
func Gauges(each func(yield func(route string, h *core.Hedger))) prometheus.Collector {
	g := &gauges{each: each}
	for i, d := range core.MetricDefs() {
		if d.FromHedger {
			g.metrics = append(g.metrics, i)
			g.descs = append(g.descs, desc(d))
		}
	}
	return g
}

func desc(d core.MetricDef) *prometheus.Desc {
	return prometheus.NewDesc(d.Name, d.Help, d.Labels, nil)
}

type gauges struct {
	each    func(yield func(route string, h *core.Hedger))
	metrics []int // core metric indexes
	descs   []*prometheus.Desc
}

// Describe implements prometheus.Collector.
func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range g.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	if g.each == nil {
		return
	}
	g.each(func(route string, h *core.Hedger) {
		for i, m := range g.metrics {
			ch <- prometheus.MustNewConstMetric(g.descs[i], prometheus.GaugeValue, core.HedgerGauge(m, h), route)
		}
	})
}

// CounterValue returns the value of a counter's series (0 for a metric that
// is not a counter): for tests and diagnostics.
func (s *Set) CounterValue(metric int, labels ...string) float64 {
	c := s.counters[metric]
	if c == nil {
		return 0
	}
	var m dto.Metric
	if err := c.WithLabelValues(labels...).Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
