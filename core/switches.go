package core

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// Switches are a process's kill switches by route, set through its host's
// admin surface (Caddy's admin API, the Envoy server's admin listener:
// ServeSwitchAdmin). An adapter keeps one for its process, since they
// must outlive configuration reloads, and gives it to each Hedger
// (Options.Switches). Safe for concurrent use.
type Switches struct {
	mu sync.Mutex
	m  map[string]fleetstore.Switch
	// count is len(m), read atomically by every request: while it is 0 no
	// lookup is needed.
	count int64
}

// NewSwitches returns an empty table.
func NewSwitches() *Switches { return &Switches{m: map[string]fleetstore.Switch{}} }

// Set sets the switch for route (fleetstore.SwitchAllRoutes: every
// route); the zero Switch removes it.
func (t *Switches) Set(route string, s fleetstore.Switch) {
	t.mu.Lock()
	storeSwitchLocked(t, route, s)
	t.mu.Unlock()
}

// Update changes route's own switch (not merged with the one for every
// route) with the changes an operator asked for (fleetstore.ChangeSwitch),
// under one lock, and returns it before and after.
func (t *Switches) Update(route string, paused *bool, delay *time.Duration) (before, after fleetstore.Switch) {
	t.mu.Lock()
	before = t.m[route]
	after = fleetstore.ChangeSwitch(before, paused, delay)
	storeSwitchLocked(t, route, after)
	t.mu.Unlock()
	return before, after
}

// storeSwitchLocked sets route's switch (the zero Switch deletes it) and
// keeps count in step; t.mu is held.
func storeSwitchLocked(t *Switches, route string, s fleetstore.Switch) {
	if s.IsZero() {
		delete(t.m, route)
	} else {
		t.m[route] = s
	}
	atomic.StoreInt64(&t.count, int64(len(t.m)))
}

// Get returns the switch in force for route: its own merged with the one
// for every route. A nil table has none.
func (t *Switches) Get(route string) fleetstore.Switch {
	if t == nil {
		return fleetstore.Switch{}
	}
	t.mu.Lock()
	own := t.m[route]
	all := t.m[fleetstore.SwitchAllRoutes]
	t.mu.Unlock()
	return fleetstore.MergeSwitches(own, all)
}

// List lists the switches as "route=switch", sorted.
func (t *Switches) List() []string {
	t.mu.Lock()
	out := make([]string, 0, len(t.m))
	for route, s := range t.m {
		out = append(out, route+"="+s.String())
	}
	t.mu.Unlock()
	sort.Strings(out)
	return out
}

// switchEntries lists t's switches, sorted by route.
func switchEntries(t *Switches) []fleetstore.SwitchEntry {
	t.mu.Lock()
	out := make([]fleetstore.SwitchEntry, 0, len(t.m))
	for route, s := range t.m {
		out = append(out, fleetstore.NewSwitchEntry(route, s))
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Route < out[j].Route })
	return out
}

// anySwitch reports whether t holds a switch; per request, so a function
// with one atomic load (Yaegi).
func anySwitch(t *Switches) bool { return t != nil && atomic.LoadInt64(&t.count) != 0 }
