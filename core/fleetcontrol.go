package core

import (
	"encoding/json"
	"errors"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// This file is the operator's side of fleet mode: the runtime kill switch
// and the replicas' heartbeats, as both the engine and llmhedge-ctl read and
// write them. Key names and value formats here are the wire contract
// between replicas of different versions and the ctl command: change them
// only with a new key name.

// A Switch is the runtime kill switch of a route's hedging. The zero Switch
// changes nothing: hedging runs as configured.
type Switch struct {
	// Paused stops every hedge (retries after failures still run).
	Paused bool
	// Delay overrides the hedge delay; 0 keeps the configured or adaptive one.
	Delay time.Duration
}

// IsZero reports whether s changes nothing.
func (s Switch) IsZero() bool { return !s.Paused && s.Delay == 0 }

// String is how logs and llmhedge-ctl show s: "on", "paused", "delay 250ms".
func (s Switch) String() string {
	if s.Paused {
		return "paused"
	}
	if s.Delay > 0 {
		return "delay " + s.Delay.String()
	}
	return "on"
}

// SwitchAllRoutes is the route name of a switch that applies to every route.
const SwitchAllRoutes string = "*"

// MergeSwitches returns the switch in force given switches from the most
// specific to the least (process route, process all, fleet route, fleet
// all): a pause anywhere wins, and the most specific delay override wins.
func MergeSwitches(switches ...Switch) Switch {
	var out Switch
	for _, s := range switches {
		if s.Paused {
			out.Paused = true
		}
		if out.Delay == 0 && s.Delay > 0 {
			out.Delay = s.Delay
		}
	}
	return out
}

// switchWire is a Switch as stored in Redis and sent by admin endpoints.
type switchWire struct {
	Paused  bool  `json:"paused,omitempty"`
	DelayMS int64 `json:"delay_ms,omitempty"`
}

// EncodeSwitch is s in its wire form: JSON {"paused":true,"delay_ms":250}.
func EncodeSwitch(s Switch) string {
	w := switchWire{Paused: s.Paused, DelayMS: int64(s.Delay / time.Millisecond)}
	b, _ := json.Marshal(w)
	return string(b)
}

// DecodeSwitch parses EncodeSwitch's form.
func DecodeSwitch(v string) (Switch, error) {
	var w switchWire
	if err := json.Unmarshal([]byte(v), &w); err != nil {
		return Switch{}, errors.New("llmhedge: switch: not {\"paused\":bool,\"delay_ms\":int}")
	}
	if w.DelayMS < 0 {
		return Switch{}, errors.New("llmhedge: switch: negative delay_ms")
	}
	return Switch{Paused: w.Paused, Delay: time.Duration(w.DelayMS) * time.Millisecond}, nil
}

// Fleet key names. Switch keys carry no TTL on purpose (a pause must hold
// until an operator resumes); there is at most one per route, and a switch
// set back to the zero Switch is deleted. Every other key expires.
//
// A route's keys share the hash tag {r:<route>} and the fleet-wide ones
// the tag {fleet}, so that every script's keys are on one slot of a Redis
// Cluster: <prefix>{r:<route>}:switch, <prefix>{r:*}:switch (every
// route's: a slot of its own, read with a command of its own),
// <prefix>{fleet}:replica:<id>, <prefix>{fleet}:live.

// fleetTag is the hash tag of the fleet-wide keys.
const fleetTag string = "{fleet}"

// FleetSwitchKey is the Redis key of route's fleet-wide switch (a string in
// EncodeSwitch's form); route SwitchAllRoutes is the switch of every route.
func FleetSwitchKey(prefix, route string) string { return prefix + "{r:" + route + "}:switch" }

// FleetSwitchRoute is the route of a switch key (FleetSwitchKey's
// inverse); ok is false for another key.
func FleetSwitchRoute(prefix, key string) (route string, ok bool) {
	head := prefix + "{r:"
	const tail = "}:switch"
	if len(key) < len(head)+len(tail) || !strings.HasPrefix(key, head) || !strings.HasSuffix(key, tail) {
		return "", false
	}
	return key[len(head) : len(key)-len(tail)], true
}

// FleetReplicaKey is the Redis key of a replica's heartbeat (a string in
// ReplicaStatus's JSON form, PX FleetHeartbeatTTL).
func FleetReplicaKey(prefix, replica string) string { return prefix + fleetTag + ":replica:" + replica }

// FleetReplicaPattern matches every heartbeat key of the fleet (for SCAN;
// prefix with its glob characters escaped). On a Redis Cluster they are on
// one slot: one master holds them all.
func FleetReplicaPattern(prefix string) string { return prefix + fleetTag + ":replica:*" }

// FleetSwitchPattern matches every switch key of the fleet (for SCAN, on
// every master of a Redis Cluster: each route's switch is on its slot).
func FleetSwitchPattern(prefix string) string { return prefix + "{r:*}:switch" }

// A replica writes its heartbeat every FleetHeartbeatInterval with a TTL
// of FleetHeartbeatTTL: a replica that stops is gone from status within it
// (one that closes removes its heartbeat at once). Every 2 s, not every
// second: the heartbeat is half of what the fleet costs Redis when no
// request is keyed, and nothing needs it sooner (the switch and health go
// with the sync; the live count only sizes the concurrent-hedge shares).
const (
	FleetHeartbeatInterval time.Duration = 2 * time.Second
	FleetHeartbeatTTL      time.Duration = 3 * FleetHeartbeatInterval
)

// ReplicaStatus is one replica's heartbeat: what llmhedge-ctl status lists.
type ReplicaStatus struct {
	// ID names the replica in the fleet (random per process and fleet).
	ID string `json:"id"`
	// Kind is the proxy: "caddy", "traefik" or "envoy".
	Kind string `json:"kind"`
	// Host and PID locate the process.
	Host string `json:"host,omitempty"`
	PID  int    `json:"pid,omitempty"`
	// Started is when the replica joined the fleet (RFC 3339).
	Started string `json:"started,omitempty"`
	// Routes are the routes this replica serves.
	Routes []ReplicaRoute `json:"routes"`
}

// ReplicaRoute is one route as a replica sees it.
type ReplicaRoute struct {
	Name string `json:"name"`
	// Requests and Hedges this replica counted since it started.
	Requests int64 `json:"requests"`
	Hedges   int64 `json:"hedges"`
	// HedgeRate is hedges per request over the last minute on this replica.
	HedgeRate float64 `json:"hedge_rate"`
	// BudgetTokens is what this replica may spend on hedges now (its
	// leased share of the fleet bucket, or its local bucket).
	BudgetTokens float64 `json:"budget_tokens"`
	// Cooled and Open name the upstreams in a 429/503 cool-down and with an
	// open breaker, as this replica sees them (its own and the fleet's).
	Cooled []string `json:"cooled,omitempty"`
	Open   []string `json:"open,omitempty"`
	// Switch is the switch in force on this replica for the route (String form).
	Switch string `json:"switch"`
	// SpendTokens and SpendUSD are the fleet's estimated extra prompt tokens
	// in the current spend window as this replica last read them; SpendUSD
	// is 0 without a configured price.
	SpendTokens int64   `json:"spend_tokens"`
	SpendUSD    float64 `json:"spend_usd,omitempty"`
	// SpendCapped: the route's spend cap is reached; no hedge starts until
	// the window ends.
	SpendCapped bool `json:"spend_capped,omitempty"`
}

// processSwitches are the per-process switches set through a host's admin
// surface (Caddy's admin API, the Envoy server's admin listener). They are
// package state on purpose: they must outlive configuration reloads.
var processSwitches = &switchTable{m: map[string]Switch{}}

// processSwitchCount is len(processSwitches.m), read atomically by every
// request: while it is 0 no lookup is needed.
var processSwitchCount int64

// switchTable is a mutex-guarded map of switches by route.
type switchTable struct {
	mu sync.Mutex
	m  map[string]Switch
}

// SetProcessSwitch sets this process's switch for route (SwitchAllRoutes:
// every route); the zero Switch removes it.
func SetProcessSwitch(route string, s Switch) {
	processSwitches.mu.Lock()
	storeProcessSwitchLocked(route, s)
	processSwitches.mu.Unlock()
}

// storeProcessSwitchLocked sets route's process switch (the zero Switch
// deletes it) and keeps processSwitchCount in step; processSwitches.mu is
// held.
func storeProcessSwitchLocked(route string, s Switch) {
	if s.IsZero() {
		delete(processSwitches.m, route)
	} else {
		processSwitches.m[route] = s
	}
	atomic.StoreInt64(&processSwitchCount, int64(len(processSwitches.m)))
}

// ProcessSwitch returns this process's switch in force for route: its own
// merged with the one for every route.
func ProcessSwitch(route string) Switch {
	processSwitches.mu.Lock()
	own := processSwitches.m[route]
	all := processSwitches.m[SwitchAllRoutes]
	processSwitches.mu.Unlock()
	return MergeSwitches(own, all)
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

// ParseSwitchDelay parses llmhedge-ctl's and the admin endpoints' delay
// argument: a duration ("250ms") or "auto" (back to the configured delay).
func ParseSwitchDelay(s string) (time.Duration, error) {
	if s == "auto" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, errors.New("llmhedge: delay " + strconv.Quote(s) + ": want a positive duration like 250ms, or auto")
	}
	return d, nil
}
