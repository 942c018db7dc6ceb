package core

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"
)

// This file is the route's side of fleet mode part 2: what a request reads
// of the kill switch, the spend cap and the fleet's tenant counters. All of
// it lives in the State, which adapters keep across reloads, and costs a
// request nothing beyond an atomic load unless a switch is set or a hedge
// is about to start. The Fleet's sync loop (fleetsync.go) fills it.

// routeShare is the fleet's view of a route that outlives a configuration:
// the kill switches last read, this replica's share of the concurrent-hedge
// cap, whether the last sync succeeded, the fleet's tenant counters.
type routeShare struct {
	switches switchState
	cap      int64 // atomic: this replica's share of max_concurrent_hedges, 0: the configured cap
	live     int32 // atomic: 1 while the last sync with the fleet succeeded
	tenants  *fleetTenantMeter
}

func newRouteShare() *routeShare {
	return &routeShare{tenants: &fleetTenantMeter{unflushed: map[string]int64{}, totals: map[string]int64{}}}
}

// switchState holds the fleet switches last read for a route: they stay in
// force while Redis is away, and across reloads with the State.
type switchState struct {
	mu    sync.Mutex
	route Switch // FleetSwitchKey(prefix, route)
	all   Switch // FleetSwitchKey(prefix, "*")
	set   int32  // atomic: 1 when route or all changes anything
}

// setFleetSwitches stores the fleet's switches of a route.
func setFleetSwitches(sh *routeShare, route, all Switch) {
	s := &sh.switches
	s.mu.Lock()
	s.route = route
	s.all = all
	var set int32
	if !route.IsZero() || !all.IsZero() {
		set = 1
	}
	atomic.StoreInt32(&s.set, set)
	s.mu.Unlock()
}

// switchInForce is the switch in force for h's route: this process's
// (route, all) merged with the fleet's (route, all). The common case, no
// switch anywhere, is two atomic loads.
func switchInForce(h *Hedger) Switch {
	if !switchesSet(h) {
		return Switch{}
	}
	return mergedSwitch(h.state.share, h.cfg.Route)
}

// switchesSet reports whether any switch may apply to h's route: a process
// switch, or a fleet switch read for the route. Requests skip the lookup
// otherwise.
func switchesSet(h *Hedger) bool {
	return atomic.LoadInt64(&processSwitchCount) != 0 || atomic.LoadInt32(&h.state.share.switches.set) != 0
}

// mergedSwitch is the switch in force for route given its fleet switches.
func mergedSwitch(sh *routeShare, route string) Switch {
	s := &sh.switches
	s.mu.Lock()
	fleetRoute := s.route
	all := s.all
	s.mu.Unlock()
	own := ProcessSwitch(route)
	return MergeSwitches(own, fleetRoute, all)
}

// SwitchInForce returns the kill switch in force for the route now (see
// MergeSwitches): the zero Switch when hedging runs as configured.
func (h *Hedger) SwitchInForce() Switch { return switchInForce(h) }

// hedgeDelayOverride returns the switch's delay override, 0 for none.
func hedgeDelayOverride(h *Hedger) time.Duration {
	if !switchesSet(h) {
		return 0
	}
	return mergedSwitch(h.state.share, h.cfg.Route).Delay
}

// spendMeter counts a route's estimated extra prompt tokens in the current
// clock hour: this replica's not yet flushed to the fleet, and the fleet's
// total as last read (0 without a fleet: unflushed is then the total).
type spendMeter struct {
	mu        sync.Mutex
	hour      int64 // Unix hours
	unflushed int64
	fleet     int64
	capped    bool // the cap was reached this hour
	// reached is set when capped turns on, for one log line.
	reached bool
}

// spendWindow is the hour of now, as Unix hours: the same on every replica
// whose clock is right (a skew of s seconds moves s seconds of spend into
// the neighbouring hour).
func spendWindow(now time.Time) int64 { return now.Unix() / 3600 }

func spendRollLocked(m *spendMeter, now time.Time) {
	hour := spendWindow(now)
	if hour != m.hour {
		m.hour = hour
		m.unflushed = 0
		m.fleet = 0
		m.capped = false
		m.reached = false
	}
}

// spendTake charges tokens for a hedge against the hourly cap (0: none,
// the spend is only counted). It reports whether the hedge may start and
// whether this call reached the cap (log it once).
func spendTake(m *spendMeter, tokens, limit int64, now time.Time) (ok bool, reached bool) {
	m.mu.Lock()
	spendRollLocked(m, now)
	if limit > 0 && !m.capped && m.fleet+m.unflushed+tokens > limit {
		m.capped = true
		m.reached = true
	}
	if m.capped {
		reached = m.reached
		m.reached = false
		m.mu.Unlock()
		return false, reached
	}
	m.unflushed += tokens
	m.mu.Unlock()
	return true, false
}

// spendSnapshot returns the hour's spend (fleet-wide as last read) and
// whether the cap is reached.
func spendSnapshot(m *spendMeter, now time.Time) (int64, bool) {
	m.mu.Lock()
	spendRollLocked(m, now)
	total := m.fleet + m.unflushed
	capped := m.capped
	m.mu.Unlock()
	return total, capped
}

// SpendTokens returns the route's estimated extra prompt tokens spent on
// hedges in the current clock hour (fleet-wide as last read, with a
// fleet), and whether the spend cap is reached.
func (h *Hedger) SpendTokens() (tokens int64, capped bool) {
	t, c := spendSnapshot(h.state.spend, clockNow(h))
	return t, c
}

// BudgetTokens returns the hedge tokens this replica may spend now: its
// lease of the fleet's bucket, or its own bucket.
func (h *Hedger) BudgetTokens() float64 { return budgetTokens(h.state.bucket) }

// fleetTenantMeter is the fleet's side of the per-tenant cap: per tenant
// (by hash), the tokens this replica charged in the current minute and not
// yet flushed, and the fleet's total as last read.
type fleetTenantMeter struct {
	mu        sync.Mutex
	minute    int64 // Unix minutes
	unflushed map[string]int64
	totals    map[string]int64
}

// maxTenantsPerSync bounds the tenants one sync flushes (the rest wait for
// the next).
const maxTenantsPerSync int = 100

func tenantRollLocked(m *fleetTenantMeter, now time.Time) {
	minute := now.Unix() / 60
	if minute != m.minute {
		m.minute = minute
		m.unflushed = map[string]int64{}
		m.totals = map[string]int64{}
	}
}

// tenantHash names a tenant in Redis keys: its header value may be a
// credential.
func tenantHash(tenant string) string {
	sum := sha256.Sum256([]byte(tenant))
	return hex.EncodeToString(sum[:8])
}

// fleetTenantTake charges tokens to tenant (hashed) against the fleet's
// per-minute cap: denied when the fleet's total as last read, plus what
// this replica has not flushed yet, plus tokens, exceed limit.
func fleetTenantTake(m *fleetTenantMeter, tenant string, tokens, limit int64, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	tenantRollLocked(m, now)
	pending, known := m.unflushed[tenant]
	if !known && len(m.unflushed) >= maxTenants {
		return false
	}
	if m.totals[tenant]+pending+tokens > limit {
		return false
	}
	m.unflushed[tenant] = pending + tokens
	return true
}

// fleetTenantGiveBack returns a charge of fleetTenantTake.
func fleetTenantGiveBack(m *fleetTenantMeter, tenant string, tokens int64) {
	m.mu.Lock()
	if n := m.unflushed[tenant]; n >= tokens {
		m.unflushed[tenant] = n - tokens
	}
	m.mu.Unlock()
}

// chargeHedge charges a hedge that passed every other check: the bucket,
// then the tenant's caps (its own, then the fleet's), then the route's
// spend cap, each denial giving back what the earlier ones took. It
// returns the denial reason, or "" when the hedge is paid for.
func chargeHedge(rc *race, now time.Time) string {
	h := rc.h
	st := h.state
	if !st.bucket.take() {
		return DenyBudget
	}
	tokens := promptTokens(rc.p)
	tenant := ""
	fleetTenant := ""
	if h.tenantCaps && rc.p.tenant != "" {
		tenant = rc.p.tenant
		if !st.tenants.take(tenant, tokens, now) {
			refund(st.bucket)
			return DenyTenant
		}
		if h.fleet != nil && atomic.LoadInt32(&st.share.live) == 1 {
			fleetTenant = tenantHash(tenant)
			if !fleetTenantTake(st.share.tenants, fleetTenant, tokens, h.cfg.Budget.TenantTokensPerMinute, now) {
				st.tenants.giveBack(tenant, tokens)
				refund(st.bucket)
				return DenyTenant
			}
		}
	}
	ok, reached := spendTake(st.spend, tokens, h.spendCap, now)
	if ok {
		return ""
	}
	if reached {
		logSpendCapReached(h)
	}
	if fleetTenant != "" {
		fleetTenantGiveBack(st.share.tenants, fleetTenant, tokens)
	}
	if tenant != "" {
		st.tenants.giveBack(tenant, tokens)
	}
	refund(st.bucket)
	return DenySpendCap
}

// logSpendCapReached writes the one line of an hour whose spend cap is
// reached.
func logSpendCapReached(h *Hedger) {
	log := h.opts.Log
	if log == nil && h.fleet != nil {
		log = h.fleet.log
	}
	if log == nil {
		return
	}
	total, _ := spendSnapshot(h.state.spend, clockNow(h))
	fields := []LogField{stringField("msg", "llmhedge spend cap reached: no hedge starts until the hour ends"),
		stringField("route", h.cfg.Route), intField("spend_tokens", total), intField("spend_cap_tokens", h.spendCap)}
	log(fields)
}
