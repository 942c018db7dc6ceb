package envoyfilter

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
)

// route is one configured route in force: its matcher and its hedger.
type route struct {
	name   string
	match  MatchConfig
	hedger *core.Hedger
}

// matches reports whether the request described by head belongs to r.
func (r *route) matches(head *requestHead) bool {
	if len(r.match.PathPrefixes) > 0 {
		path := head.pathOnly()
		ok := false
		for _, p := range r.match.PathPrefixes {
			if strings.HasPrefix(path, p) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for _, hm := range r.match.Headers {
		values := head.header.Values(hm.Name)
		if len(values) == 0 {
			return false
		}
		if hm.Value != "" && !containsString(values, hm.Value) {
			return false
		}
	}
	return true
}

func containsString(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// routeTable is one configuration's routes, swapped whole on reload.
type routeTable struct {
	routes []*route
	// states maps core.StateKey (route name and shape; two routes with the
	// same upstreams keep separate budgets) to the learning each route
	// keeps across reloads.
	states map[string]*core.State
}

// match returns the first route that matches, or nil.
func (t *routeTable) match(head *requestHead) *route {
	for _, r := range t.routes {
		if r.matches(head) {
			return r
		}
	}
	return nil
}

// buildRoutes builds the hedgers of cfgs. A route whose name and upstream
// shape are unchanged from prev keeps its core.State (TTFT estimators,
// budgets, breakers, idempotency table), so a reload neither forgets the
// learned delay nor refills the hedge budget. tracer (nil: none) traces
// every route's requests.
func buildRoutes(cfgs []RouteConfig, prev *routeTable, transport http.RoundTripper, clock core.Clock, switches *core.Switches,
	observer core.Observer, fleetFor func(config.FleetConfig) (*core.Fleet, error), tracer core.Tracer) (*routeTable, error) {
	t := &routeTable{states: make(map[string]*core.State)}
	for _, rc := range cfgs {
		cc, err := rc.CoreConfig()
		if err != nil {
			return nil, fmt.Errorf("route %s: %w", rc.Name, err)
		}
		key := core.StateKey(cc)
		var state *core.State
		if prev != nil {
			state = prev.states[key]
		}
		fleet, err := fleetFor(cc.Fleet)
		if err != nil {
			return nil, fmt.Errorf("route %s: fleet: %w", rc.Name, err)
		}
		h, err := core.New(cc, core.Options{Transport: transport, Clock: clock, Observer: observer, State: state, Fleet: fleet, Switches: switches,
			Tracer: tracer})
		if err != nil {
			return nil, fmt.Errorf("route %s: %w", rc.Name, err)
		}
		t.states[key] = h.State()
		t.routes = append(t.routes, &route{name: rc.Name, match: rc.Match, hedger: h})
	}
	return t, nil
}
