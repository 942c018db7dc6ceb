package core

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// State is what a route learns and rations across requests: TTFT estimators,
// the hedge budget, upstream health, the overload window, tenant caps and the
// idempotency table. Adapters keep it across configuration reloads (Caddy in
// a UsagePool) so a reload neither forgets the delay nor refills budgets.
type State struct {
	shape      string
	clock      Clock
	estimators []*ttftEstimator
	health     []*upstreamHealth
	bucket     *hedgeBucket
	overload   *overloadWindow
	tenants    *tenantBudget
	idem       *idempotencyTable
	// router ranks the upstreams of a fastest route (see routing.go).
	router *router
	// hedgesInFlight counts hedge attempts running now (atomic).
	hedgesInFlight int64
	// storeFull: until when the fleet store is full for the route's
	// answers (see fleetFinish).
	storeFull *fleetStoreFull
	// spend counts the route's estimated extra prompt tokens per hour.
	spend *spendMeter
	// share is the fleet's view, kept here so that it outlives a
	// configuration (fleetshare.go).
	share *routeShare
}

// NewState returns fresh state for cfg (defaults applied), on clock.
func NewState(cfg config.Config, clock Clock) *State {
	cfg = cfg.WithDefaults()
	if clock == nil {
		clock = SystemClock{}
	}
	s := &State{
		shape:     stateShape(cfg),
		clock:     clock,
		bucket:    newHedgeBucket(cfg.Budget.Ratio, cfg.Budget.Burst),
		storeFull: &fleetStoreFull{callers: map[string]time.Time{}},
		overload:  newOverloadWindow(cfg.Budget.OverloadWindow),
		tenants:   newTenantBudget(cfg.Budget.TenantTokensPerMinute),
		idem:      newIdempotencyTable(newMemoryStore(cfg.Idempotency.MaxEntries, int64(cfg.Idempotency.MaxBytes), clock)),
		spend:     &spendMeter{},
		share:     newRouteShare(),
	}
	s.router = newRouter(len(cfg.Upstreams))
	setPreferences(s.router, &cfg)
	for i := 0; i < len(cfg.Upstreams); i++ {
		s.estimators = append(s.estimators, newTTFTEstimator(cfg.Delay.Window, cfg.Delay.Quantile))
		s.health = append(s.health, &upstreamHealth{})
	}
	return s
}

// stateShape is what must match for State to be reused by a new config.
func stateShape(cfg config.Config) string {
	// Every field NewState reads.
	s := fmt.Sprintf("%d|%v|%v|%v|%v|%d|%d|%d|%d", len(cfg.Upstreams), cfg.Delay.Window, cfg.Delay.Quantile,
		cfg.Budget.Ratio, cfg.Budget.Burst, cfg.Budget.OverloadWindow, cfg.Budget.TenantTokensPerMinute,
		cfg.Idempotency.MaxEntries, cfg.Idempotency.MaxBytes)
	for _, u := range cfg.Upstreams {
		s += "|" + u.URL
	}
	return s
}

// StateKey is the key under which adapters keep a route's State across
// configuration reloads: the route's name (default "default") and what the
// State must match (same upstreams, windows and budgets). Two routes with
// the same upstreams get different keys, so each keeps its own budget; a
// change of upstreams or windows gives a new key, and fresh state.
func StateKey(cfg config.Config) string {
	cfg = cfg.WithDefaults()
	return "state\x00" + cfg.Route + "\x00" + stateShape(cfg)
}

func (s *State) fits(cfg config.Config) bool { return s.shape == stateShape(cfg) }

// delayInForce is the hedge delay of a race whose attempt 0 goes to first
// (rc nil: a request starting now, which does not explore), the one place
// it is assembled: the kill switch's override when one is set; else, for
// an exploring race, the route primary's delay capped (exploreDelay); else
// first's own (hedgeDelay: fixed, or adaptive from its estimator).
func delayInForce(h *Hedger, rc *race, first int) time.Duration {
	// switchesSet, inline: without a switch anywhere, no call (Yaegi).
	if h.switchCount != nil && atomic.LoadInt64(h.switchCount) != 0 || atomic.LoadInt32(h.fleetSwitches) != 0 {
		if d := hedgeDelayOverride(h); d > 0 {
			return d
		}
	}
	if rc != nil && rc.exploring {
		return exploreDelay(rc, first)
	}
	if !h.adaptiveDelay {
		return h.fixedDelay // hedgeDelay's fixed case, without its frame
	}
	return hedgeDelay(h.state, h.cfg, first)
}

// hedgeDelay returns upstream up's own hedge delay: the fixed one, or the
// adaptive one from up's estimator once it has enough samples.
//
// Under Yaegi cfg.Delay.Mode would copy the whole DelayConfig into a frame
// slot, and every slot of the adaptive branch would be allocated on each
// call: the fixed delay is read through a pointer, the adaptive one in a
// function of its own.
func hedgeDelay(s *State, cfg *config.Config, up int) time.Duration {
	d := &cfg.Delay
	if d.Mode != config.DelayAdaptive {
		return time.Duration(d.Fixed)
	}
	return adaptiveDelay(s, d, up, cfg.Primary == config.PrimaryFastest && len(cfg.Upstreams) > 1)
}

// adaptiveDelay is hedgeDelay for an adaptive delay. On a fastest route
// it is capped by the other upstreams' speed (routeDelayRef), or, while
// no other upstream has an estimate to compare with, by the starting
// delay: a primary that degrades before then must still be hedged.
func adaptiveDelay(s *State, d *config.DelayConfig, up int, fastest bool) time.Duration {
	q, n := quantile(s.estimators[up])
	if n < d.MinSamples {
		return time.Duration(d.Fixed)
	}
	if q > time.Duration(d.Max) {
		q = time.Duration(d.Max)
	}
	if fastest {
		c := routeDelayRef(s.router, up)
		if c == 0 {
			c = time.Duration(d.Fixed)
		}
		if q > c {
			q = c
		}
	}
	if q < time.Duration(d.Min) {
		q = time.Duration(d.Min)
	}
	return q
}

// CurrentDelay returns the hedge delay that a request starting now would use.
func (h *Hedger) CurrentDelay() time.Duration {
	up, _ := pickUpstreamIn(h, currentOrder(h), nil, h.now())
	return delayInForce(h, nil, up)
}

// HedgesInFlight returns the number of hedge attempts running now.
func (h *Hedger) HedgesInFlight() int64 { return atomic.LoadInt64(&h.state.hedgesInFlight) }

// pickUpstream is pickUpstreamIn in the configured order.
func pickUpstream(h *Hedger, used []int, now time.Time) (int, bool) {
	up, ok := pickUpstreamIn(h, nil, used, now)
	return up, ok
}

// pickUpstreamIn returns the upstream for the next attempt and whether it
// is available (see healthy: not cooling down, circuit closed or free to
// probe). It only reads: claimUpstream also takes the probe slot. order
// ranks the upstreams (nil: the configured order); used[i] counts attempts
// already sent to upstream i (nil: none). In order of preference: the
// first available upstream among the least used, then the first available
// one, then (none available) the first of the least used, "first" in
// order's ranking.
func pickUpstreamIn(h *Hedger, order []int, used []int, now time.Time) (int, bool) {
	n := len(h.cfg.Upstreams)
	least := 0
	if used != nil {
		least = used[0]
		for i := 1; i < n; i++ {
			if used[i] < least {
				least = used[i]
			}
		}
	}
	firstLeast := -1
	firstAvailable := -1
	for k := 0; k < n; k++ {
		i := k
		if order != nil {
			i = order[k]
		}
		isLeast := used == nil || used[i] == least
		if isLeast && firstLeast < 0 {
			firstLeast = i
		}
		if !healthy(h.state.health[i], now) {
			continue
		}
		if isLeast {
			return i, true
		}
		if firstAvailable < 0 {
			firstAvailable = i
		}
	}
	if firstAvailable >= 0 {
		return firstAvailable, true
	}
	return firstLeast, false
}
