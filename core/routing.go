package core

import (
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
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
// places on noise. The last 8 finished attempts decide quickly: when 7 of
// them lost to their hedges (a calm upstream does that about once in a
// million requests), the primary is left a few requests after a
// degradation began; when 6 of them are within its margin again, a
// preferred upstream takes the primary back.
const (
	// routeWindow is how many recent TTFT samples each upstream keeps.
	routeWindow int = 32
	// routeRecent is how many finished attempts the quick rules read.
	routeRecent int = 8
	// routeMinSamples before an upstream's median counts: a primary with
	// fewer keeps its place, a candidate with fewer is explored, not chosen.
	routeMinSamples int = 16
	// routeHysteresis: the primary gives way to an upstream of no higher
	// preference when its median is this factor above the other's...
	routeHysteresis float64 = 1.5
	// routeFastHysteresis: ...or 7 of its last 8 attempts took this factor
	// times the other's median.
	routeFastHysteresis float64 = 1.6
	// routeExploreEvery: one request in this many sends its attempt 0 to
	// the second-ranked upstream (its hedge to the first), so that an
	// upstream that recovered is noticed: about 3 % of requests.
	routeExploreEvery uint64 = 32
	// routeExploreMax: while the runner-up's newest attempt found it slow
	// (routeExploreSlow times the primary's median: a calm upstream's
	// stall or tail about 3 times in 100), the interval doubles at each
	// exploration up to this: an upstream in an incident costs a probe and
	// its hedge one request in 128 rather than one in 32, and a recovery is
	// still noticed within a few hundred requests.
	routeExploreMax  uint64  = 128
	routeExploreSlow float64 = 2
	// routeExploreAttempts: an exploring race may make this many attempts
	// whatever max_attempts says, its hedges outside the budget (the
	// probe, a hedge to the primary, and that hedge's rescue).
	routeExploreAttempts int = 3
	// routeColdRaces: a route that starts with no estimate (a new process,
	// a new configuration) sends each request to its first two upstreams
	// at once until this many of those races have finished; an upstream
	// that won at least routeColdWins of them becomes the primary. Two
	// upstreams of equal speed do that about once in 500 starts (and lose
	// nothing by it); one 3x slower than the other loses 14 of 16 about 99
	// times in 100, stalls included. The route does not start blind on an
	// upstream that is in an incident right now, and needs no hedge, so no
	// budget, to learn it.
	routeColdRaces int = 16
	routeColdWins  int = 14
	// routeColdRaceMax bounds what the cold start costs: at most this many
	// requests race (those in flight when the 16th race ends are the rest).
	routeColdRaceMax uint64 = 64
	// routeBackSlack: a hedge goes back to its primary's upstream only
	// while 6 of the primary's last 8 attempts took at most this times its
	// median (hedgeBack): a calm upstream's spread and a stall or two stay
	// within it, one turning slow leaves it within a few attempts.
	routeBackSlack float64 = 2
	// routeDelayCap: on a fastest route the adaptive delay of an upstream
	// is at most this times the lowest median of the others, so that it
	// does not climb into a degraded primary's distribution, where no hedge
	// would fire and nothing would show that the primary should move.
	routeDelayCap float64 = 2
	// routeHedged: a primary whose recent attempts are slow moves when the
	// hedges beat all but one of its last this many attempts that ran
	// against one, however few of its recent attempts had a hedge (a
	// budget spent in the incident's first moments hedges few; a degraded
	// primary still wins one race in five or so): the slow recent attempts
	// say it is slow, and under a stall of the gateway the hedges are as
	// slow and lose.
	routeHedged int = 4
)

// routeEstimate is one upstream's recent TTFT, durations in float64
// nanoseconds: the last routeWindow samples in a ring and their median,
// and the last routeRecent finished attempts (their times, and whether a
// hedge beat them) with two ranks of those times. Recomputed on every
// sample: copies and sort.Float64s, compiled code under Yaegi.
type routeEstimate struct {
	ring   []float64
	sorted []float64
	next   int
	count  int
	// written counts the samples ever written: sample number k (from 1)
	// sits in ring[(k-1) % routeWindow] until written reaches k+routeWindow.
	written uint64
	median  float64 // of the ring (compared once count >= routeMinSamples)
	// score is median / preferFactor, what the upstream is ranked by, and
	// known says it has routeMinSamples behind it (kept up to date so that
	// a request reads fields, not calls: see the Yaegi notes).
	score float64
	known bool

	// The last routeRecent finished attempts, in the order they finished
	// (a sample taken when the hedge delay passed is in ring at once, and
	// here only when its race is over).
	recent       []float64
	recentBeaten []bool
	recentNext   int
	recentCount  int
	slow         float64 // the 2nd fastest of them: 7 took at least this
	fast         float64 // the 6th fastest: 6 took at most this
	beatenRecent int     // how many of them another attempt beat

	// preferFactor is 1 + the upstream's prefer_margin: its times are
	// divided by it before comparison.
	preferFactor float64

	// last is what the newest finished attempt waited (hedgeBack).
	last float64

	// The last routeHedged finished attempts that ran against a hedge:
	// whether the hedge beat each; hedgesBeatIt says it beat all but one.
	hedged       []bool
	hedgedNext   int
	hedgedCount  int
	hedgesWon    int
	hedgesBeatIt bool
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
	// The exploration's schedule: the next exploring request, and the
	// interval in force (routeExploreEvery, doubled while the runner-up is
	// slow, up to routeExploreMax).
	nextExplore  uint64
	exploreEvery uint64
	// hedging: the route can hedge (max_attempts > 1); without hedges no
	// attempt is ever beaten, and the median rule decides alone.
	hedging bool
	// mostPreferred is the largest preferFactor of any upstream: a primary
	// with it has no candidate of higher preference (routePlanOf's calm path).
	mostPreferred float64

	// The cold start (routeColdRaces): cold while it races; raced counts
	// the racing requests planned, racesDone those finished with a winner,
	// raceWins[i] the races upstream i won.
	cold      bool
	raced     uint64
	racesDone int
	raceWins  []int
}

func newRouter(n int) *router {
	r := &router{hedging: true, mostPreferred: 1, cold: n > 1, raceWins: make([]int, n),
		nextExplore: routeExploreEvery, exploreEvery: routeExploreEvery}
	for i := 0; i < n; i++ {
		e := &routeEstimate{ring: make([]float64, routeWindow), sorted: make([]float64, 0, routeWindow),
			recent: make([]float64, routeRecent), recentBeaten: make([]bool, routeRecent), preferFactor: 1,
			hedged: make([]bool, routeHedged)}
		r.est = append(r.est, e)
	}
	return r
}

// setPreferences copies each upstream's prefer_margin, and whether the
// route hedges, into the router (a reload may change them without
// changing the State's shape).
func setPreferences(r *router, cfg *config.Config) {
	r.mu.Lock()
	for i := 0; i < len(r.est) && i < len(cfg.Upstreams); i++ {
		r.est[i].preferFactor = 1 + float64(cfg.Upstreams[i].PreferMargin)
		r.est[i].score = r.est[i].median / r.est[i].preferFactor
	}
	refreshMostPreferred(r)
	r.hedging = cfg.MaxAttempts != 1
	if !r.hedging {
		r.cold = false
	}
	r.mu.Unlock()
}

// refreshMostPreferred recomputes r.mostPreferred after a preferFactor
// changed; r.mu is held.
func refreshMostPreferred(r *router) {
	r.mostPreferred = 0
	for _, e := range r.est {
		if e.preferFactor > r.mostPreferred {
			r.mostPreferred = e.preferFactor
		}
	}
}

// routeSample records a TTFT sample of upstream up in its ring and returns
// its number (for routeFinish; 0 when it was not recorded). A censored
// sample (the attempt was still without output after d: its TTFT is at
// least d) counts only when it is at or above the median of the samples
// so far: below it (or with no sample yet) it says nothing about which
// side of the median the TTFT falls on. Recorded at its lower bound, it
// still moves the median the right way.
func routeSample(r *router, up int, d time.Duration, censored bool) uint64 {
	r.mu.Lock()
	k := recordSample(r.est[up], d, censored)
	r.mu.Unlock()
	return k
}

// recordSample is routeSample; r.mu is held.
func recordSample(e *routeEstimate, d time.Duration, censored bool) uint64 {
	v := float64(d)
	if censored && (e.count == 0 || v < e.median) {
		return 0
	}
	e.ring[e.next] = v
	e.next = (e.next + 1) % len(e.ring)
	if e.count < len(e.ring) {
		e.count++
	}
	e.written++
	k := e.written
	refreshMedian(e)
	return k
}

// routeFinish records a finished attempt of upstream up that waited d
// (censored: it did not answer, another attempt won; beaten says so;
// hedged: a hedge ran against it): among its recent finished attempts,
// and in its ring, where it raises sample k (from routeSample, when the
// hedge delay passed) to d if that is still in the ring, or else is a
// sample of its own.
func routeFinish(r *router, up int, k uint64, d time.Duration, censored, beaten, hedged bool) {
	r.mu.Lock()
	e := r.est[up]
	v := float64(d)
	if k == 0 && !censored {
		// recordSample's work, inline: this is every request's path.
		e.ring[e.next] = v
		e.next = (e.next + 1) % len(e.ring)
		if e.count < len(e.ring) {
			e.count++
		}
		e.written++
	} else {
		finishCensoredOrNoted(e, k, v, censored)
	}
	if e.recentCount == len(e.recent) && e.recentBeaten[e.recentNext] {
		e.beatenRecent--
	}
	if beaten {
		e.beatenRecent++
	}
	e.last = v
	e.recent[e.recentNext] = v
	e.recentBeaten[e.recentNext] = beaten
	e.recentNext = (e.recentNext + 1) % len(e.recent)
	if e.recentCount < len(e.recent) {
		e.recentCount++
	}
	if hedged {
		noteHedged(e, beaten)
	}
	refreshRanks(e)
	r.mu.Unlock()
}

// noteHedged records whether the hedge beat a finished attempt of e that
// ran against one; r.mu is held.
func noteHedged(e *routeEstimate, beaten bool) {
	if e.hedgedCount == routeHedged && e.hedged[e.hedgedNext] {
		e.hedgesWon--
	}
	if beaten {
		e.hedgesWon++
	}
	e.hedged[e.hedgedNext] = beaten
	e.hedgedNext = (e.hedgedNext + 1) % routeHedged
	if e.hedgedCount < routeHedged {
		e.hedgedCount++
	}
	e.hedgesBeatIt = e.hedgesWon >= routeHedged-1
}

// finishCensoredOrNoted is routeFinish's ring update for an attempt that
// did not answer (censored) or whose wait was noted when the hedge delay
// passed (sample k); r.mu is held. (Its own function: under Yaegi every
// slot of routeFinish's frame is allocated on every request.)
func finishCensoredOrNoted(e *routeEstimate, k uint64, v float64, censored bool) {
	switch {
	case k == 0 && (!censored || e.count > 0 && v >= e.median):
		e.ring[e.next] = v
		e.next = (e.next + 1) % len(e.ring)
		if e.count < len(e.ring) {
			e.count++
		}
		e.written++
	case k != 0 && e.written-k < uint64(len(e.ring)):
		slot := int((k - 1) % uint64(len(e.ring)))
		if v > e.ring[slot] {
			e.ring[slot] = v
		}
	}
}

// refreshMedian recomputes e's median and score; r.mu is held.
func refreshMedian(e *routeEstimate) {
	e.sorted = append(e.sorted[:0], e.ring[:e.count]...)
	sort.Float64s(e.sorted)
	e.median = e.sorted[e.count/2]
	e.score = e.median / e.preferFactor
	e.known = e.count >= routeMinSamples
}

// refreshRanks recomputes e's median and score (there may be no sample:
// a censored attempt below the median) and sets e.slow and e.fast from
// e's recent finished attempts; r.mu is held. With fewer than routeRecent
// of those, they are the fastest and the slowest: no quick decision yet.
func refreshRanks(e *routeEstimate) {
	if e.count > 0 {
		e.sorted = append(e.sorted[:0], e.ring[:e.count]...)
		sort.Float64s(e.sorted)
		e.median = e.sorted[e.count/2]
		e.score = e.median / e.preferFactor
		e.known = e.count >= routeMinSamples
	}
	k := e.recentCount
	e.sorted = append(e.sorted[:0], e.recent[:k]...)
	sort.Float64s(e.sorted)
	if k < routeRecent {
		e.slow = e.sorted[0]
		e.fast = e.sorted[k-1]
		return
	}
	e.slow = e.sorted[1]
	e.fast = e.sorted[routeRecent-3]
}

// takesOver reports whether upstream c should replace the primary p; r.mu
// is held. An upstream preferred over p (a larger prefer margin) takes
// over as soon as it is within its margin again: 6 of its last 8 finished
// attempts, scaled, at most p's median, scaled (its recent attempts, not
// its median: just after it was left for being slow its median still
// holds the calm samples from before). The margin is the band that keeps
// the two from flapping. Otherwise c takes over when p is clearly slower
// and its attempts lose to their hedges (see the rules below).
func takesOver(r *router, p, c int) bool {
	ep := r.est[p]
	ec := r.est[c]
	if !ep.known || !ec.known {
		return false
	}
	cs := ec.score
	ps := ep.score
	if ec.preferFactor > ep.preferFactor {
		return ec.recentCount == routeRecent && ec.fast/ec.preferFactor <= ps
	}
	if ep.recentCount < routeRecent {
		return false
	}
	// 7 of p's last 8 attempts were beaten by their hedges, each after
	// waiting its hedge delay (p's p95): one in a million for a calm
	// upstream. Whoever beat them is faster than those waits, so c takes
	// over when it is faster than them (scaled), whatever p's prefer
	// margin.
	if ep.beatenRecent >= routeRecent-1 && ep.slow/ep.preferFactor > cs {
		return true
	}
	// The other rules need at least half of p's last 8 attempts beaten,
	// or 3 of its last 4 that ran against a hedge (routeHedged: when
	// the budget hedged few of them): a stall of the gateway itself (a GC
	// pause, a busy CPU) makes every attempt in flight slow, the hedges
	// too, and then the primaries, which started first, still answer
	// first; a degraded primary loses to the hedges on the upstream that
	// is not degraded.
	if r.hedging && !hedgesBeat(ep) {
		return false
	}
	// 7 of p's last 8 attempts took 1.6x c's median...
	if ep.slow/ep.preferFactor > cs*routeFastHysteresis {
		return true
	}
	// ...or p's median and 6 of its last 8 attempts are 1.5x c's median:
	// a primary that took over on its recent attempts still has the slow
	// median of the time before, which alone does not count.
	return ps > cs*routeHysteresis && ep.fast/ep.preferFactor > cs*routeHysteresis
}

// routePlan ranks the upstreams for one request: order[0] is the primary in
// force (first replaced by the fastest upstream that takes over, see
// takesOver), the others follow by score, those without an estimate last
// in configured order. It reports whether this request explores (its
// attempt 0 then goes to order[1], and hedges to order[0]) and whether the
// primary changed.
func routePlan(r *router) ([]int, bool, bool) {
	p := routePlanOf(r)
	return p.order, p.explore, p.changed
}

// routeChoice is what routePlanOf decides for one request.
type routeChoice struct {
	order   []int
	explore bool
	changed bool
	// exploreCap: an exploring request hedges after this at the latest,
	// routeHysteresis times the primary's median (0: no median yet).
	exploreCap time.Duration
	// race: a cold start's request, sent to the first two upstreams at once.
	race bool
	// changes: the primary changes so far (freeHedge).
	changes int64
}

// routePlanOf is routePlan, with the exploring request's delay cap read
// under the same lock (one lock and one call per request).
func routePlanOf(r *router) routeChoice {
	var c routeChoice
	n := len(r.est)
	order := make([]int, 0, n)
	r.mu.Lock()
	r.requests++
	ep := r.est[r.primary]
	// The calm case without a call: a candidate of no higher preference
	// needs half of the primary's recent attempts beaten (see takesOver).
	if !r.hedging || ep.beatenRecent >= routeRecent/2 || ep.hedgesBeatIt || r.mostPreferred > ep.preferFactor {
		c.changed = changePrimary(r, ep)
	}
	order = append(order, r.primary)
	if n == 2 {
		order = append(order, 1-r.primary) // without a call, the usual route
	} else {
		order = appendRanked(r, order)
	}
	c.changes = r.changes
	if r.cold && !r.est[r.primary].known {
		c.race = coldRace(r)
	} else if n > 1 && r.requests >= r.nextExplore {
		explore(r, &c, order[1])
	}
	r.mu.Unlock()
	c.order = order
	return c
}

// coldRace reports whether a request of a cold route (its primary without
// an estimate) races, counting it; r.mu is held. Past routeColdRaceMax
// racing requests the cold start ends undecided: the rules of a warm route
// take over.
func coldRace(r *router) bool {
	if r.raced >= routeColdRaceMax {
		r.cold = false
		return false
	}
	r.raced++
	return true
}

// routeRaceWon counts a finished cold-start race that upstream won, and
// when it is the routeColdRaces-th, ends the cold start: an upstream that
// won routeColdWins of them becomes the primary.
func routeRaceWon(r *router, won int) {
	r.mu.Lock()
	if r.racesDone < routeColdRaces {
		r.racesDone++
		r.raceWins[won]++
		if r.racesDone == routeColdRaces {
			endColdStart(r)
		}
	}
	r.mu.Unlock()
}

// endColdStart ends the cold start on its races' tally; r.mu is held.
func endColdStart(r *router) {
	r.cold = false
	for i := 0; i < len(r.raceWins); i++ {
		if i != r.primary && r.raceWins[i] >= routeColdWins {
			r.primary = i
			r.changes++
			return
		}
	}
}

// hedgesBeat reports whether hedges beat e's attempts often enough for
// its slowness to be its own, not the gateway's: half of its last 8
// finished attempts, or all but one of its last routeHedged hedged ones.
func hedgesBeat(e *routeEstimate) bool {
	return e.beatenRecent >= routeRecent/2 || e.hedgesBeatIt
}

// changePrimary makes the fastest upstream that takes over from the
// primary ep (see takesOver) the primary, and reports whether one did;
// r.mu is held.
func changePrimary(r *router, ep *routeEstimate) bool {
	next := -1
	nextScore := 0.0
	for i := 0; i < len(r.est); i++ {
		if i == r.primary || r.hedging && !hedgesBeat(ep) && r.est[i].preferFactor <= ep.preferFactor {
			continue
		}
		if !takesOver(r, r.primary, i) {
			continue
		}
		if s := r.est[i].score; next < 0 || s < nextScore {
			next = i
			nextScore = s
		}
	}
	if next < 0 {
		return false
	}
	r.primary = next
	r.changes++
	return true
}

// explore marks c as an exploring request of runnerUp, with its delay cap,
// and schedules the next (routeExploreMax); r.mu is held.
func explore(r *router, c *routeChoice, runnerUp int) {
	c.explore = true
	e := r.est[r.primary]
	if e.known {
		c.exploreCap = time.Duration(e.median * routeHysteresis)
	}
	if e.known && r.est[runnerUp].last > e.median*routeExploreSlow {
		r.exploreEvery *= 2
		if r.exploreEvery > routeExploreMax {
			r.exploreEvery = routeExploreMax
		}
	} else {
		r.exploreEvery = routeExploreEvery
	}
	r.nextExplore = r.requests + r.exploreEvery
}

// appendRanked appends every upstream but order[0] to order: those with an
// estimate by ascending score, then the rest in configured order (a
// selection sort: routes have a handful of upstreams); r.mu is held.
func appendRanked(r *router, order []int) []int {
	n := len(r.est)
	first := order[0]
	if n == 2 {
		order = append(order, 1-first)
		return order
	}
	known := len(order)
	for i := 0; i < n; i++ {
		if r.est[i].known && i != first {
			order = append(order, i)
		}
	}
	for i := known; i < len(order); i++ {
		lowest := i
		lowestScore := r.est[order[i]].score
		for j := i + 1; j < len(order); j++ {
			if s := r.est[order[j]].score; s < lowestScore {
				lowest = j
				lowestScore = s
			}
		}
		swap := order[i]
		order[i] = order[lowest]
		order[lowest] = swap
	}
	for i := 0; i < n; i++ {
		if !r.est[i].known && i != first {
			order = append(order, i)
		}
	}
	return order
}

// planRoute ranks the upstreams for a race on a fastest route (rc.order;
// it is not called on an ordered route, whose nil order keeps the
// configured one: Hedger.fastest) and marks an
// exploring race. An exploring race sends attempt 0 to the second-ranked
// upstream and hedges to the first, at the first's delay or, sooner, once
// the probe is clearly slower than the primary (routeHysteresis times the
// primary's median, see exploreDelay): exploring a degraded upstream costs
// the client little more than the primary's median, and the probe's
// censored sample is still at or above its median when it is as fast.
func planRoute(rc *race) {
	plan := routePlanOf(rc.h.state.router)
	order := plan.order
	if plan.changed {
		// The new primary's delay estimate holds what it saw while it was
		// not the primary (a degradation, hedges it won): it starts over,
		// at the fixed delay until it has min_samples of its own again.
		resetEstimator(rc.h.state.estimators[order[0]])
	}
	rc.delayFrom = order[0]
	if plan.explore && !rc.passthrough {
		exploreRoute(rc, order, plan.exploreCap)
	}
	rc.racing = plan.race && !rc.passthrough && rc.limit > 1
	rc.changesAtPlan = plan.changes
	rc.order = order
}

// exploreRoute makes rc an exploring race: attempt 0 to the runner-up.
// The probe is the exploration's, not the request's: the race makes at
// least routeExploreAttempts attempts, so that a request whose probe found
// an upstream in an incident still has a hedge and its rescue (its first
// hedge may stall).
func exploreRoute(rc *race, order []int, exploreCap time.Duration) {
	rc.exploreCap = exploreCap
	if rc.limit == rc.h.cfg.MaxAttempts && rc.limit < routeExploreAttempts {
		rc.limit = routeExploreAttempts
	}
	swap := order[0]
	order[0] = order[1]
	order[1] = swap
	rc.exploring = true
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
	p.routeSample = routeSample(rc.h.state.router, p.upstream, rc.h.now().Sub(p.started), true)
}

// learnRoute feeds the race's attempt 0 (the primary, or an exploring
// request's probe) into the routing estimates at the commit (commit calls
// it), not when the race is over: the winner's stream may run for seconds,
// and a degraded primary is left after 7 beaten attempts, each noted only
// here. Attempt 0 gives its TTFT when it won, or when another attempt won
// first, its wait until that commit as a censored sample (it took at least
// that long). Attempt 0 waits at least the hedge delay before anything
// censors it, so with a delay at or above its median (the adaptive p95 is)
// every censored sample is classified rightly, above the median, and the
// samples stay a fair draw. Hedges are not counted: a hedge is cut short
// by whatever is left of the primary's wait, often a few milliseconds, so
// its wins favour its fast answers and its cancelled attempts say "at
// least 5 ms" of an upstream that takes 30; kept or dropped, either side
// biases its upstream's median (dropping the short ones ratchets it up).
// Failed attempts are health's business. An attempt noted by routeWaiting
// is not counted twice: its sample is raised to what it waited in the end.
//
// A losing attempt 0 is still running at the commit, or its first event is
// queued behind the winner's: only the race loop's own fields of it are
// read (started, result, routeSample), never what its goroutine writes.
func learnRoute(rc *race) {
	if rc.racing && len(rc.attempts) > 1 {
		learnRace(rc)
		return
	}
	learnAttempt(rc, rc.attempts[0])
}

// learnAttempt feeds attempt a into its upstream's estimate at the commit:
// its TTFT when it won, its wait until the commit (censored) when another
// attempt won while it had not failed.
func learnAttempt(rc *race, a *attempt) {
	hedged := len(rc.attempts) > 1 && !rc.racing
	switch {
	case a == rc.winner && !a.firstAt.IsZero():
		routeFinish(rc.h.state.router, a.upstream, a.routeSample, a.firstAt.Sub(a.started), false, false, hedged)
	case a != rc.winner && a.result == "":
		routeFinish(rc.h.state.router, a.upstream, a.routeSample, rc.commitAt.Sub(a.started), true, true, hedged)
	}
}

// learnRace is learnRoute for a cold start's race: its two attempts
// started together, so each is a fair draw of its upstream (the winner's
// TTFT, the loser's wait as a censored sample), and the race counts for
// the cold start's tally when neither had failed.
func learnRace(rc *race) {
	learnAttempt(rc, rc.attempts[0])
	learnAttempt(rc, rc.attempts[1])
	w := rc.winner
	loser := rc.attempts[0]
	if loser == w {
		loser = rc.attempts[1]
	}
	if loser.result == "" && loser.upstream != w.upstream {
		routeRaceWon(rc.h.state.router, w.upstream)
	}
}

// freeHedge reports whether the hedge of rc is not the budget's: the
// hedges of an exploring race up to routeExploreAttempts, or of a cold
// start's race (exploration has its own bound: one request in
// routeExploreEvery, routeColdRaceMax per cold start; its safety net is
// never denied), or of a race left on
// an upstream the route has moved away from since it started (at most
// one per request in flight at a primary change, which hysteresis makes
// rare): the budget rations hedges against stalls, not the routing's lag.
func freeHedge(rc *race) bool {
	if rc.exploring && len(rc.attempts) < routeExploreAttempts || rc.racing {
		return true
	}
	if rc.order == nil {
		return false
	}
	r := rc.h.state.router
	r.mu.Lock()
	moved := r.changes != rc.changesAtPlan && r.primary != rc.attempts[0].upstream
	r.mu.Unlock()
	return moved
}

// hedgeBack reports whether the next attempt of rc goes back to an
// upstream it tried already rather than to the next (claimNext says
// which): an exploring race's second hedge (back to the primary, not to
// the probe), or any hedge of a primary timed out while every other
// upstream's newest finished attempt took at least routeHysteresis times
// the primary's median (an upstream in an incident, as its last exploring
// request found), while the primary's own recent attempts were not
// (routeBackSlack: a primary itself turning slow is hedged elsewhere). A
// stall is one request's (a queue, a replica): a second request to the
// same provider draws again, from its calm distribution. An upstream
// never tried is not slow.
func hedgeBack(rc *race) bool {
	if rc.exploring {
		// Its second hedge goes to the primary again, not to the probe.
		return len(rc.attempts) == 2
	}
	if rc.racing {
		return false
	}
	r := rc.h.state.router
	p := rc.attempts[0].upstream
	r.mu.Lock()
	ep := r.est[p]
	back := ep.known && ep.fast <= ep.median*routeBackSlack
	for i := 0; back && i < len(r.est); i++ {
		if i != p && r.est[i].last <= ep.median*routeHysteresis {
			back = false
		}
	}
	r.mu.Unlock()
	return back
}

// rescueOrder is the ranking rc's next attempt is picked from: the one
// planned with it until every upstream has had an attempt, then the
// route's ranking now. An attempt after every upstream was tried rescues
// attempts that all stalled: it goes where the route sends requests by
// now, not where it sent them when this one started (a primary that
// degraded since has been left), and during a cold start to the upstream
// that won most of its races so far; on an ordered route, which ranks
// nothing, to the newest attempt's upstream while that attempt still runs
// (the primary's had the longer wait for nothing).
func rescueOrder(rc *race) []int {
	if untried(rc) {
		return rc.order
	}
	if rc.order == nil {
		if rc.attempts[len(rc.attempts)-1].result != "" {
			return nil // a retry after a failure: the configured order
		}
		newest := rc.attempts[len(rc.attempts)-1].upstream
		order := make([]int, 0, len(rc.used))
		order = append(order, newest)
		for i := 0; i < len(rc.used); i++ {
			if i != newest {
				order = append(order, i)
			}
		}
		return order
	}
	r := rc.h.state.router
	order := make([]int, 0, len(r.est))
	r.mu.Lock()
	first := r.primary
	if r.cold {
		for i := 0; i < len(r.raceWins); i++ {
			if r.raceWins[i] > r.raceWins[first] {
				first = i
			}
		}
	}
	order = append(order, first)
	order = appendRanked(r, order)
	r.mu.Unlock()
	return order
}

// routeDelayRef is the cap routeDelayCap puts on upstream up's adaptive
// delay: that factor times the lowest median of the other upstreams with
// an estimate, times up's prefer factor (a preferred upstream may be that
// much slower); 0 when no other has an estimate (adaptiveDelay then caps
// it at the configured starting delay).
func routeDelayRef(r *router, up int) time.Duration {
	best := 0.0
	r.mu.Lock()
	for i := 0; i < len(r.est); i++ {
		if i != up && r.est[i].known && (best == 0 || r.est[i].median < best) {
			best = r.est[i].median
		}
	}
	f := r.est[up].preferFactor
	r.mu.Unlock()
	return time.Duration(best * routeDelayCap * f)
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

// exploreDelay is the hedge delay of an exploring race whose attempt 0
// went to first: the route's primary's delay (rc.delayFrom's; first's
// when the runner-up was unavailable and attempt 0 went to the primary),
// capped at rc.exploreCap (see planRoute).
func exploreDelay(rc *race, first int) time.Duration {
	d := hedgeDelay(rc.h.state, rc.h.cfg, rc.delayFrom)
	if rc.exploreCap > 0 && rc.exploreCap < d && first != rc.delayFrom {
		d = rc.exploreCap
	}
	return d
}

// currentOrder is the ranking a request starting now would get (nil on an
// ordered route); it neither counts the request nor explores.
func currentOrder(h *Hedger) []int {
	if h.cfg.Primary != config.PrimaryFastest || len(h.cfg.Upstreams) < 2 {
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
	if rc.racing {
		s += " cold_race=1"
	}
	return s
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
