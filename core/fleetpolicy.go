package core

import (
	"sync"

	"github.com/llmhedge/llmhedge/core/fleetstore"
	"github.com/llmhedge/llmhedge/core/redact"
)

// The fleet's keys all have TTLs (leases, streams, stored answers, the
// budget, health and heartbeats), so a Redis with maxmemory and an evicting
// policy evicts them first under memory pressure (volatile-* picks among
// keys with a TTL only): an evicted lease lets the next request with its
// key start a second generation, an evicted stream or answer loses what
// followers and replays read. Only noeviction keeps them (writes fail
// instead, and the fleet falls back to local state). A Fleet reads the
// policy at its first sync round, and again each time it comes back up
// (the Redis that answers may be another one): anything but noeviction is
// one warning line, and MetricFleetEvictionSafe says 0 (1 for noeviction).
// A Redis that refuses CONFIG (managed ones often do) gets one info line
// and no metric; nothing fails either way.

// fleetPolicy is what a Fleet knows of its Redis' maxmemory-policy.
type fleetPolicy struct {
	mu sync.Mutex
	// due: read the policy at the next sync round.
	due bool
	// reading: a round is reading it now.
	reading bool
	// warned is the policy last warned about ("" none since the last
	// noeviction): the same policy read again is not warned about again.
	warned string
	// refusalSaid: the info line of a refused CONFIG GET was written.
	refusalSaid bool
}

// fleetPolicySafe is the only maxmemory-policy that never evicts fleet keys.
const fleetPolicySafe = "noeviction"

// fleetPolicyDue makes the next sync round read the policy (the fleet came
// back up).
func fleetPolicyDue(f *Fleet) {
	p := f.policy
	p.mu.Lock()
	p.due = true
	p.mu.Unlock()
}

// fleetCheckPolicy reads the policy when it is due and the fleet is up.
// The command bypasses the breaker: an error reply (CONFIG refused) says
// nothing about the fleet's health. A failure without a reply (a timeout,
// a dropped connection) leaves it due for the next round.
func fleetCheckPolicy(f *Fleet) {
	p := f.policy
	p.mu.Lock()
	if !p.due || p.reading {
		p.mu.Unlock()
		return
	}
	p.reading = true
	p.mu.Unlock()
	if !f.Up() {
		p.mu.Lock()
		p.reading = false
		p.mu.Unlock()
		return
	}
	policy, refusal, answered := fleetstore.ReadEvictionPolicy(f.conn)
	p.mu.Lock()
	p.reading = false
	if !answered {
		p.mu.Unlock()
		return
	}
	p.due = false
	warn, say := false, false
	switch {
	case refusal != "":
		say = !p.refusalSaid
		p.refusalSaid = true
	case policy == fleetPolicySafe:
		p.warned = ""
	default:
		warn = policy != p.warned
		p.warned = policy
	}
	p.mu.Unlock()
	if refusal == "" && f.metrics != nil {
		safe := 0.0
		if policy == fleetPolicySafe {
			safe = 1
		}
		f.metrics.Record(MetricFleetEvictionSafe, []string{f.name}, safe)
	}
	if f.log == nil {
		return
	}
	if warn {
		f.log([]LogField{
			stringField("msg", "llmhedge fleet: Redis maxmemory-policy is "+policy+", not noeviction: under memory pressure Redis evicts fleet keys "+
				"(all have TTLs), a live leader's lease among them, and the next request with its key starts a second generation; "+
				"set maxmemory-policy noeviction"),
			stringField("fleet", f.name), stringField("maxmemory_policy", policy)})
	}
	if say {
		f.log([]LogField{
			stringField("msg", "llmhedge fleet: cannot read Redis maxmemory-policy (CONFIG GET refused, as managed Redis often does); "+
				"make sure it is noeviction, or Redis may evict live leases"),
			stringField("level", "info"), stringField("fleet", f.name), stringField("error", redact.URLsIn(refusal))})
	}
}
