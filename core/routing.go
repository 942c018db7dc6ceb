package core

import (
	"sort"
	"strconv"
	"sync"
	"time"
)

// Primary-selection policies (Config.Primary).
const (
	// PrimaryOrdered sends attempt 0 to the first healthy upstream in the
	// configured order, each hedge to the next.
	PrimaryOrdered = "ordered"
	// PrimaryFastest sends attempt 0 to the healthy upstream whose recent
	// TTFT is lowest (scaled by its prefer_margin), each hedge to the next
	// in the same ranking.
	PrimaryFastest = "fastest"
)

// Routing constants of primary fastest, chosen for the regime the policy
// is for (an upstream that degrades for minutes, not one slow answer).
// Each upstream keeps its last 32 TTFT samples. Their median ranks the
// upstreams: deaf to the 1–2 % stalls of a calm upstream, and, with the
// hysteresis, steady enough that two upstreams of equal speed do not trade
// places on noise. The last 8 samples decide quickly: when 7 of them were
// slower than 1.6× another upstream's median (a calm upstream's tail does
// that about once in a million requests) the primary is left a few
// requests after a degradation began; when 6 of them are within its
// margin again, a preferred upstream takes the primary back.
const (
	// routeWindow is how many recent TTFT samples each upstream keeps.
	routeWindow int = 32
	// routeRecent is how many of them the quick rules read.
	routeRecent int = 8
	// routeMinSamples before an upstream's median counts: a primary with
	// fewer keeps its place, a candidate with fewer is explored, not chosen.
	routeMinSamples int = 16
	// routeHysteresis: the primary gives way to an upstream of no higher
	// preference when its median is this factor above the other's...
	routeHysteresis float64 = 1.5
	// routeFastHysteresis: ...or 7 of its last 8 samples are this factor
	// above the other's median.
	routeFastHysteresis float64 = 1.6
	// routeExploreEvery: one request in this many sends its attempt 0 to
	// the second-ranked upstream (its hedge to the first), so that an
	// upstream that recovered is noticed: about 3 % of requests.
	routeExploreEvery uint64 = 32
)

// routeEstimate is one upstream's recent TTFT: the last routeWindow
// samples in a ring, their median and two ranks of the last routeRecent,
// recomputed on every sample (copies and sort.Float64s: compiled code
// under Yaegi). Durations are float64 nanoseconds.
type routeEstimate struct {
	ring   []float64
	sorted []float64
	next   int
	count  int
	// written counts the samples ever written: sample number k (from 1)
	// sits in ring[(k-1) % routeWindow] until written reaches k+routeWindow.
	written uint64
	median  float64 // of the ring (compared once count >= routeMinSamples)
	slow    float64 // the 2nd fastest of the last 8: 7 of them took at least this
	fast    float64 // the 6th fastest of the last 8: 6 of them took at most this
	// waited[i]: ring[i] was noted when its hedge delay passed (routeWaiting);
	// waitedRecent counts those among the last 8.
	waited       []bool
	waitedRecent int
	// preferFactor is 1 + the upstream's prefer_margin: its times are
	// divided by it before comparison.
	preferFactor float64
}

// router keeps the estimates of one route's upstreams, the primary in
// force and the exploration counter, under one mutex. It lives in State,
// so it survives reloads.
type router struct {
	mu       sync.Mutex
	est      []*routeEstimate
	primary  int
	requests uint64
	changes  int64
}

func newRouter(n int) *router {
	r := &router{}
	for i := 0; i < n; i++ {
		e := &routeEstimate{ring: make([]float64, routeWindow), sorted: make([]float64, 0, routeWindow), waited: make([]bool, routeWindow),
			preferFactor: 1}
		r.est = append(r.est, e)
	}
	return r
}

// setPreferences copies each upstream's prefer_margin into the router (a
// reload may change them without changing the State's shape).
func setPreferences(r *router, ups []UpstreamConfig) {
	r.mu.Lock()
	for i := 0; i < len(r.est) && i < len(ups); i++ {
		r.est[i].preferFactor = 1 + float64(ups[i].PreferMargin)
	}
	r.mu.Unlock()
}

// routeSample records a TTFT sample of upstream up and returns its number
// (for routeRaise; 0 when it was not recorded). A censored sample (the
// attempt was still without output after d: its TTFT is at least d)
// counts only when it is at or above the median of the samples so far:
// below it (or with no sample yet) it says nothing about which side of the
// median the TTFT falls on. Recorded at its lower bound, it still moves
// the median the right way.
func routeSample(r *router, up int, d time.Duration, censored bool) uint64 {
	k := routeRecord(r, up, d, censored, false)
	return k
}

// routeRecord is routeSample; waited marks a sample taken when the hedge
// delay passed (see routeWaiting).
func routeRecord(r *router, up int, d time.Duration, censored, waited bool) uint64 {
	r.mu.Lock()
	e := r.est[up]
	v := float64(d)
	if censored && (e.count == 0 || v < e.median) {
		r.mu.Unlock()
		return 0
	}
	e.ring[e.next] = v
	e.waited[e.next] = waited
	e.next = (e.next + 1) % len(e.ring)
	if e.count < len(e.ring) {
		e.count++
	}
	e.written++
	k := e.written
	refreshEstimate(e)
	r.mu.Unlock()
	return k
}

// routeRaise raises sample number k of upstream up (from routeSample) to
// d, when d is larger and the sample is still in the ring: an attempt
// noted as censored when the hedge delay passed waited longer in the end
// (until the commit of the attempt that beat it, or its own first event).
func routeRaise(r *router, up int, k uint64, d time.Duration) {
	r.mu.Lock()
	e := r.est[up]
	if k == 0 || e.written-k >= uint64(len(e.ring)) {
		r.mu.Unlock()
		return
	}
	slot := int((k - 1) % uint64(len(e.ring)))
	if float64(d) > e.ring[slot] {
		e.ring[slot] = float64(d)
		refreshEstimate(e)
	}
	r.mu.Unlock()
}

// refreshEstimate recomputes e's median and recent ranks; r.mu is held.
func refreshEstimate(e *routeEstimate) {
	e.sorted = append(e.sorted[:0], e.ring[:e.count]...)
	sort.Float64s(e.sorted)
	e.median = e.sorted[e.count/2]
	recentRanks(e)
}

// recentRanks sets e.slow and e.fast from e's last routeRecent samples
// (e.sorted is scratch once the median has been read from it). With fewer
// samples they are the fastest and the slowest: no quick decision yet.
func recentRanks(e *routeEstimate) {
	k := routeRecent
	if e.count < k {
		k = e.count
	}
	e.sorted = e.sorted[:0]
	e.waitedRecent = 0
	for i := 1; i <= k; i++ {
		j := (e.next - i + len(e.ring)) % len(e.ring)
		e.sorted = append(e.sorted, e.ring[j])
		if e.waited[j] {
			e.waitedRecent++
		}
	}
	sort.Float64s(e.sorted)
	if k < routeRecent {
		e.slow = e.sorted[0]
		e.fast = e.sorted[k-1]
		return
	}
	e.slow = e.sorted[1]
	e.fast = e.sorted[routeRecent-3]
}

// routeScore is the estimate an upstream is ranked by (its median over
// 1 + its prefer margin), and whether it has enough samples to be
// compared; r.mu is held.
func routeScore(r *router, up int) (float64, bool) {
	e := r.est[up]
	if e.count < routeMinSamples {
		return 0, false
	}
	s := e.median / e.preferFactor
	return s, true
}

// takesOver reports whether upstream c should replace the primary p; r.mu
// is held. An upstream preferred over p (a larger prefer margin) takes
// over as soon as it is within its margin again: 6 of its last 8 samples,
// scaled, at most p's median, scaled (its recent samples, not its median:
// just after it was left for being slow its median still holds the calm
// samples from before). The margin is the band that keeps the two from
// flapping. Otherwise c takes over when p is clearly slower: 7 of p's
// last 8 samples above c's median by routeFastHysteresis, or p's median
// and 6 of its last 8 samples above c's median by routeHysteresis (all
// scaled).
func takesOver(r *router, p, c int) bool {
	cs, cok := routeScore(r, c)
	ps, pok := routeScore(r, p)
	if !cok || !pok {
		return false
	}
	ep, ec := r.est[p], r.est[c]
	if ec.preferFactor > ep.preferFactor {
		return ec.fast/ec.preferFactor <= ps
	}
	if ep.slow/ep.preferFactor > cs*routeFastHysteresis {
		return true
	}
	// 7 of p's last 8 attempts still waited when their hedge delay (p's
	// p95) passed, one in a million for a calm upstream: p is degraded, and
	// c, faster than those waits, takes over. This decides within one
	// delay even when the delay is close to the median, and whatever p's
	// prefer margin, which the 1.6x rule would need raised samples for.
	if ep.waitedRecent >= routeRecent-1 && ep.slow/ep.preferFactor > cs {
		return true
	}
	// The median rule needs the recent samples to agree (6 of the last 8
	// slower too): a primary that took over on its recent samples still
	// has the slow median of the time before.
	return ps > cs*routeHysteresis && ep.fast/ep.preferFactor > cs*routeHysteresis
}

// routePlan ranks the upstreams for one request: order[0] is the primary in
// force (first replaced by the fastest upstream that takes over, see
// takesOver), the others follow by score, those without an estimate last
// in configured order. It reports whether this request explores (its
// attempt 0 then goes to order[1], and hedges to order[0]) and whether the
// primary changed.
func routePlan(r *router) ([]int, bool, bool) {
	n := len(r.est)
	order := make([]int, 0, n)
	r.mu.Lock()
	r.requests++
	next := -1
	nextScore := 0.0
	for i := 0; i < n; i++ {
		if i == r.primary || !takesOver(r, r.primary, i) {
			continue
		}
		s, _ := routeScore(r, i)
		if next < 0 || s < nextScore {
			next = i
			nextScore = s
		}
	}
	changed := next >= 0
	if changed {
		r.primary = next
		r.changes++
	}
	order = append(order, r.primary)
	order = appendRanked(r, order)
	explore := n > 1 && r.requests%routeExploreEvery == 0
	r.mu.Unlock()
	return order, explore, changed
}

// appendRanked appends every upstream but order[0] to order: those with an
// estimate by ascending score, then the rest in configured order (a
// selection sort: routes have a handful of upstreams); r.mu is held.
func appendRanked(r *router, order []int) []int {
	n := len(r.est)
	first := order[0]
	known := len(order)
	for i := 0; i < n; i++ {
		if _, ok := routeScore(r, i); ok && i != first {
			order = append(order, i)
		}
	}
	for i := known; i < len(order); i++ {
		lowest := i
		lowestScore, _ := routeScore(r, order[i])
		for j := i + 1; j < len(order); j++ {
			s, _ := routeScore(r, order[j])
			if s < lowestScore {
				lowest = j
				lowestScore = s
			}
		}
		swap := order[i]
		order[i] = order[lowest]
		order[lowest] = swap
	}
	for i := 0; i < n; i++ {
		if _, ok := routeScore(r, i); !ok && i != first {
			order = append(order, i)
		}
	}
	return order
}

// planRoute ranks the upstreams for a race on a fastest route (rc.order;
// nil on an ordered route, which keeps the configured order) and marks an
// exploring race. An exploring race sends attempt 0 to the second-ranked
// upstream and hedges to the first, at the first's delay or, sooner, once
// the probe is clearly slower than the primary (routeHysteresis times the
// primary's median, see exploreDelay): exploring a degraded upstream costs
// the client little more than the primary's median, and the probe's
// censored sample is still at or above its median when it is as fast.
func planRoute(rc *race) {
	if rc.h.cfg.Primary != PrimaryFastest || len(rc.h.cfg.Upstreams) < 2 {
		return
	}
	r := rc.h.state.router
	order, explore, changed := routePlan(r)
	if changed {
		// The new primary's delay estimate holds what it saw while it was
		// not the primary (a degradation, hedges it won): it starts over,
		// at the fixed delay until it has min_samples of its own again.
		resetEstimator(rc.h.state.estimators[order[0]])
	}
	rc.delayFrom = order[0]
	if explore && !rc.passthrough {
		r.mu.Lock()
		if r.est[order[0]].count >= routeMinSamples {
			rc.exploreCap = time.Duration(r.est[order[0]].median * routeHysteresis)
		}
		r.mu.Unlock()
		swap := order[0]
		order[0] = order[1]
		order[1] = swap
		rc.exploring = true
	}
	rc.order = order
}

// routeWaiting notes, when the hedge delay passes, that the primary has had
// no output for that long: a censored sample taken at once, so that a
// degradation shows in the estimate after one delay, not after the answers.
func routeWaiting(rc *race) {
	if rc.order == nil || len(rc.attempts) == 0 {
		return
	}
	// Only the race loop's own fields of attempt 0 are read: its goroutine
	// may still be writing the rest. A primary that failed already has its
	// result; one whose first event is queued behind this timer is noted
	// at a wait a little longer than its TTFT, which learnRoute keeps.
	p := rc.attempts[0]
	if p.routeSample != 0 || p.result != "" {
		return
	}
	p.routeSample = routeRecord(rc.h.state.router, p.upstream, clockNow(rc.h).Sub(p.started), true, true)
}

// learnRoute feeds the race's attempt 0 (the primary, or an exploring
// request's probe) into the routing estimates once the race is over: its
// TTFT, or when another attempt won first, its wait until that commit as a
// censored sample (it took at least that long). Attempt 0 waits at least
// the hedge delay before anything censors it, so with a delay at or above
// its median (the adaptive p95 is) every censored sample is classified
// rightly, above the median, and the samples stay a fair draw. Hedges are
// not counted: a hedge is cut short by whatever is left of the primary's
// wait, often a few milliseconds, so its wins favour its fast answers and
// its cancelled attempts say "at least 5 ms" of an upstream that takes
// 30; kept or dropped, either side biases its upstream's median (dropping
// the short ones ratchets it up). Failed attempts are health's business. An
// attempt noted by routeWaiting is not counted twice: its sample is raised
// to what it waited in the end.
func learnRoute(rc *race) {
	a := rc.attempts[0]
	var d time.Duration
	censored := false
	switch {
	case a.result != ResultWon && a.result != ResultLost:
		return
	case !a.firstAt.IsZero():
		d = a.firstAt.Sub(a.started)
	case a.result == ResultLost && !rc.commitAt.IsZero():
		d = rc.commitAt.Sub(a.started)
		censored = true
	default:
		return
	}
	r := rc.h.state.router
	if a.routeSample != 0 {
		routeRaise(r, a.upstream, a.routeSample, d)
	} else {
		routeSample(r, a.upstream, d, censored)
	}
}

// RouteStatus is a snapshot of a fastest route's routing state.
type RouteStatus struct {
	// Primary is the index of the upstream in force as primary.
	Primary int
	// Changes counts how often the primary changed since the State was made.
	Changes int64
	// Medians are each upstream's recent median TTFT (0 without enough samples).
	Medians []time.Duration
}

// RouteStatus returns the route's routing state (primary fastest; on an
// ordered route the primary is always the first healthy upstream and
// Changes stays 0).
func (h *Hedger) RouteStatus() RouteStatus {
	r := h.state.router
	r.mu.Lock()
	st := RouteStatus{Primary: r.primary, Changes: r.changes}
	for i := 0; i < len(r.est); i++ {
		var m time.Duration
		if r.est[i].count >= routeMinSamples {
			m = time.Duration(r.est[i].median)
		}
		st.Medians = append(st.Medians, m)
	}
	r.mu.Unlock()
	return st
}

// raceDelayFrom is the upstream whose estimate sets the race's adaptive
// delay: its primary's, or on an exploring race the route's primary's.
func raceDelayFrom(rc *race, first int) int {
	if rc.exploring {
		return rc.delayFrom
	}
	return first
}

// exploreDelay is the hedge delay d of an exploring race, capped at
// rc.exploreCap (see planRoute); other races keep d.
func exploreDelay(rc *race, d time.Duration) time.Duration {
	if rc.exploring && rc.exploreCap > 0 && rc.exploreCap < d {
		return rc.exploreCap
	}
	return d
}

// currentOrder is the ranking a request starting now would get (nil on an
// ordered route); it neither counts the request nor explores.
func currentOrder(h *Hedger) []int {
	if h.cfg.Primary != PrimaryFastest || len(h.cfg.Upstreams) < 2 {
		return nil
	}
	r := h.state.router
	r.mu.Lock()
	order := make([]int, 0, len(r.est))
	order = append(order, r.primary)
	order = appendRanked(r, order)
	r.mu.Unlock()
	return order
}

// routeReport is what the report header adds on a fastest route: the
// primary in force, how often it changed, and whether this request
// explored.
func routeReport(rc *race) string {
	if rc.order == nil {
		return ""
	}
	r := rc.h.state.router
	r.mu.Lock()
	primary := r.primary
	changes := r.changes
	r.mu.Unlock()
	s := " primary=" + rc.h.cfg.Upstreams[primary].Name + " primary_changes=" + strconv.FormatInt(changes, 10)
	if rc.exploring {
		s += " explore=1"
	}
	return s
}

// validateRouting checks the primary policy and the upstreams' prefer
// margins of c (defaults applied).
func validateRouting(bad func(string, ...interface{}), c *Config) {
	if c.Primary != PrimaryOrdered && c.Primary != PrimaryFastest {
		bad("primary %q: want ordered or fastest", c.Primary)
	}
	for i, u := range c.Upstreams {
		if u.PreferMargin < 0 || u.PreferMargin > 10 {
			bad("upstream %d: prefer_margin %v: want 0..10 (0.25 or 25%% prefers it unless it is 25 %% slower)", i, float64(u.PreferMargin))
		}
		if u.PreferMargin != 0 && c.Primary != PrimaryFastest {
			bad("upstream %d: prefer_margin needs primary fastest (an ordered route always prefers the first upstream)", i)
		}
	}
}

// resetEstimator forgets e's samples.
func resetEstimator(e *ttftEstimator) {
	e.mu.Lock()
	e.next = 0
	e.count = 0
	e.stale = 0
	e.sorted = e.sorted[:0]
	e.cached = 0
	e.mu.Unlock()
}
