package core

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"
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
	route fleetstore.Switch // fleetstore.SwitchKey(prefix, route)
	all   fleetstore.Switch // fleetstore.SwitchKey(prefix, "*")
	set   int32             // atomic: 1 when route or all changes anything
}

// setFleetSwitches stores the fleet's switches of a route.
func setFleetSwitches(sh *routeShare, route, all fleetstore.Switch) {
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
func switchInForce(h *Hedger) fleetstore.Switch {
	if !switchesSet(h) {
		return fleetstore.Switch{}
	}
	return mergedSwitch(h.switches, h.state.share, h.cfg.Route)
}

// switchesSet reports whether any switch may apply to h's route: a process
// switch, or a fleet switch read for the route. Requests skip the lookup
// otherwise.
func switchesSet(h *Hedger) bool {
	return anySwitch(h.switches) || atomic.LoadInt32(&h.state.share.switches.set) != 0
}

// mergedSwitch is the switch in force for route given the process's
// switches and its fleet switches.
func mergedSwitch(process *Switches, sh *routeShare, route string) fleetstore.Switch {
	s := &sh.switches
	s.mu.Lock()
	fleetRoute := s.route
	all := s.all
	s.mu.Unlock()
	own := process.Get(route)
	return fleetstore.MergeSwitches(own, fleetRoute, all)
}

// SwitchInForce returns the kill switch in force for the route now (see
// MergeSwitches): the zero Switch when hedging runs as configured.
func (h *Hedger) SwitchInForce() fleetstore.Switch { return switchInForce(h) }

// hedgeDelayOverride returns the switch's delay override, 0 for none.
func hedgeDelayOverride(h *Hedger) time.Duration {
	if !switchesSet(h) {
		return 0
	}
	return mergedSwitch(h.switches, h.state.share, h.cfg.Route).Delay
}

// spendMeter counts a route's estimated extra prompt tokens in the current
// hour: this replica's not yet flushed to the fleet, and the fleet's total
// as last read (0 without a fleet: unflushed is then the total).
//
// In a fleet the hour is Redis' (each sync returns Redis' hour and the time
// left in it: rollAt), never this replica's wall clock, and a capped
// route's hedges spend from a reservation (held) the sync loop takes from
// the hour's cap in Redis in batches, as the hedge budget leases tokens:
// while the hour's key lives the fleet's reservations never exceed the
// cap. Without a fleet, or while it is away, spend beyond what is held is
// checked against the fleet's reserved total as last read plus this
// replica's own (over).
type spendMeter struct {
	mu        sync.Mutex
	hour      int64 // Unix hours (Redis' once rollAt is set)
	unflushed int64 // spent since the last flush
	over      int64 // the part of unflushed no reservation paid for
	fleet     int64 // the fleet's spend this hour as last read
	reserved  int64 // the fleet's reserved total this hour as last read
	held      int64 // this replica's reservation left
	leased    bool  // the last sync succeeded: hedges spend from held only
	// rollAt is when the hour ends by Redis' clock, on this replica's
	// clock (zero: no sync yet, the hours are this clock's).
	rollAt time.Time
	// asked counts the tokens hedges asked for since the last sync;
	// demand smooths it; largest is the largest hedge seen.
	asked   int64
	demand  float64
	largest int64
	capped  bool // the cap is reached (without a lease: for the hour)
	// reached is set when capped turns on and the hour's line was not
	// logged yet (logged), for one log line an hour.
	reached bool
	logged  bool
}

// spendWindow is the hour of now, as Unix hours: only without a fleet (a
// fleet's hours are Redis', see spendMeter.rollAt).
func spendWindow(now time.Time) int64 { return now.Unix() / 3600 }

func spendRollLocked(m *spendMeter, now time.Time) {
	if !m.rollAt.IsZero() {
		for !now.Before(m.rollAt) {
			spendResetLocked(m, m.hour+1)
			m.rollAt = m.rollAt.Add(time.Hour)
		}
		return
	}
	if hour := spendWindow(now); hour != m.hour {
		spendResetLocked(m, hour)
	}
}

// spendResetLocked starts hour: what was spent, held or read of another
// hour no longer counts.
func spendResetLocked(m *spendMeter, hour int64) {
	m.hour = hour
	m.unflushed = 0
	m.over = 0
	m.fleet = 0
	m.reserved = 0
	m.held = 0
	m.capped = false
	m.reached = false
	m.logged = false
}

// spendTake charges tokens for a hedge against the hourly cap (0: none,
// the spend is only counted). It reports whether the hedge may start and
// whether this call reached the cap (log it once). A hedge spends from the
// reservation first; with a lease (the fleet synced) nothing else, and it
// is denied when the reservation is short (the next sync reserves more:
// asked counts it); without one, the fleet's reserved total as last read
// plus this replica's own spend beyond its reservations must stay within
// limit.
func spendTake(m *spendMeter, tokens, limit int64, now time.Time) (ok bool, reached bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	spendRollLocked(m, now)
	m.asked += tokens
	if tokens > m.largest {
		m.largest = tokens
	}
	switch {
	case limit <= 0:
		m.over += tokens
	case m.held >= tokens:
		m.held -= tokens
	case m.leased:
		if m.reserved+tokens <= limit {
			return false, false // short: the fleet has room, the next sync reserves it
		}
		return spendCappedLocked(m)
	case m.capped || m.reserved+m.over+tokens > limit:
		return spendCappedLocked(m)
	default:
		m.over += tokens
	}
	m.unflushed += tokens
	return true, false
}

// spendCappedLocked denies a hedge at the cap: capped, reported reached
// once an hour.
func spendCappedLocked(m *spendMeter) (bool, bool) {
	m.capped = true
	if !m.logged {
		m.logged = true
		m.reached = true
	}
	reached := m.reached
	m.reached = false
	return false, reached
}

// fleetSpendLeaseShare: a replica holds at most cap / fleetSpendLeaseShare
// (or one hedge, when that is more) of a route's hourly spend cap
// reserved; its first sync reserves that much.
const fleetSpendLeaseShare int64 = 8

// spendTarget is the reservation a sync asks to hold: twice the smoothed
// tokens hedges asked for per sync, at least the largest hedge seen, at
// most cap / fleetSpendLeaseShare or one hedge; a route's first sync asks
// for the most. Call with m.mu held.
func spendTarget(m *spendMeter, limit int64, first bool) int64 {
	if limit <= 0 {
		return 0
	}
	m.demand = 0.5*m.demand + 0.5*float64(m.asked)
	m.asked = 0
	most := limit / fleetSpendLeaseShare
	if most < m.largest {
		most = m.largest
	}
	target := int64(math.Ceil(2 * m.demand))
	if target < m.largest {
		target = m.largest
	}
	if first || target > most {
		target = most
	}
	if target > limit {
		target = limit
	}
	return target
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
	t, c := spendSnapshot(h.state.spend, h.now())
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
	minute    int64 // Unix minutes (Redis' once rollAt is set)
	unflushed map[string]int64
	totals    map[string]int64
	// rollAt is when the minute ends by Redis' clock, on this replica's
	// clock (zero: no sync yet, the minutes are this clock's).
	rollAt time.Time
}

// maxTenantsPerSync bounds the tenants one sync flushes (the rest wait for
// the next).
const maxTenantsPerSync int = 100

func tenantRollLocked(m *fleetTenantMeter, now time.Time) {
	if !m.rollAt.IsZero() {
		for !now.Before(m.rollAt) {
			tenantResetLocked(m, m.minute+1)
			m.rollAt = m.rollAt.Add(time.Minute)
		}
		return
	}
	if minute := now.Unix() / 60; minute != m.minute {
		tenantResetLocked(m, minute)
	}
}

func tenantResetLocked(m *fleetTenantMeter, minute int64) {
	m.minute = minute
	m.unflushed = map[string]int64{}
	m.totals = map[string]int64{}
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
	free := freeHedge(rc)
	if !free && !st.bucket.take(now) {
		return DenyBudget
	}
	tokens := promptTokens(rc.p)
	tenant := ""
	fleetTenant := ""
	if h.tenantCaps && rc.p.tenant != "" {
		tenant = rc.p.tenant
		if !st.tenants.take(tenant, tokens, now) {
			refundUnless(free, st.bucket)
			return DenyTenant
		}
		if h.fleet != nil && atomic.LoadInt32(&st.share.live) == 1 {
			fleetTenant = tenantHash(tenant)
			if !fleetTenantTake(st.share.tenants, fleetTenant, tokens, h.cfg.Budget.TenantTokensPerMinute, now) {
				st.tenants.giveBack(tenant, tokens)
				refundUnless(free, st.bucket)
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
	refundUnless(free, st.bucket)
	return DenySpendCap
}

// refundUnless refunds b's token unless the hedge was free (took none).
func refundUnless(free bool, b *hedgeBucket) {
	if !free {
		refund(b)
	}
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
	total, _ := spendSnapshot(h.state.spend, h.now())
	fields := []LogField{stringField("msg", "llmhedge spend cap reached: no hedge starts until the hour ends"),
		stringField("route", h.cfg.Route), intField("spend_tokens", total), intField("spend_cap_tokens", h.spendCap)}
	log(fields)
}

// fleetSpendOut takes what the sync reports of m: the spend since the last
// sync (taken out of m: a failed sync puts it back, spendGiveBack) and the
// reservation wanted. Cap is -1 when there is nothing to do: no cap and
// nothing spent.
func fleetSpendOut(m *spendMeter, limit int64, first bool, now time.Time) fleetstore.SpendReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	spendRollLocked(m, now)
	o := fleetstore.SpendReport{Cap: limit, Hour: -1, Spent: m.unflushed, Over: m.over, Held: m.held}
	if !m.rollAt.IsZero() {
		o.Hour = m.hour
	}
	m.unflushed = 0
	m.over = 0
	o.Target = spendTarget(m, limit, first)
	if limit <= 0 {
		o.Held = 0
		if o.Spent == 0 {
			o.Cap = -1
		}
	}
	return o
}

// fleetSpendIn applies a sync's spend answer: the hour becomes Redis' (a
// reservation of another hour is void), the grant is held.
func fleetSpendIn(m *spendMeter, res fleetstore.SpendResult, now time.Time) {
	if !res.OK {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hour != res.Hour || m.rollAt.IsZero() {
		spendResetLocked(m, res.Hour)
	}
	m.rollAt = now.Add(res.Left)
	m.held += res.Granted
	if m.held < 0 {
		m.held = 0
	}
	if res.Granted > 0 {
		m.capped = false
	}
	m.reserved = res.Reserved
	m.fleet = res.Spent
	m.leased = true
}

// spendGiveBack puts back what a failed sync took of m (in the same hour)
// and makes m local: the spend beyond the reservation held is then
// checked against the fleet's total as last read.
func spendGiveBack(m *spendMeter, sp fleetstore.SpendReport) {
	m.mu.Lock()
	m.leased = false
	if sp.Hour < 0 || m.hour == sp.Hour {
		m.unflushed += sp.Spent
		m.over += sp.Over
	}
	m.mu.Unlock()
}

// spendRelease makes m local: nobody syncs it any more.
func spendRelease(m *spendMeter) {
	m.mu.Lock()
	m.leased = false
	m.mu.Unlock()
}

// tenantSyncTake takes what a sync reports of the tenants: the charges not
// yet flushed (taken out of tm: a failed sync puts them back), then reads
// of the other tenants this replica knows this minute (an add of 0; map
// order rotates them when there are more than fit), at most
// maxTenantsPerSync in all; and this replica's minute (-1: none yet).
func tenantSyncTake(tm *fleetTenantMeter, now time.Time) (tenants []string, adds []int64, minute int64) {
	minute = -1
	tm.mu.Lock()
	defer tm.mu.Unlock()
	tenantRollLocked(tm, now)
	if !tm.rollAt.IsZero() {
		minute = tm.minute
	}
	for t, n := range tm.unflushed {
		if len(tenants) >= maxTenantsPerSync {
			break
		}
		tenants = append(tenants, t)
		adds = append(adds, n)
	}
	for _, t := range tenants {
		delete(tm.unflushed, t)
	}
	for t := range tm.totals {
		if len(tenants) >= maxTenantsPerSync {
			break
		}
		if _, flushing := tm.unflushed[t]; !flushing && !containsString(tenants, t) {
			tenants = append(tenants, t)
			adds = append(adds, 0)
		}
	}
	return tenants, adds, minute
}

// tenantSyncApply takes the fleet's totals of tenants, in Redis' minute.
func tenantSyncApply(tm *fleetTenantMeter, tenants []string, totals []int64, mr fleetstore.MinuteResult, now time.Time) {
	if !mr.OK {
		return
	}
	tm.mu.Lock()
	if tm.minute != mr.Minute || tm.rollAt.IsZero() {
		tenantResetLocked(tm, mr.Minute)
	}
	tm.rollAt = now.Add(mr.Left)
	for i, t := range tenants {
		if i < len(totals) {
			tm.totals[t] = totals[i]
		}
	}
	tm.mu.Unlock()
}

// tenantSyncGiveBack puts back the charges a failed sync took (in the
// same minute): this replica's own cap counts them again.
func tenantSyncGiveBack(tm *fleetTenantMeter, tenants []string, adds []int64, minute int64) {
	tm.mu.Lock()
	if minute < 0 || tm.minute == minute {
		for i, t := range tenants {
			tm.unflushed[t] += adds[i]
		}
	}
	tm.mu.Unlock()
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
