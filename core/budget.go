package core

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// hedgeBucket is the extra-load budget, in the style of gRPC retry
// throttling: every request adds `ratio` tokens (up to `burst`), every hedge
// takes one. Over a long run at most ratio×requests hedges start.
//
// In a fleet (leased) the bucket is the fleet's, in Redis, and tokens are
// this replica's lease from it: requests are counted in pending and
// reported by the fleet's sync loop, which leases more tokens (see
// fleetsync.go). While the fleet is away the bucket is local again.
type hedgeBucket struct {
	mu     sync.Mutex
	tokens float64
	ratio  float64
	burst  float64

	// The fleet's side, guarded by mu too (one lock per request).
	leased  bool  // tokens are leased from the fleet's bucket
	pending int64 // requests not yet reported to the fleet
	asked   int64 // hedges that asked for a token since the last sync
	// owner is the fleetAttachKey of the hedgers that attached this state
	// to their fleet ("": none). Hedgers of one configuration share it (a
	// Traefik middleware on several routers), so they do not take turns.
	owner string
	// requests and hedges count what this replica saw while in a fleet
	// (the heartbeat's figures).
	requests int64
	hedges   int64

	// timeAt is when take last refilled a local bucket by time.
	timeAt time.Time
}

// BudgetRefillTime is how long a local hedge bucket takes to refill by
// time alone: all of burst (one token a second at the defaults).
// Requests refill it far faster on a busy route; the floor is for the one
// a provider incident left with every request stuck on a stalled
// upstream, or a replica a restart left to drain its last requests: no
// request deposits anything there, and without it their stalls would
// wait alone. A route under 10 requests a second may so hedge more than
// ratio of them, at most one hedge a second more (at the defaults).
const BudgetRefillTime = 10 * time.Second

func newHedgeBucket(ratio, burst float64) *hedgeBucket {
	return &hedgeBucket{tokens: burst, ratio: ratio, burst: burst}
}

// deposit adds one request's share of hedge tokens, or counts the request
// for the fleet's bucket. (The per-request calls of this file are
// functions, not methods: see handle.)
func deposit(b *hedgeBucket) {
	if b.ratio < 0 {
		return
	}
	b.mu.Lock()
	if b.leased {
		depositLocked(b)
	} else {
		// depositLocked's local branch, inline: one call fewer per request
		// under Yaegi.
		b.tokens += b.ratio
		if b.tokens > b.burst {
			b.tokens = b.burst
		}
	}
	b.mu.Unlock()
}

func depositLocked(b *hedgeBucket) {
	if b.leased {
		b.pending++
		return
	}
	b.tokens += b.ratio
	if b.tokens > b.burst {
		b.tokens = b.burst
	}
}

// The bucket's fleet side: what the fleet's sync takes from it and gives
// it. Each function takes the bucket's lock itself.

// bucketCountFleet counts a request for the fleet when owner attached the
// bucket (the fleet's sync then reports it); false, counting nothing, when
// another configuration owns it and owner must attach first.
func bucketCountFleet(b *hedgeBucket, owner string) bool {
	b.mu.Lock()
	if b.owner != owner {
		b.mu.Unlock()
		return false
	}
	countFleetLocked(b)
	b.mu.Unlock()
	return true
}

// bucketCountAttached counts a request for the fleet once its hedger has
// attached, whoever owns the bucket by then.
func bucketCountAttached(b *hedgeBucket) {
	b.mu.Lock()
	countFleetLocked(b)
	b.mu.Unlock()
}

// countFleetLocked counts a request seen in a fleet and its deposit; b.mu
// is held.
func countFleetLocked(b *hedgeBucket) {
	b.requests++
	if b.ratio >= 0 {
		depositLocked(b)
	}
}

// bucketSetOwner records the configuration (fleetAttachKey) that attached b.
func bucketSetOwner(b *hedgeBucket, owner string) {
	b.mu.Lock()
	b.owner = owner
	b.mu.Unlock()
}

// bucketSyncTake takes the requests and the hedges' asks counted since the
// last sync (a failed sync does not put them back: the fleet's bucket
// missed a round of refills, never counted twice), and returns them with
// the tokens a lease holds and the budget.
func bucketSyncTake(b *hedgeBucket) (deposits, asked int64, held, ratio, burst float64) {
	b.mu.Lock()
	deposits = b.pending
	b.pending = 0
	asked = b.asked
	b.asked = 0
	if b.leased {
		held = b.tokens
	}
	ratio = b.ratio
	burst = b.burst
	b.mu.Unlock()
	return deposits, asked, held, ratio, burst
}

// bucketGrant adds a sync's grant. A bucket that was local becomes the
// fleet's lease again: what the local one held is dropped.
func bucketGrant(b *hedgeBucket, grant float64) {
	b.mu.Lock()
	if !b.leased {
		b.leased = true
		b.tokens = 0
	}
	b.tokens += grant
	b.mu.Unlock()
}

// bucketRelease makes b local again, keeping at most a burst of what it
// holds; detach also forgets its owner and the requests not reported.
func bucketRelease(b *hedgeBucket, detach bool) {
	b.mu.Lock()
	b.leased = false
	if b.tokens > b.burst {
		b.tokens = b.burst
	}
	if detach {
		b.owner = ""
		b.pending = 0
	}
	b.mu.Unlock()
}

// bucketFigures are the heartbeat's figures of b: requests and hedges seen
// in a fleet, and the tokens it may spend now.
func bucketFigures(b *hedgeBucket) (requests, hedges int64, tokens float64) {
	b.mu.Lock()
	requests = b.requests
	hedges = b.hedges
	tokens = b.tokens
	b.mu.Unlock()
	return requests, hedges, tokens
}

func (b *hedgeBucket) take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asked++
	if b.ratio >= 0 {
		if !b.leased {
			refillByTime(b, now)
		}
		if b.tokens < 1 {
			return false
		}
		b.tokens--
	}
	b.hedges++
	return true
}

// refillByTime adds what BudgetRefillTime gives a local bucket since the
// last take; b.mu is held.
func refillByTime(b *hedgeBucket, now time.Time) {
	if !b.timeAt.IsZero() && now.After(b.timeAt) {
		b.tokens += b.burst * float64(now.Sub(b.timeAt)) / float64(BudgetRefillTime)
		if b.tokens > b.burst {
			b.tokens = b.burst
		}
	}
	b.timeAt = now
}

// refund gives back the token of a hedge that took one and then did not
// start.
func refund(b *hedgeBucket) {
	b.mu.Lock()
	b.hedges--
	if b.ratio >= 0 {
		b.tokens++
		if b.tokens > b.burst && !b.leased {
			b.tokens = b.burst
		}
	}
	b.mu.Unlock()
}

// budgetTokens is what b lets hedges spend now.
func budgetTokens(b *hedgeBucket) float64 {
	b.mu.Lock()
	t := b.tokens
	b.mu.Unlock()
	return t
}

// takeHedgeSlot takes one of the limit slots for hedges in flight (limit
// negative: no cap, the hedge is only counted). Check and take are one
// compare-and-swap, so two requests cannot both take the last slot. The
// race gives the slot back with releaseHedgeSlot, once, when the hedge's
// terminal event is settled or when a later check denies the hedge.
func takeHedgeSlot(st *State, limit int) bool {
	if limit < 0 {
		atomic.AddInt64(&st.hedgesInFlight, 1)
		return true
	}
	for {
		n := atomic.LoadInt64(&st.hedgesInFlight)
		if n >= int64(limit) {
			return false
		}
		if atomic.CompareAndSwapInt64(&st.hedgesInFlight, n, n+1) {
			return true
		}
	}
}

// releaseHedgeSlot gives back a slot taken by takeHedgeSlot.
func releaseHedgeSlot(st *State) {
	atomic.AddInt64(&st.hedgesInFlight, -1)
}

// upstreamHealth is one upstream's cool-down (after 429/503) and circuit
// breaker. The breaker opens after `failures` consecutive failures for
// `open`. When that passes it is half-open: one attempt at a time may go
// through as its probe, and every other attempt treats the upstream as
// unavailable. The probe's success closes the breaker; its failure opens it
// again for twice the last open time, at most maxBreakerOpen (or `open`
// when that is longer); a probe that ends without an answer (cancelled,
// fatal 4xx) frees the slot for the next probe. While the breaker is open
// or half-open no other attempt's answer changes it.
type upstreamHealth struct {
	mu          sync.Mutex
	coolUntil   time.Time
	consecutive int
	tripped     bool // the breaker is open or half-open
	openUntil   time.Time
	openFor     time.Duration // the last open time, doubled by each failed probe
	probe       uint64        // the ticket of the probe in flight, 0: none
	tickets     uint64        // the last probe ticket handed out
	// fleetOpenUntil: another replica of the fleet opened its breaker on
	// this upstream; this one avoids it until then (and leaves the probe
	// to that replica). Its cool-downs go to coolUntil.
	fleetOpenUntil time.Time
}

// maxBreakerOpen caps the open time that failed probes double.
const maxBreakerOpen time.Duration = 5 * time.Minute

// healthy reports whether u may take an attempt at now: not cooling down,
// circuit closed, or half-open with no probe in flight.
func healthy(u *upstreamHealth, now time.Time) bool {
	u.mu.Lock()
	ok := !now.Before(u.coolUntil) && (!u.tripped || (!now.Before(u.openUntil) && u.probe == 0)) && !now.Before(u.fleetOpenUntil)
	u.mu.Unlock()
	return ok
}

// admit is healthy, and when u's breaker is half-open it makes the attempt
// u's probe: probe is the ticket that releaseProbe and recordFailure take,
// 0 for an ordinary attempt. Check and take are one step under u.mu.
//
// A closed breaker (the common case) is checked here, a tripped one by
// admitTripped: under Yaegi every slot of a frame is allocated on each
// call, taken branch or not, and each time comparison costs several.
func admit(u *upstreamHealth, now time.Time) (uint64, bool) {
	u.mu.Lock()
	if u.tripped {
		return admitTripped(u, now)
	}
	ok := !now.Before(u.coolUntil) && !now.Before(u.fleetOpenUntil)
	u.mu.Unlock()
	return 0, ok
}

// admitTripped is admit for a tripped breaker; u.mu is held, and it
// unlocks it.
func admitTripped(u *upstreamHealth, now time.Time) (uint64, bool) {
	if now.Before(u.coolUntil) || now.Before(u.openUntil) || u.probe != 0 || now.Before(u.fleetOpenUntil) {
		u.mu.Unlock()
		return 0, false
	}
	u.tickets++
	u.probe = u.tickets
	probe := u.probe
	u.mu.Unlock()
	return probe, true
}

// claimUpstream is pickUpstreamIn, admitting the attempt to the upstream it
// picks (probe as from admit). When another request took that upstream's
// probe between the pick and the admission, the upstream is no longer
// healthy and it picks again.
func claimUpstream(h *Hedger, order []int, used []int, now time.Time) (int, bool, uint64) {
	if used == nil {
		// Attempt 0, to the first upstream in order when it is healthy (the
		// common case): admit checks what healthy does, and under Yaegi the
		// pick's loop and calls cost more than the rest of the request's
		// routing.
		first := 0
		if order != nil {
			first = order[0]
		}
		if probe, ok := admit(h.state.health[first], now); ok {
			return first, true, probe
		}
	}
	up, available, probe := pickAndAdmit(h, order, used, now)
	return up, available, probe
}

// pickAndAdmit is claimUpstream's loop: pick, admit, pick again when
// another request took the probe in between. (Its own function: under
// Yaegi claimUpstream's frame would hold its slots on every request.)
func pickAndAdmit(h *Hedger, order []int, used []int, now time.Time) (int, bool, uint64) {
	for i := 0; i <= len(h.state.health); i++ {
		up, available := pickUpstreamIn(h, order, used, now)
		if !available {
			return up, false, 0
		}
		probe, ok := admit(h.state.health[up], now)
		if ok {
			return up, true, probe
		}
	}
	up, _ := pickUpstreamIn(h, order, used, now)
	return up, false, 0
}

// releaseProbe frees u's probe slot if probe still holds it: the probe
// ended without saying anything about u's health. Releasing twice, or a
// ticket of 0, does nothing.
func releaseProbe(u *upstreamHealth, probe uint64) {
	if probe == 0 {
		return
	}
	u.mu.Lock()
	if u.probe == probe {
		u.probe = 0
	}
	u.mu.Unlock()
}

// recordSuccess notes a valid first event or response of an attempt with
// ticket probe (from admit): the count of consecutive failures starts
// again, and the probe's success closes the breaker. While the breaker is
// open or half-open other attempts' answers change nothing (they were sent
// before it opened, or while nothing else was available): the probe decides.
func recordSuccess(u *upstreamHealth, probe uint64) {
	u.mu.Lock()
	if !u.tripped || (probe != 0 && probe == u.probe) {
		u.consecutive = 0
		u.tripped = false
		u.probe = 0
		u.openFor = 0
	}
	u.mu.Unlock()
}

// recordFailure notes an attempt that failed at now: connect error, 5xx,
// 408, 429, broken stream (client cancellations and fatal 4xx answers say
// nothing about the upstream's health). coolFor > 0 cools u down; probe
// is the attempt's ticket from admit. A failed probe opens the breaker
// again; other failures while it is open or half-open change nothing, as
// for recordSuccess. It returns what the failure started, for the fleet:
// cooled, the cool-down it extended (0: none), and opened, the open time
// of a breaker it opened (0: none).
func recordFailure(u *upstreamHealth, now time.Time, coolFor time.Duration, probe uint64, cfg *config.BudgetConfig) (cooled, opened time.Duration) {
	u.mu.Lock()
	if coolFor > 0 {
		until := now.Add(coolFor)
		if until.After(u.coolUntil) {
			u.coolUntil = until
			cooled = coolFor
		}
	}
	if probe != 0 && probe == u.probe {
		u.probe = 0
		u.openFor = nextOpenTime(u.openFor, time.Duration(cfg.BreakerOpen))
		u.openUntil = now.Add(u.openFor)
		opened = u.openFor
	} else if !u.tripped {
		u.consecutive++
		if u.consecutive >= cfg.BreakerFailures {
			u.tripped = true
			u.openFor = time.Duration(cfg.BreakerOpen)
			u.openUntil = now.Add(u.openFor)
			opened = u.openFor
		}
	}
	u.mu.Unlock()
	return cooled, opened
}

// applyFleetHealth applies another replica's cool-down (open false) or
// open breaker of u, in force until until.
func applyFleetHealth(u *upstreamHealth, open bool, until time.Time) {
	u.mu.Lock()
	if open {
		if until.After(u.fleetOpenUntil) {
			u.fleetOpenUntil = until
		}
	} else if until.After(u.coolUntil) {
		u.coolUntil = until
	}
	u.mu.Unlock()
}

// healthState reports whether u cools down and whether its breaker is open
// (its own or the fleet's) at now, for the heartbeat.
func healthState(u *upstreamHealth, now time.Time) (cooling, open bool) {
	u.mu.Lock()
	cooling = now.Before(u.coolUntil)
	open = (u.tripped && now.Before(u.openUntil)) || now.Before(u.fleetOpenUntil)
	u.mu.Unlock()
	return cooling, open
}

// nextOpenTime doubles the last open time after a failed probe, capped at
// maxBreakerOpen or the configured open time if that is longer.
func nextOpenTime(last, open time.Duration) time.Duration {
	limit := maxBreakerOpen
	if open > limit {
		limit = open
	}
	next := 2 * last
	if next > limit || next <= 0 {
		next = limit
	}
	return next
}

// coolDownFor returns how long a 429/503 answer cools its upstream down:
// Retry-After (seconds or an HTTP date) capped at max, else the default.
func coolDownFor(status int, retryAfter string, now time.Time, cfg *config.BudgetConfig) time.Duration {
	if status != 429 && status != 503 {
		return 0
	}
	d := time.Duration(cfg.CoolDown)
	if retryAfter != "" {
		if secs, err := strconv.Atoi(retryAfter); err == nil && secs >= 0 {
			d = time.Duration(secs) * time.Second
		} else if at, err := time.Parse(time.RFC1123, retryAfter); err == nil {
			d = at.Sub(now)
		}
	}
	if d > time.Duration(cfg.MaxCoolDown) {
		d = time.Duration(cfg.MaxCoolDown)
	}
	if d < 0 {
		d = 0
	}
	return d
}

// overloadWindow tracks the share of 429/503 among the last answers of all
// upstreams of a route. Hedging into an overloaded provider makes it worse.
type overloadWindow struct {
	mu         sync.Mutex
	ring       []bool
	next       int
	count      int
	overloaded int
	// fleetUntil: another replica of the fleet is overloaded until then.
	fleetUntil time.Time
}

func newOverloadWindow(size int) *overloadWindow {
	return &overloadWindow{ring: make([]bool, size)}
}

// recordStatus notes one upstream answer's status.
func recordStatus(o *overloadWindow, status int) {
	over := status == 429 || status == 503
	o.mu.Lock()
	if o.count == len(o.ring) {
		if o.ring[o.next] {
			o.overloaded--
		}
	} else {
		o.count++
	}
	o.ring[o.next] = over
	if over {
		o.overloaded++
	}
	o.next = (o.next + 1) % len(o.ring)
	o.mu.Unlock()
}

// tooHigh reports whether the recent overload rate exceeds rate; it needs at
// least 20 answers (or the whole window if smaller) to say so.
func (o *overloadWindow) tooHigh(rate float64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	need := 20
	if len(o.ring) < need {
		need = len(o.ring)
	}
	if o.count < need {
		return false
	}
	return float64(o.overloaded) > rate*float64(o.count)
}

// overloaded is tooHigh, or another replica of the fleet saw the
// overload and it is still in force at now.
func overloaded(o *overloadWindow, rate float64, now time.Time) bool {
	o.mu.Lock()
	fleet := now.Before(o.fleetUntil)
	o.mu.Unlock()
	return fleet || o.tooHigh(rate)
}

// applyFleetOverload makes o overloaded until until (another replica's).
func applyFleetOverload(o *overloadWindow, until time.Time) {
	o.mu.Lock()
	if until.After(o.fleetUntil) {
		o.fleetUntil = until
	}
	o.mu.Unlock()
}

// tenantBudget caps the estimated extra prompt tokens each tenant may spend on
// hedges per minute (fixed one-minute windows). At most maxTenants are
// tracked; when full, tenants whose window has passed are forgotten, and if
// none has, new tenants are refused a hedge (fail safe: no extra load).
type tenantBudget struct {
	mu        sync.Mutex
	perMinute int64
	tenants   map[string]*tenantWindow
}

type tenantWindow struct {
	start time.Time
	used  int64
}

const maxTenants = 10000

func newTenantBudget(perMinute int64) *tenantBudget {
	return &tenantBudget{perMinute: perMinute, tenants: make(map[string]*tenantWindow)}
}

func (t *tenantBudget) take(tenant string, tokens int64, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.tenants[tenant]
	if w == nil {
		if len(t.tenants) >= maxTenants {
			for name, old := range t.tenants {
				if now.Sub(old.start) >= time.Minute {
					delete(t.tenants, name)
				}
			}
			if len(t.tenants) >= maxTenants {
				return false
			}
		}
		w = &tenantWindow{start: now}
		t.tenants[tenant] = w
	}
	if now.Sub(w.start) >= time.Minute {
		w.start = now
		w.used = 0
	}
	if w.used+tokens > t.perMinute {
		return false
	}
	w.used += tokens
	return true
}

// giveBack returns tokens that take charged to tenant for a hedge that
// then did not start.
func (t *tenantBudget) giveBack(tenant string, tokens int64) {
	t.mu.Lock()
	if w := t.tenants[tenant]; w != nil && w.used >= tokens {
		w.used -= tokens
	}
	t.mu.Unlock()
}
