package core

import (
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// Fleet mode part 2: the hedge budget, the concurrent-hedge cap, the
// tenant and spend caps, upstream health and the kill switch hold for the
// fleet, with Redis kept off the request path. Requests only count (under
// the bucket's lock they take anyway); a per-Fleet loop, every
// fleet.sync_interval, reads the switch of every route (a GET: on a Redis
// Cluster its key is a slot of its own) and settles each attached route
// with one script (fleetstore.Sync) on its route's keys: it reports the
// requests counted since the last sync, leases a batch of hedge tokens
// sized to the demand, reserves spend against the hour's cap, flushes the
// spend and tenant counters (into Redis' hour and minute) and reads the
// route's health and switch. Health
// events this replica sees are published at once, in the background. Once
// per fleetstore.HeartbeatInterval the loop writes the replica's heartbeat and
// counts the live replicas (for each one's share of the hedge cap).
//
// The loop starts with the first request of a route (the route attaches
// then, with a first synchronous sync bounded by fleet.timeout, so that a
// fresh instance sees the switch before its first hedge) and runs on the
// Fleet's Clock until Close. Nothing starts in NewFleet or New: Traefik
// makes instances it never closes.

// fleetMaxLease caps the hedge tokens a replica holds for one route: the
// documented error bound is replicas × fleetMaxLease on top of ratio ×
// requests + burst, and only when the fleet's bucket starts over.
const fleetMaxLease float64 = 64

// fleetRouteIdle: a route without requests for this long is idle. An idle
// route stays attached, reported in the heartbeat and synced with it (once
// per fleetstore.HeartbeatInterval, not every sync_interval), so that
// llmhedge-ctl status lists it and it takes the kill switch before its next
// request; an idle route that another State of the same name superseded (a
// reload that changed the route's shape) detaches (its next request
// attaches it again).
const fleetRouteIdle time.Duration = 2 * time.Minute

// fleetRoute is one attached route (one State) of a Fleet. It holds the
// parts of the State the loop works on and a copy of the configuration,
// never the *State or the *Hedger: Yaegi v0.16.1 mistypes a field whose
// struct type leads back to the struct being defined.
type fleetRoute struct {
	key      string // fleetRouteKey
	name     string
	bucket   *hedgeBucket
	spend    *spendMeter
	share    *routeShare
	overload *overloadWindow
	health   []*upstreamHealth
	conf     *routeConf // the newest hedger's, replaced under fleetSync.mu
	// ready is closed once the first sync ended (success or not).
	ready chan struct{}

	// Touched only by the sync that holds syncMu.
	syncMu       sync.Mutex
	demand       float64 // hedges asking for a token per sync, smoothed
	scarce       bool    // the last lease got less than it asked for
	synced       bool    // a sync ran (the first asks for more)
	lastRequests int64
	lastActive   time.Time
	// rate keeps (requests, hedges) at each heartbeat for the last minute.
	rate []rateSample
}

// routeConf is what the loop reads of a route's configuration.
type routeConf struct {
	switches   *Switches // the process's (Options.Switches)
	budget     config.BudgetConfig
	spendCap   int64
	tenantCaps bool
	names      []string       // upstream names, by index
	index      map[string]int // upstream indexes, by name
}

func newRouteConf(h *Hedger) *routeConf {
	c := &routeConf{switches: h.switches, budget: h.cfg.Budget, spendCap: h.spendCap, tenantCaps: h.tenantCaps,
		names: make([]string, len(h.cfg.Upstreams)), index: make(map[string]int, len(h.cfg.Upstreams))}
	for i, u := range h.cfg.Upstreams {
		c.names[i] = u.Name
		c.index[u.Name] = i
	}
	return c
}

type rateSample struct {
	requests, hedges int64
}

// fleetSync is the part of a Fleet that part 2 adds, guarded by its mu.
type fleetSync struct {
	mu       sync.Mutex
	routes   map[string]*fleetRoute       // by fleetRouteKey (not by *State: Yaegi)
	switches map[string]fleetstore.Switch // the fleet switches last read, by route name ("*": all)
	running  bool                         // the loop's timer is armed or its tick runs
	closed   bool
	timer    Timer
	tick     func() // the loop's one AfterFunc callback (made once: Yaegi)
	ticks    sync.WaitGroup
	lastBeat time.Time
	beats    int64 // heartbeats sent
	live     int   // replicas counted at the last heartbeat (0: unknown)
	started  time.Time
	// pending health events to publish, by health key, field -> ms.
	pending map[string]map[string]int64
	// unpublished health events whose publish failed, by health key,
	// field -> when the event ends (Fleet clock): the next round of the
	// loop publishes what is left of them.
	unpublished map[string]map[string]time.Time
	publishing  bool
	publishers  sync.WaitGroup
	// inBatch: the publisher has a batch on the wire; batches counts the
	// batches it finished, and batchEnd (on mu) wakes a round that waits
	// for the one on the wire (fleetAwaitBatch).
	inBatch  bool
	batches  uint64
	batchEnd *sync.Cond
}

// maxPendingPublish bounds the health keys waiting to be published.
const maxPendingPublish int = 64

func newFleetSync() *fleetSync {
	fs := &fleetSync{routes: map[string]*fleetRoute{}, switches: map[string]fleetstore.Switch{},
		pending: map[string]map[string]int64{}, unpublished: map[string]map[string]time.Time{}}
	fs.batchEnd = sync.NewCond(&fs.mu)
	return fs
}

// fleetDeposit is deposit for a hedger in a fleet: it attaches the route
// on its first request (and on the first request of a new hedger on the
// same State), then counts the request.
func fleetDeposit(h *Hedger) {
	b := h.state.bucket
	if !bucketCountFleet(b, h.attachKey) {
		fleetAttach(h)
		bucketCountAttached(b)
	}
}

// fleetAttach attaches h's route to its fleet: a new route gets a first
// sync now, within the fleet's timeout, before this request goes on.
func fleetAttach(h *Hedger) {
	f := h.fleet
	fs := f.sync
	st := h.state
	fs.mu.Lock()
	key := fleetRouteKey(h)
	r := fs.routes[key]
	if r != nil && r.bucket != st.bucket {
		r = nil // a State made again for the same route and shape replaces the old one
	}
	fresh := r == nil && !fs.closed
	if fresh {
		r = newFleetRoute(key, h, f.clock.Now())
		fs.routes[key] = r
		// A new State of a known route (a reload that changed its shape)
		// starts with the switches last read.
		setFleetSwitches(st.share, fs.switches[h.cfg.Route], fs.switches[fleetstore.SwitchAllRoutes])
	}
	if r != nil {
		r.conf = newRouteConf(h)
	}
	closed := fs.closed
	fs.mu.Unlock()
	if r == nil {
		// Closed: the State stays local.
		bucketSetOwner(st.bucket, h.attachKey)
		return
	}
	if fresh {
		fleetFirstSync(f, r)
	} else {
		<-r.ready
	}
	bucketSetOwner(st.bucket, h.attachKey)
	if !closed {
		fleetStartLoop(f)
	}
}

func newFleetRoute(key string, h *Hedger, now time.Time) *fleetRoute {
	st := h.state
	return &fleetRoute{key: key, name: h.cfg.Route, bucket: st.bucket, spend: st.spend, share: st.share,
		overload: st.overload, health: st.health, ready: make(chan struct{}), lastActive: now}
}

// fleetFirstSync is a route's first sync; whatever happens, the requests
// waiting for it go on.
func fleetFirstSync(f *Fleet, r *fleetRoute) {
	defer close(r.ready)
	fleetSyncRoute(f, r, fleetReadAllSwitch(f))
}

// fleetReadAllSwitch reads the switch of every route, once per round of
// the loop (and at a route's first sync): its key is a slot of its own on
// a Redis Cluster, so no route's script can read it. When the read fails
// the switch last read stays in force.
func fleetReadAllSwitch(f *Fleet) fleetstore.Switch {
	sw, err := fleetstore.ReadSwitch(f.conn, f.cfg.Prefix, fleetstore.SwitchAllRoutes)
	fs := f.sync
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err == nil {
		setSwitchMemo(fs, fleetstore.SwitchAllRoutes, sw)
	}
	return fs.switches[fleetstore.SwitchAllRoutes]
}

// fleetAttachKey is what a hedger attaches with: its fleet and what the
// loop reads of its configuration. A hedger with another key (a reload
// that changed the budget, another fleet) attaches again.
func fleetAttachKey(f *Fleet, cfg *config.Config, spendCap int64) string {
	b := &cfg.Budget
	key := f.replica + "|" + strconv.FormatFloat(b.Ratio, 'g', -1, 64) + "|" + strconv.FormatFloat(b.Burst, 'g', -1, 64) +
		"|" + strconv.Itoa(b.MaxConcurrentHedges) + "|" + strconv.FormatFloat(b.OverloadRate, 'g', -1, 64) +
		"|" + strconv.FormatInt(b.TenantTokensPerMinute, 10) + "|" + strconv.FormatInt(spendCap, 10) +
		"|" + strconv.FormatFloat(b.PromptUSDPerMillion, 'g', -1, 64)
	for _, u := range cfg.Upstreams {
		key += "|" + u.Name
	}
	return key
}

// fleetRouteKey names an attached route: its name and its State's shape
// (what adapters key their States by).
func fleetRouteKey(h *Hedger) string { return h.cfg.Route + "\x00" + h.state.shape }

// fleetStartLoop arms the loop's timer unless it runs.
func fleetStartLoop(f *Fleet) {
	fs := f.sync
	fs.mu.Lock()
	if fs.running || fs.closed {
		fs.mu.Unlock()
		return
	}
	fs.running = true
	if fs.tick == nil {
		fs.tick = func() { fleetTick(f) }
	}
	fs.timer = fleetArm(f)
	fs.mu.Unlock()
}

// fleetArm arms the loop's next tick. Through a typed local: see
// SystemClock.AfterFunc.
func fleetArm(f *Fleet) Timer {
	var t Timer = f.clock.AfterFunc(time.Duration(f.cfg.SyncInterval), f.sync.tick)
	return t
}

// fleetTick is one round of the loop: sync, then arm the next.
func fleetTick(f *Fleet) {
	fs := f.sync
	fs.mu.Lock()
	if fs.closed {
		fs.running = false
		fs.mu.Unlock()
		return
	}
	fs.ticks.Add(1)
	fs.mu.Unlock()
	fleetRound(f)
	fs.mu.Lock()
	if fs.closed {
		fs.running = false
	} else {
		fs.timer = fleetArm(f)
	}
	fs.mu.Unlock()
	fs.ticks.Done()
}

// fleetRound is one round of the loop: the health events this replica saw
// go out first (the publisher's batch on the wire, then any left pending,
// then the ones whose publish failed before), so that the sync that
// follows reads them back with the others'; then every route syncs, and
// the heartbeat and the eviction policy follow when due.
func fleetRound(f *Fleet) {
	fleetAwaitBatch(f.sync)
	fleetPublishPending(f)
	fleetRepublish(f)
	fleetSyncAll(f)
}

// fleetAwaitBatch waits for the publisher's batch on the wire, if any: one
// batch, never for the publisher to run dry (under a stream of 429s it
// may not, and the loop must go on: the switch, the budget, the
// heartbeat).
func fleetAwaitBatch(fs *fleetSync) {
	fs.mu.Lock()
	if fs.inBatch {
		n := fs.batches
		for fs.batches == n {
			fs.batchEnd.Wait()
		}
	}
	fs.mu.Unlock()
}

// Close stops the fleet's sync loop and its publisher and waits for them,
// and removes this replica's heartbeat (within the fleet's timeout). The
// Fleet stays usable for keyed requests; its routes keep local budgets.
// Adapters call it when they drop the Fleet (Caddy's Cleanup, the Envoy
// server's shutdown); closing twice does nothing.
func (f *Fleet) Close() {
	fs := f.sync
	fs.mu.Lock()
	if fs.closed {
		fs.mu.Unlock()
		return
	}
	fs.closed = true
	beat := !fs.lastBeat.IsZero()
	if fs.timer != nil && fs.timer.Stop() {
		fs.running = false
	}
	routes := make([]*fleetRoute, 0, len(fs.routes))
	for _, r := range fs.routes {
		routes = append(routes, r)
	}
	fs.mu.Unlock()
	fs.ticks.Wait()
	fs.publishers.Wait()
	// Nobody syncs the routes any more: their budgets are local again.
	for _, r := range routes {
		bucketRelease(r.bucket, false)
		spendRelease(r.spend)
		atomic.StoreInt32(&r.share.live, 0)
	}
	if beat {
		// Best effort: the heartbeat expires anyway.
		fleetstore.Leave(f.conn, f.cfg.Prefix, f.replica)
	}
}

// fleetSyncAll syncs every attached route (an idle one only when the
// heartbeat is due), detaches superseded idle ones, heartbeats when it is
// time, and reads Redis' eviction policy when due.
func fleetSyncAll(f *Fleet) {
	fleetCheckPolicy(f)
	fs := f.sync
	now := f.clock.Now()
	fs.mu.Lock()
	routes := make([]*fleetRoute, 0, len(fs.routes))
	for _, r := range fs.routes {
		routes = append(routes, r)
	}
	beat := now.Sub(fs.lastBeat) >= fleetstore.HeartbeatInterval
	if beat {
		fs.lastBeat = now
	}
	fs.mu.Unlock()
	var all fleetstore.Switch
	if len(routes) > 0 {
		all = fleetReadAllSwitch(f)
	}
	active := make([]time.Time, len(routes))
	for i, r := range routes {
		active[i] = fleetNoteActivity(r, now)
	}
	kept := make([]*fleetRoute, 0, len(routes))
	for i, r := range routes {
		idle := now.Sub(active[i]) >= fleetRouteIdle
		if idle && fleetSuperseded(routes, active, i) {
			fleetDetach(f, r)
			continue
		}
		kept = append(kept, r)
		if idle && !beat {
			continue
		}
		fleetSyncRoute(f, r, all)
	}
	if beat {
		fleetHeartbeat(f, kept, now)
	}
}

// fleetNoteActivity returns when r's route last had a request (as seen by
// the loop's rounds).
func fleetNoteActivity(r *fleetRoute, now time.Time) time.Time {
	requests, _, _ := bucketFigures(r.bucket)
	r.syncMu.Lock()
	defer r.syncMu.Unlock()
	if requests != r.lastRequests {
		r.lastRequests = requests
		r.lastActive = now
	}
	return r.lastActive
}

// fleetSuperseded reports whether another attached route of the same name
// had a request more recently than routes[i] (ties: the greater key
// stays), active being each one's last request.
func fleetSuperseded(routes []*fleetRoute, active []time.Time, i int) bool {
	r := routes[i]
	for j, o := range routes {
		if j == i || o.name != r.name {
			continue
		}
		if active[j].After(active[i]) || active[j].Equal(active[i]) && o.key > r.key {
			return true
		}
	}
	return false
}

// fleetDetach detaches r (a superseded State of its route): the State's
// next request attaches it again.
func fleetDetach(f *Fleet, r *fleetRoute) {
	fs := f.sync
	fs.mu.Lock()
	if fs.routes[r.key] == r {
		delete(fs.routes, r.key)
	}
	fs.mu.Unlock()
	bucketRelease(r.bucket, true)
	atomic.StoreInt32(&r.share.live, 0)
}

// leaseWant is how many tokens a sync asks for: enough to hold twice the
// smoothed demand per sync or what the replica's own requests earned
// since the last sync (ratio × requests), whichever is more, at least one
// token and at most fleetMaxLease, less what it holds. After a short lease
// (the bucket runs dry) the target is about its own share, so that
// replicas share a scarce bucket rather than race for it. A route's first
// sync asks for half the burst, as a replica's own bucket would start full.
func leaseWant(r *fleetRoute, held float64, asked, deposits int64, ratio, burst float64, first bool) float64 {
	r.demand = 0.5*r.demand + 0.5*float64(asked)
	target := math.Ceil(2 * r.demand)
	share := math.Ceil(ratio * float64(deposits))
	if share > target {
		target = share
	}
	if r.scarce && share+1 < target {
		target = share + 1
	}
	if first && target < math.Ceil(burst/2) {
		target = math.Ceil(burst / 2)
	}
	if target < 1 {
		target = 1
	}
	if target > fleetMaxLease {
		target = fleetMaxLease
	}
	need := math.Floor(target - held)
	if held < 1 && need < 1 {
		need = 1
	}
	if need < 0 {
		need = 0
	}
	return need
}

// fleetSyncRoute settles one route with the fleet (fleetstore.Sync); all
// is the switch of every route as this round read it. The route's bucket,
// spend meter and tenant meter give their counts under their own locks,
// and take the answer the same way.
func fleetSyncRoute(f *Fleet, r *fleetRoute, all fleetstore.Switch) {
	r.syncMu.Lock()
	defer r.syncMu.Unlock()
	f.sync.mu.Lock()
	conf := r.conf
	f.sync.mu.Unlock()
	now := f.clock.Now()

	var rep fleetstore.SyncReport
	deposits, asked, held, ratio, burst := bucketSyncTake(r.bucket)
	rep.Ratio = ratio
	rep.Burst = burst
	rep.Deposits = deposits
	if ratio >= 0 {
		rep.Want = leaseWant(r, held, asked, deposits, ratio, burst, !r.synced)
	}
	if r.overload.tooHigh(conf.budget.OverloadRate) {
		rep.OverloadMS = int64(fleetOverloadHold(f) / time.Millisecond)
	}
	rep.Spend = fleetSpendOut(r.spend, conf.spendCap, !r.synced, now)
	rep.Minute = -1
	if conf.tenantCaps {
		tenants, adds, minute := tenantSyncTake(r.share.tenants, now)
		rep.Tenants = tenants
		rep.TenantAdds = adds
		rep.Minute = minute
		rep.TenantWork = minute < 0 // Redis' minute to learn
	}

	res, err := fleetstore.Sync(f.conn, f.cfg.Prefix, r.name, &rep)
	if err != nil {
		fleetSyncFailed(r, &rep)
		return
	}
	atomic.StoreInt32(&r.share.live, 1)
	bucketGrant(r.bucket, res.Grant)
	r.scarce = ratio >= 0 && res.Grant < rep.Want
	r.synced = true

	setFleetSwitches(r.share, res.Switch, all)
	f.sync.mu.Lock()
	setSwitchMemo(f.sync, r.name, res.Switch)
	f.sync.mu.Unlock()

	applyHealth(r, conf.index, res.Health, now)
	fleetSpendIn(r.spend, res.Spend, now)
	tenantSyncApply(r.share.tenants, rep.Tenants, res.TenantTotals, res.TenantMinute, now)
	fleetSetCap(f, r.share, conf.budget.MaxConcurrentHedges)
}

// fleetSyncFailed puts a failed sync's counts back and turns the route
// local: its bucket takes this replica's requests again (keeping the
// tokens it holds), tenants fall back to this replica's own cap, and the
// spend beyond the reservation held is checked against the fleet's total
// as last read.
func fleetSyncFailed(r *fleetRoute, rep *fleetstore.SyncReport) {
	bucketRelease(r.bucket, false)
	atomic.StoreInt32(&r.share.live, 0)
	spendGiveBack(r.spend, rep.Spend)
	tenantSyncGiveBack(r.share.tenants, rep.Tenants, rep.TenantAdds, rep.Minute)
}

// setSwitchMemo remembers the fleet's switch of route, bounded: zero
// switches are forgotten. Call with fs.mu held.
func setSwitchMemo(fs *fleetSync, route string, s fleetstore.Switch) {
	if s.IsZero() {
		delete(fs.switches, route)
		return
	}
	fs.switches[route] = s
}

// applyHealth applies the fleet's health events to r's upstreams
// (upstreams: index by name) and its overload stop.
func applyHealth(r *fleetRoute, upstreams map[string]int, events []fleetstore.HealthEvent, now time.Time) {
	for _, e := range events {
		until := now.Add(e.Left)
		if e.Name == "overload" {
			applyFleetOverload(r.overload, until)
			continue
		}
		kind, upstream, ok := strings.Cut(e.Name, ":")
		if !ok {
			continue
		}
		idx, known := upstreams[upstream]
		if !known || idx >= len(r.health) {
			continue
		}
		applyFleetHealth(r.health[idx], kind == "open", until)
	}
}

// fleetOverloadHold is how long a replica's overload stop holds for the
// fleet after it last saw it: a few sync intervals, at least a second.
func fleetOverloadHold(f *Fleet) time.Duration {
	d := 4 * time.Duration(f.cfg.SyncInterval)
	if d < time.Second {
		d = time.Second
	}
	return d
}

// fleetSetCap sets st's share of the concurrent-hedge cap: cap / live
// replicas, at least 1 (no cap: nothing to share).
func fleetSetCap(f *Fleet, sh *routeShare, limit int) {
	f.sync.mu.Lock()
	live := f.sync.live
	f.sync.mu.Unlock()
	share := int64(0)
	if limit > 0 && live > 1 {
		share = int64(limit / live)
		if share < 1 {
			share = 1
		}
	}
	atomic.StoreInt64(&sh.cap, share)
}

// fleetNoteFailure publishes what a failed attempt started on this
// replica: a cool-down, an open breaker, the overload stop.
func fleetNoteFailure(h *Hedger, a *attempt, cooled, opened time.Duration) {
	key := fleetstore.HealthKey(h.fleet.cfg.Prefix, h.cfg.Route)
	name := h.cfg.Upstreams[a.upstream].Name
	if cooled > 0 {
		fleetPublish(h.fleet, key, "cool:"+name, cooled)
	}
	if opened > 0 {
		fleetPublish(h.fleet, key, "open:"+name, opened)
	}
	if (a.status == 429 || a.status == 503) && h.state.overload.tooHigh(h.cfg.Budget.OverloadRate) {
		fleetPublish(h.fleet, key, "overload", fleetOverloadHold(h.fleet))
	}
}

// fleetPublish queues a health event (coalesced: the longest per field)
// and starts the publisher unless it runs. Bounded: at most
// maxPendingPublish keys wait; more events are dropped (the local state
// still has them).
func fleetPublish(f *Fleet, key, field string, d time.Duration) {
	fs := f.sync
	ms := int64(d / time.Millisecond)
	if ms < 1 {
		return
	}
	fs.mu.Lock()
	if fs.closed {
		fs.mu.Unlock()
		return
	}
	fields := fs.pending[key]
	if fields == nil {
		if len(fs.pending) >= maxPendingPublish {
			fs.mu.Unlock()
			return
		}
		fields = map[string]int64{}
		fs.pending[key] = fields
	}
	if ms > fields[field] {
		fields[field] = ms
	}
	start := !fs.publishing
	if start {
		fs.publishing = true
		fs.publishers.Add(1)
	}
	fs.mu.Unlock()
	if start {
		go fleetPublisher(f)
	}
}

// fleetPublisher publishes until nothing is pending.
func fleetPublisher(f *Fleet) {
	fs := f.sync
	for {
		fs.mu.Lock()
		if len(fs.pending) == 0 {
			fs.publishing = false
			fs.mu.Unlock()
			fs.publishers.Done()
			return
		}
		fs.inBatch = true
		fs.mu.Unlock()
		fleetPublishPending(f)
		fs.mu.Lock()
		fs.inBatch = false
		fs.batches++
		fs.batchEnd.Broadcast()
		fs.mu.Unlock()
	}
}

// fleetPublishPending sends the pending health events, one script per key.
// A key whose publish fails (a timeout, Redis away) is kept as unpublished
// for the loop's next round: a cool-down must not stay on one replica
// because one write was lost.
func fleetPublishPending(f *Fleet) {
	fs := f.sync
	fs.mu.Lock()
	pending := fs.pending
	fs.pending = map[string]map[string]int64{}
	fs.mu.Unlock()
	for key, fields := range pending {
		sent := f.clock.Now()
		if err := fleetstore.Publish(f.conn, key, fields); err != nil {
			keepUnpublished(fs, key, fields, sent)
		}
	}
}

// keepUnpublished records the events of key that failed to publish, each
// ending ms after sent (the longest per field); bounded like pending.
func keepUnpublished(fs *fleetSync, key string, fields map[string]int64, sent time.Time) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.closed {
		return
	}
	kept := fs.unpublished[key]
	if kept == nil {
		if len(fs.unpublished) >= maxPendingPublish {
			return // this replica still has the events; the metrics count the error
		}
		kept = map[string]time.Time{}
		fs.unpublished[key] = kept
	}
	for field, ms := range fields {
		until := sent.Add(time.Duration(ms) * time.Millisecond)
		if until.After(kept[field]) {
			kept[field] = until
		}
	}
}

// fleetRepublish publishes again what is left of the unpublished events
// (the ones that have not ended); what fails again stays for the next round.
func fleetRepublish(f *Fleet) {
	fs := f.sync
	now := f.clock.Now()
	fs.mu.Lock()
	if len(fs.unpublished) == 0 {
		fs.mu.Unlock()
		return
	}
	again := false
	for key, kept := range fs.unpublished {
		for field, until := range kept {
			if ms := int64(until.Sub(now) / time.Millisecond); ms >= 1 {
				fields := fs.pending[key]
				if fields == nil {
					fields = map[string]int64{}
					fs.pending[key] = fields
				}
				if ms > fields[field] {
					fields[field] = ms
				}
				again = true
			}
		}
	}
	fs.unpublished = map[string]map[string]time.Time{}
	fs.mu.Unlock()
	if again {
		fleetPublishPending(f)
	}
}

// fleetHeartbeat writes this replica's ReplicaStatus and counts the live
// replicas.
func fleetHeartbeat(f *Fleet, routes []*fleetRoute, now time.Time) {
	fs := f.sync
	fs.mu.Lock()
	if fs.started.IsZero() {
		fs.started = now
	}
	started := fs.started
	fs.mu.Unlock()
	host, _ := os.Hostname()
	status := fleetstore.ReplicaStatus{ID: f.replica, Kind: f.kind, Host: host, PID: os.Getpid(),
		Started: started.UTC().Format(time.RFC3339), Routes: []fleetstore.ReplicaRoute{}}
	for _, r := range routes {
		status.Routes = append(status.Routes, replicaRoute(f, r, now))
	}
	fs.mu.Lock()
	fs.beats++
	prune := fs.beats%10 == 1
	fs.mu.Unlock()
	live, err := fleetstore.Heartbeat(f.conn, f.cfg.Prefix, &status, prune)
	if err != nil {
		return
	}
	fs.mu.Lock()
	fs.live = int(live)
	fs.mu.Unlock()
	if f.metrics != nil {
		f.metrics.Record(MetricFleetReplicas, []string{f.name}, float64(live))
	}
}

// replicaRoute is r as the heartbeat reports it.
func replicaRoute(f *Fleet, r *fleetRoute, now time.Time) fleetstore.ReplicaRoute {
	f.sync.mu.Lock()
	conf := r.conf
	f.sync.mu.Unlock()
	requests, hedges, tokens := bucketFigures(r.bucket)
	out := fleetstore.ReplicaRoute{Name: r.name, Requests: requests, Hedges: hedges, BudgetTokens: tokens}
	r.syncMu.Lock()
	r.rate = append(r.rate, rateSample{requests: out.Requests, hedges: out.Hedges})
	limit := int(time.Minute/fleetstore.HeartbeatInterval) + 1
	if len(r.rate) > limit {
		r.rate = r.rate[len(r.rate)-limit:]
	}
	first := r.rate[0]
	r.syncMu.Unlock()
	if n := out.Requests - first.requests; n > 0 {
		out.HedgeRate = float64(out.Hedges-first.hedges) / float64(n)
	}
	for i, u := range r.health {
		if i >= len(conf.names) {
			break
		}
		cooling, open := healthState(u, now)
		if cooling {
			out.Cooled = append(out.Cooled, conf.names[i])
		}
		if open {
			out.Open = append(out.Open, conf.names[i])
		}
	}
	out.Switch = mergedSwitch(conf.switches, r.share, r.name).String()
	spent, capped := spendSnapshot(r.spend, now)
	out.SpendTokens = spent
	out.SpendCapped = capped
	if price := conf.budget.PromptUSDPerMillion; price > 0 {
		out.SpendUSD = float64(spent) * price / 1e6
	}
	return out
}

// LiveReplicas returns the replicas of the fleet counted at this one's
// last heartbeat (0 before the first).
func (f *Fleet) LiveReplicas() int {
	f.sync.mu.Lock()
	n := f.sync.live
	f.sync.mu.Unlock()
	return n
}

// ReplicaID is this replica's id in the fleet (its heartbeat's key).
func (f *Fleet) ReplicaID() string { return f.replica }
