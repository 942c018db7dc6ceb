package caddymodule

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmhedge/llmhedge/core"
)

// liveRoutes is a collector of the gauges that are read, not counted: the
// hedge delay in force and the hedges in flight of every provisioned route.
// Handlers join it in Provision and leave in Cleanup. When two handlers
// carry the same route name (e.g. during a reload, or two sites with the
// default name) the one provisioned last is reported.
type liveRoutes struct {
	delayDesc    *prometheus.Desc
	inFlightDesc *prometheus.Desc

	mu     sync.Mutex
	seq    uint64
	routes map[*core.Hedger]liveRoute
}

type liveRoute struct {
	name string
	seq  uint64
}

func newLiveRoutes() *liveRoutes {
	return &liveRoutes{
		delayDesc: prometheus.NewDesc("llm_hedge_delay_seconds",
			"Hedge delay a request starting now would use, by route (adaptive routes follow the TTFT quantile).",
			[]string{"route"}, nil),
		inFlightDesc: prometheus.NewDesc("llm_hedge_hedges_in_flight",
			"Hedge attempts running now, by route.", []string{"route"}, nil),
		routes: map[*core.Hedger]liveRoute{},
	}
}

// add makes h's route visible.
func (l *liveRoutes) add(h *core.Hedger) {
	l.mu.Lock()
	l.seq++
	l.routes[h] = liveRoute{name: h.Config().Route, seq: l.seq}
	l.mu.Unlock()
}

// remove hides h's route.
func (l *liveRoutes) remove(h *core.Hedger) {
	l.mu.Lock()
	delete(l.routes, h)
	l.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (l *liveRoutes) Describe(ch chan<- *prometheus.Desc) {
	ch <- l.delayDesc
	ch <- l.inFlightDesc
}

// Collect implements prometheus.Collector: one sample per route name.
func (l *liveRoutes) Collect(ch chan<- prometheus.Metric) {
	l.mu.Lock()
	latest := map[string]*core.Hedger{}
	seqs := map[string]uint64{}
	for h, r := range l.routes {
		if r.seq > seqs[r.name] {
			latest[r.name], seqs[r.name] = h, r.seq
		}
	}
	l.mu.Unlock()
	for name, h := range latest {
		ch <- prometheus.MustNewConstMetric(l.delayDesc, prometheus.GaugeValue, h.CurrentDelay().Seconds(), name)
		ch <- prometheus.MustNewConstMetric(l.inFlightDesc, prometheus.GaugeValue, float64(h.HedgesInFlight()), name)
	}
}
