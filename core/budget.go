package core

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// hedgeBucket is the extra-load budget, in the style of gRPC retry
// throttling: every request adds `ratio` tokens (up to `burst`), every hedge
// takes one. Over a long run at most ratio×requests hedges start.
type hedgeBucket struct {
	mu     sync.Mutex
	tokens float64
	ratio  float64
	burst  float64
}

func newHedgeBucket(ratio, burst float64) *hedgeBucket {
	return &hedgeBucket{tokens: burst, ratio: ratio, burst: burst}
}

// deposit adds one request's share of hedge tokens. (The per-request
// calls of this file are functions, not methods: see handle.)
func deposit(b *hedgeBucket) {
	if b.ratio < 0 {
		return
	}
	b.mu.Lock()
	b.tokens += b.ratio
	if b.tokens > b.burst {
		b.tokens = b.burst
	}
	b.mu.Unlock()
}

func (b *hedgeBucket) take() bool {
	if b.ratio < 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// refund gives back the token of a hedge that took one and then did not
// start.
func refund(b *hedgeBucket) {
	if b.ratio < 0 {
		return
	}
	b.mu.Lock()
	b.tokens++
	if b.tokens > b.burst {
		b.tokens = b.burst
	}
	b.mu.Unlock()
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
// `open`; when that passes one attempt may go through (half-open): a success
// closes it, a failure opens it again at once.
type upstreamHealth struct {
	mu          sync.Mutex
	coolUntil   time.Time
	consecutive int
	openUntil   time.Time
}

// healthy reports whether u may take an attempt at now: not cooling down,
// circuit not open.
func healthy(u *upstreamHealth, now time.Time) bool {
	u.mu.Lock()
	ok := !now.Before(u.coolUntil) && !now.Before(u.openUntil)
	u.mu.Unlock()
	return ok
}

// recordSuccess notes a valid first event or response: the breaker's count
// of consecutive failures starts again.
func recordSuccess(u *upstreamHealth) {
	u.mu.Lock()
	u.consecutive = 0
	u.mu.Unlock()
}

// record notes an attempt's end. success: a valid first event or response;
// failure: connect error, 5xx, 408, 429, broken stream. Client cancellations
// and fatal 4xx answers say nothing about the upstream's health.
func (u *upstreamHealth) record(now time.Time, success bool, coolFor time.Duration, cfg *BudgetConfig) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if coolFor > 0 {
		until := now.Add(coolFor)
		if until.After(u.coolUntil) {
			u.coolUntil = until
		}
	}
	if success {
		u.consecutive = 0
		return
	}
	u.consecutive++
	if u.consecutive >= cfg.BreakerFailures {
		u.openUntil = now.Add(cfg.BreakerOpen)
	}
}

// coolDownFor returns how long a 429/503 answer cools its upstream down:
// Retry-After (seconds or an HTTP date) capped at max, else the default.
func coolDownFor(status int, retryAfter string, now time.Time, cfg *BudgetConfig) time.Duration {
	if status != 429 && status != 503 {
		return 0
	}
	d := cfg.CoolDown
	if retryAfter != "" {
		if secs, err := strconv.Atoi(retryAfter); err == nil && secs >= 0 {
			d = time.Duration(secs) * time.Second
		} else if at, err := time.Parse(time.RFC1123, retryAfter); err == nil {
			d = at.Sub(now)
		}
	}
	if d > cfg.MaxCoolDown {
		d = cfg.MaxCoolDown
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
