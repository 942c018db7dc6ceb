package caddymodule

import (
	"sync"

	"github.com/llmhedge/llmhedge/core"
)

// liveRoutes are the provisioned routes whose gauges (the hedge delay in
// force and the hedges in flight) are read at scrape time. Handlers join in
// Provision and leave in Cleanup. When two handlers carry the same route
// name (e.g. during a reload, or two sites with the default name) the one
// provisioned last is reported.
type liveRoutes struct {
	mu     sync.Mutex
	seq    uint64
	routes map[*core.Hedger]liveRoute
}

type liveRoute struct {
	name string
	seq  uint64
}

func newLiveRoutes() *liveRoutes {
	return &liveRoutes{routes: map[*core.Hedger]liveRoute{}}
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

// each yields the latest hedger of every route name (metrics.Gauges).
func (l *liveRoutes) each(yield func(route string, h *core.Hedger)) {
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
		yield(name, h)
	}
}
