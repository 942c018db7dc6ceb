package core

import (
	"sort"
	"sync"
	"sync/atomic"

	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// processSwitches are the per-process switches set through a host's admin
// surface (Caddy's admin API, the Envoy server's admin listener). They are
// package state on purpose: they must outlive configuration reloads.
var processSwitches = &switchTable{m: map[string]fleetstore.Switch{}}

// processSwitchCount is len(processSwitches.m), read atomically by every
// request: while it is 0 no lookup is needed.
var processSwitchCount int64

// switchTable is a mutex-guarded map of switches by route.
type switchTable struct {
	mu sync.Mutex
	m  map[string]fleetstore.Switch
}

// SetProcessSwitch sets this process's switch for route (SwitchAllRoutes:
// every route); the zero Switch removes it.
func SetProcessSwitch(route string, s fleetstore.Switch) {
	processSwitches.mu.Lock()
	storeProcessSwitchLocked(route, s)
	processSwitches.mu.Unlock()
}

// storeProcessSwitchLocked sets route's process switch (the zero Switch
// deletes it) and keeps processSwitchCount in step; processSwitches.mu is
// held.
func storeProcessSwitchLocked(route string, s fleetstore.Switch) {
	if s.IsZero() {
		delete(processSwitches.m, route)
	} else {
		processSwitches.m[route] = s
	}
	atomic.StoreInt64(&processSwitchCount, int64(len(processSwitches.m)))
}

// ProcessSwitch returns this process's switch in force for route: its own
// merged with the one for every route.
func ProcessSwitch(route string) fleetstore.Switch {
	processSwitches.mu.Lock()
	own := processSwitches.m[route]
	all := processSwitches.m[fleetstore.SwitchAllRoutes]
	processSwitches.mu.Unlock()
	return fleetstore.MergeSwitches(own, all)
}

// ProcessSwitches lists this process's switches as "route=switch", sorted.
func ProcessSwitches() []string {
	processSwitches.mu.Lock()
	out := make([]string, 0, len(processSwitches.m))
	for route, s := range processSwitches.m {
		out = append(out, route+"="+s.String())
	}
	processSwitches.mu.Unlock()
	sort.Strings(out)
	return out
}
