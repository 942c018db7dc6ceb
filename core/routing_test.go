package core

import (
	"math"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// routeSim feeds a router the way races on a fastest route do, on virtual
// time: one request every gap, attempt 0 to the ranked (or explored)
// upstream, its TTFT drawn from a seeded lognormal (median 30ms, sigma 0.3,
// 2 % stalls of 0.5–1s, upstream A slower by factor while degraded). A TTFT
// above the delay is noted as routeWaiting notes it, censored at the delay,
// and hedged to the next upstream; learnRoute then raises it to the
// commit (or to its own TTFT when it won after all), raiseLag requests
// later, as the answers of 20 concurrent clients arrive.
const raiseLag = 10

type routeSim struct {
	r       *router
	rng     *rand.Rand
	now     time.Duration
	gap     time.Duration
	delay   time.Duration
	factor  []float64 // per upstream, 1 when calm
	primary []int     // the primary in force after each request
	raises  []pendingRaise
	sent    int
	// stall is added to every TTFT drawn: the gateway itself stalled.
	stall time.Duration
}

type pendingRaise struct {
	due, up int
	k       uint64
	d       time.Duration
	beaten  bool
}

func newRouteSim(seed int64, upstreams int) *routeSim {
	s := &routeSim{r: newRouter(upstreams), rng: rand.New(rand.NewSource(seed)), gap: 3 * time.Millisecond, delay: 53 * time.Millisecond}
	for i := 0; i < upstreams; i++ {
		s.factor = append(s.factor, 1)
	}
	return s
}

func (s *routeSim) ttft(up int) time.Duration {
	coin := s.rng.Float64()
	z := s.rng.NormFloat64()
	u := s.rng.Float64()
	if coin < 0.02 {
		return time.Duration(float64(500*time.Millisecond)*(1+u)) + s.stall
	}
	d := float64(30*time.Millisecond) * math.Exp(0.3*z) * s.factor[up]
	return time.Duration(d) + s.stall
}

// run sends n requests and returns how many had attempt 0 on each upstream.
func (s *routeSim) run(n int) []int {
	sent := make([]int, len(s.factor))
	for i := 0; i < n; i++ {
		s.sent++
		for len(s.raises) > 0 && s.raises[0].due <= s.sent {
			p := s.raises[0]
			routeFinish(s.r, p.up, p.k, p.d, p.beaten, p.beaten, true)
			s.raises = s.raises[1:]
		}
		order, explore, _ := routePlan(s.r)
		first := order[0]
		if explore {
			first = order[1]
		}
		sent[first]++
		ttft := s.ttft(first)
		if ttft <= s.delay {
			routeFinish(s.r, first, 0, ttft, false, false, false)
		} else {
			k := routeSample(s.r, first, s.delay, true)
			hedge := order[0]
			if hedge == first {
				hedge = order[1]
			}
			wait := s.delay + s.ttft(hedge)
			beaten := wait < ttft
			if !beaten {
				wait = ttft
			}
			s.raises = append(s.raises, pendingRaise{due: s.sent + raiseLag, up: first, k: k, d: wait, beaten: beaten})
		}
		s.primary = append(s.primary, s.r.primary)
		s.now += s.gap
	}
	return sent
}

// requestsUntil counts the requests from index from until the primary in
// force is up (-1 when it never is).
func (s *routeSim) requestsUntil(from, up int) int {
	for i := from; i < len(s.primary); i++ {
		if s.primary[i] == up {
			return i - from + 1
		}
	}
	return -1
}

// A degradation of the primary moves the primary within a handful of
// requests: once 7 of its attempts have lost to their hedges, that is
// raiseLag requests (the time until their races end) plus 7.
func TestRouteLeavesDegradedPrimaryQuickly(t *testing.T) {
	s := newRouteSim(1, 2)
	s.run(2000)
	if s.r.primary != 0 {
		t.Fatalf("calm primary = %d, want 0 (the first upstream)", s.r.primary)
	}
	s.factor[0] = 8
	start := len(s.primary)
	s.run(200)
	n := s.requestsUntil(start, 1)
	if n < 0 || n > raiseLag+routeRecent {
		t.Fatalf("after A degraded 8x, B became primary after %d requests, want 1..%d", n, raiseLag+routeRecent)
	}
	t.Logf("reaction: %d requests (%v of virtual time)", n, time.Duration(n)*s.gap)
}

// An upstream that recovered is noticed through exploration: with a prefer
// margin it takes the primary back once its samples are calm again.
func TestRouteRecoveryThroughExploration(t *testing.T) {
	s := newRouteSim(2, 2)
	s.r.est[0].preferFactor = 1.25 // A is the cheaper one
	refreshMostPreferred(s.r)
	s.run(1000)
	s.factor[0] = 8
	s.run(1000)
	if s.r.primary != 1 {
		t.Fatalf("primary while A is degraded = %d, want 1", s.r.primary)
	}
	s.factor[0] = 1
	start := len(s.primary)
	s.run(3000)
	n := s.requestsUntil(start, 0)
	if n < 0 || n > 1200 {
		t.Fatalf("after A recovered it became primary again after %d requests, want 1..1200", n)
	}
	t.Logf("recovery: %d requests (%v of virtual time)", n, time.Duration(n)*s.gap)
}

// Without exploration a recovered upstream would never be sampled again:
// while B is primary, A still gets one request in routeExploreEvery, and
// while A is found slow, one in routeExploreMax.
func TestRouteExploresTheRunnerUp(t *testing.T) {
	s := newRouteSim(3, 2)
	s.run(500)
	sent := s.run(3200)
	// A slow probe of the calm B (a stall) doubles the next interval once.
	if want := 3200 / int(routeExploreEvery); sent[1] < want*9/10 || sent[1] > want {
		t.Fatalf("B got %d of 3200 requests while A, as fast, was primary, want %d..%d (one in %d)", sent[1], want*9/10, want, routeExploreEvery)
	}
	s.factor[0] = 8
	s.run(1000)
	sent = s.run(3200)
	if want := 3200 / int(routeExploreMax); sent[0] != want {
		t.Fatalf("A got %d of 3200 requests while degraded, want %d (one in %d)", sent[0], want, routeExploreMax)
	}
}

// Two upstreams of equal speed keep their primary: over 20,000 requests
// (three seeds) it changes at most once.
func TestRouteEqualUpstreamsDoNotFlap(t *testing.T) {
	for seed := int64(10); seed < 13; seed++ {
		s := newRouteSim(seed, 2)
		s.run(20000)
		if s.r.changes > 1 {
			t.Fatalf("seed %d: the primary changed %d times between equal upstreams, want at most 1", seed, s.r.changes)
		}
	}
}

// A censored sample (the attempt had no output for at least d) counts
// when it is at or above the median, and is skipped below it: there it
// says nothing about the side of the median the TTFT falls on.
func TestRouteCensoredSamples(t *testing.T) {
	r := newRouter(1)
	for i := 0; i < 16; i++ {
		routeSample(r, 0, 30*time.Millisecond, false)
	}
	routeSample(r, 0, 10*time.Millisecond, true)
	if got := r.est[0].count; got != 16 {
		t.Fatalf("a censored sample below the median was counted: count = %d, want 16", got)
	}
	for i := 0; i < 17; i++ {
		routeSample(r, 0, 50*time.Millisecond, true)
	}
	if got := time.Duration(r.est[0].median); got != 50*time.Millisecond {
		t.Fatalf("median after 17 censored samples at 50ms = %v, want 50ms", got)
	}
}

// A prefer margin keeps the cheaper upstream primary while it is slower by
// less than the margin, and gives way when it is clearly slower.
func TestRoutePreferMargin(t *testing.T) {
	s := newRouteSim(4, 2)
	s.r.est[0].preferFactor = 1.25
	refreshMostPreferred(s.r)
	s.factor[0] = 1.2 // A 20 % slower than B
	s.run(5000)
	if s.r.primary != 0 || s.r.changes != 0 {
		t.Fatalf("A 20%% slower with a 25%% margin: primary = %d after %d changes, want 0 after 0", s.r.primary, s.r.changes)
	}
	s = newRouteSim(4, 2)
	s.factor[0] = 1.1
	s.run(5000)
	if s.r.primary != 0 {
		t.Fatalf("A 10%% slower without a margin: primary = %d, want 0 (inside the hysteresis)", s.r.primary)
	}
	s = newRouteSim(4, 2)
	s.factor[0] = 1.7
	s.run(5000)
	if s.r.primary != 1 {
		t.Fatalf("A 70%% slower without a margin: primary = %d, want 1", s.r.primary)
	}
	s = newRouteSim(5, 2)
	s.r.est[0].preferFactor = 1.25
	refreshMostPreferred(s.r)
	s.factor[0] = 3
	s.run(3000)
	if s.r.primary != 1 {
		t.Fatalf("A 3x slower with a 25%% margin: primary = %d, want 1", s.r.primary)
	}
}

// The ranking puts the primary first and the others by score, those
// without enough samples last in configured order.
func TestRouteRanking(t *testing.T) {
	r := newRouter(4)
	for i := 0; i < routeMinSamples; i++ {
		routeSample(r, 2, 20*time.Millisecond, false)
		routeSample(r, 1, 40*time.Millisecond, false)
	}
	order, _, _ := routePlan(r)
	if got := order; len(got) != 4 || got[0] != 0 || got[1] != 2 || got[2] != 1 || got[3] != 3 {
		t.Fatalf("order = %v, want [0 2 1 3] (the unmeasured primary keeps its place)", got)
	}
	for i := 0; i < routeMinSamples; i++ {
		beatenAttempt(r, 0, 100*time.Millisecond)
	}
	order, _, _ = routePlan(r)
	if got := order; got[0] != 2 || got[1] != 1 || got[2] != 0 || got[3] != 3 {
		t.Fatalf("order = %v, want [2 1 0 3]", got)
	}
}

// fastestConfig is testConfig on primary fastest.
func fastestConfig() config.Config {
	cfg := testConfig()
	cfg.Primary = config.PrimaryFastest
	return cfg
}

// winAt answers c's attempt with a token after the harness clock moved on.
func answerToken(c *call, text string) {
	c.respond(200, "text/event-stream")
	c.write(tokenChunk(text) + "data: [DONE]\n\n")
	c.end()
}

// Through a race: the hedge timer notes the primary's wait as a censored
// sample at once, and the lost primary is not counted a second time.
func TestRouteRaceNotesWaitAtHedgeTime(t *testing.T) {
	hs := newHarness(t, fastestConfig())
	r := hs.h.state.router
	for i := 0; i < routeMinSamples; i++ {
		routeSample(r, 0, 30*time.Millisecond, false)
	}
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(100 * time.Millisecond)
	b := hs.tr.next(t)
	last := r.est[0].ring[routeMinSamples]
	if got := r.est[0].count; got != routeMinSamples+1 || time.Duration(last) != 100*time.Millisecond {
		t.Fatalf("after the hedge timer A has %d samples (the last %v), want %d, the last 100ms", got, time.Duration(last), routeMinSamples+1)
	}
	hs.clock.Advance(20 * time.Millisecond)
	answerToken(b, "B")
	<-out
	<-hs.reports
	last = r.est[0].ring[routeMinSamples]
	if got := r.est[0].count; got != routeMinSamples+1 || time.Duration(last) != 120*time.Millisecond {
		t.Fatalf("after losing A has %d samples (the last %v), want %d, the last raised to 120ms (its wait until the commit)", got, time.Duration(last), routeMinSamples+1)
	}
	if got := r.est[1].count; got != 0 {
		t.Fatalf("B has %d samples after winning as a hedge, want 0 (hedge wins are not a fair sample)", got)
	}
}

// Through a race on a route whose second upstream is the fastest: attempt 0
// goes to it, the hedge to the first, and the report header names the
// primary.
func TestRouteRaceFollowsRanking(t *testing.T) {
	cfg := fastestConfig()
	cfg.ReportHeader = "X-Hedge"
	hs := newHarness(t, cfg)
	r := hs.h.state.router
	// A's attempts lost to their hedges, but not by far: its newest is
	// not slow enough for the hedge to go back to B (hedgeBack).
	for i := 0; i < routeWindow; i++ {
		beatenAttempt(r, 0, 40*time.Millisecond)
		routeSample(r, 1, 30*time.Millisecond, false)
	}
	out := hs.serve(chatRequest(""))
	first := hs.tr.next(t)
	if first.req.URL.Host != "b.test" {
		t.Fatalf("attempt 0 went to %s, want b.test (the fastest)", first.req.URL.Host)
	}
	first.respond(200, "text/event-stream")
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(100 * time.Millisecond)
	hedge := hs.tr.next(t)
	if hedge.req.URL.Host != "a.test" {
		t.Fatalf("the hedge went to %s, want a.test (next in the ranking)", hedge.req.URL.Host)
	}
	answerToken(hedge, "A")
	res := <-out
	<-hs.reports
	if got := res.rec.Header().Get("X-Hedge"); !strings.Contains(got, "primary=B primary_changes=1") {
		t.Fatalf("report header %q, want primary=B primary_changes=1", got)
	}
}

// Every routeExploreEvery-th request sends attempt 0 to the runner-up and
// hedges to the primary, at the primary's adaptive delay (not the slow
// runner-up's), or sooner: at 1.5x the primary's routing median.
func TestRouteRaceExplores(t *testing.T) {
	cfg := fastestConfig()
	cfg.Delay = config.DelayConfig{Mode: config.DelayAdaptive, Fixed: config.Duration(time.Second), MinSamples: 1}
	hs := newHarness(t, cfg)
	st := hs.h.state
	for i := 0; i < routeWindow; i++ {
		routeSample(st.router, 0, 30*time.Millisecond, false)
		routeSample(st.router, 1, 300*time.Millisecond, false)
	}
	addSample(st.estimators[0], 60*time.Millisecond)
	addSample(st.estimators[1], 600*time.Millisecond)
	st.router.requests = routeExploreEvery - 1
	out := hs.serve(chatRequest(""))
	first := hs.tr.next(t)
	if first.req.URL.Host != "b.test" {
		t.Fatalf("the exploring attempt 0 went to %s, want b.test (the runner-up)", first.req.URL.Host)
	}
	first.respond(200, "text/event-stream")
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(45 * time.Millisecond)
	hedge := hs.tr.next(t)
	if hedge.req.URL.Host != "a.test" {
		t.Fatalf("the exploring race's hedge went to %s, want a.test", hedge.req.URL.Host)
	}
	answerToken(hedge, "A")
	<-out
	rep := <-hs.reports
	if rep.Delay != 45*time.Millisecond {
		t.Fatalf("exploring race's delay = %v, want 45ms (1.5x the primary's routing median of 30ms, below its 60ms delay)", rep.Delay)
	}
}

// An ordered route keeps the configured order whatever the estimates say.
func TestRouteOrderedIgnoresEstimates(t *testing.T) {
	hs := newHarness(t, testConfig())
	r := hs.h.state.router
	for i := 0; i < routeWindow; i++ {
		routeSample(r, 0, 300*time.Millisecond, false)
		routeSample(r, 1, 30*time.Millisecond, false)
	}
	out := hs.serve(chatRequest(""))
	first := hs.tr.next(t)
	if first.req.URL.Host != "a.test" {
		t.Fatalf("attempt 0 went to %s on an ordered route, want a.test", first.req.URL.Host)
	}
	answerToken(first, "A")
	<-out
	<-hs.reports
	if got := r.est[0].count; got != routeWindow {
		t.Fatalf("an ordered route fed the routing estimates: A has %d samples, want %d", got, routeWindow)
	}
}

func TestRouteConfig(t *testing.T) {
	cfg := testConfig()
	if got := cfg.WithDefaults().Primary; got != config.PrimaryOrdered {
		t.Fatalf("default primary = %q, want ordered", got)
	}
	cfg.Primary = "fastest-ish"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `primary "fastest-ish"`) {
		t.Fatalf("Validate = %v, want a complaint about primary", err)
	}
	cfg.Primary = config.PrimaryOrdered
	cfg.Upstreams[0].PreferMargin = 0.25
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "prefer_margin needs primary fastest") {
		t.Fatalf("Validate = %v, want prefer_margin to need primary fastest", err)
	}
	cfg.Primary = config.PrimaryFastest
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.Upstreams[0].PreferMargin = -1
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "prefer_margin") {
		t.Fatalf("Validate = %v, want a complaint about prefer_margin -1", err)
	}
	for in, want := range map[string]config.Fraction{`0.25`: 0.25, `"25%"`: 0.25, `" 5 %"`: 0.05, `"0.5"`: 0.5} {
		var f config.Fraction
		if err := f.UnmarshalJSON([]byte(in)); err != nil || math.Abs(float64(f-want)) > 1e-12 {
			t.Fatalf("Fraction(%s) = %v, %v; want %v", in, float64(f), err, float64(want))
		}
	}
	var f config.Fraction
	if err := f.UnmarshalJSON([]byte(`"lots"`)); err == nil {
		t.Fatalf("Fraction(\"lots\") = %v, want an error", float64(f))
	}
}

// A reload that keeps the State keeps the routing (primary, estimates) and
// takes the new prefer margins.
func TestRouteStateSurvivesReload(t *testing.T) {
	cfg := fastestConfig()
	h1, err := New(cfg, Options{Clock: newFakeClock()})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < routeWindow; i++ {
		beatenAttempt(h1.state.router, 0, 300*time.Millisecond)
		routeSample(h1.state.router, 1, 30*time.Millisecond, false)
	}
	routePlan(h1.state.router)
	cfg.Upstreams[0].PreferMargin = 0.5
	h2, err := New(cfg, Options{Clock: newFakeClock(), State: h1.State()})
	if err != nil {
		t.Fatal(err)
	}
	st := h2.RouteStatus()
	if st.Primary != 1 || st.Changes != 1 || st.Medians[1] != 30*time.Millisecond {
		t.Fatalf("after reload primary %d, changes %d, B median %v; want 1, 1, 30ms", st.Primary, st.Changes, st.Medians[1])
	}
	if got := h2.state.router.est[0].preferFactor; got != 1.5 {
		t.Fatalf("A's prefer factor after reload = %v, want 1.5", got)
	}
}

// A preferred primary that degrades is left as quickly: 7 of its last 8
// attempts beaten by their hedges say so whatever its margin (the 1.6x
// rule would need them 1.6 x 2 times slower than B, more than a hedged
// attempt's wait shows).
func TestRouteLeavesDegradedPreferredPrimaryQuickly(t *testing.T) {
	s := newRouteSim(6, 2)
	s.r.est[0].preferFactor = 2
	refreshMostPreferred(s.r)
	s.run(2000)
	s.factor[0] = 8
	start := len(s.primary)
	s.run(200)
	if n := s.requestsUntil(start, 1); n < 0 || n > raiseLag+routeRecent {
		t.Fatalf("after A (prefer margin 100%%) degraded 8x, B became primary after %d requests, want 1..%d", n, raiseLag+routeRecent)
	}
}

// When the primary changes, the new primary's delay estimate starts over:
// what it saw while it was not the primary (a degradation, its hedge wins)
// is not its delay.
func TestRouteChangeResetsDelayEstimate(t *testing.T) {
	cfg := fastestConfig()
	cfg.Delay = config.DelayConfig{Mode: config.DelayAdaptive, Fixed: config.Duration(100 * time.Millisecond), MinSamples: 1}
	hs := newHarness(t, cfg)
	st := hs.h.state
	for i := 0; i < routeWindow; i++ {
		beatenAttempt(st.router, 0, 300*time.Millisecond)
		routeSample(st.router, 1, 30*time.Millisecond, false)
		addSample(st.estimators[1], 900*time.Millisecond)
	}
	out := hs.serve(chatRequest(""))
	first := hs.tr.next(t)
	answerToken(first, "B")
	<-out
	rep := <-hs.reports
	if rep.Delay != 100*time.Millisecond {
		t.Fatalf("delay of the first request on the new primary = %v, want 100ms (the fixed delay: its old samples were forgotten)", rep.Delay)
	}
}

// A stall of the gateway itself makes every attempt in flight slow, the
// hedges too, so the primaries, which started first, still answer first:
// no upstream is slower than another, and the primary stays.
func TestRouteIgnoresAGatewayStall(t *testing.T) {
	s := newRouteSim(7, 2)
	s.run(2000)
	s.stall = 100 * time.Millisecond
	s.run(40)
	s.stall = 0
	s.run(500)
	if s.r.changes != 0 {
		t.Fatalf("a 100ms stall of the gateway changed the primary %d times, want 0", s.r.changes)
	}
}

// beatenAttempt records a finished attempt of upstream up that waited d
// and lost to its hedge.
func beatenAttempt(r *router, up int, d time.Duration) {
	routeFinish(r, up, 0, d, false, true, true)
}

// Without hedges (max_attempts 1) no attempt is ever beaten: a primary
// clearly slower than another on its median and recent attempts is left
// all the same.
func TestRouteWithoutHedgesUsesTheMedians(t *testing.T) {
	r := newRouter(2)
	for i := 0; i < routeWindow; i++ {
		routeFinish(r, 1, 0, 30*time.Millisecond, false, false, false)
		routeFinish(r, 0, 0, 100*time.Millisecond, false, false, false)
	}
	routePlan(r)
	if r.primary != 0 {
		t.Fatalf("with hedging and no beaten attempt the primary = %d, want 0 (it may be the gateway that is slow)", r.primary)
	}
	r.hedging = false
	routePlan(r)
	if r.primary != 1 {
		t.Fatalf("without hedging the primary = %d, want 1 (its median is 3x)", r.primary)
	}
}

// A primary beaten by its hedge counts at the commit, not when the
// winner's stream ends: a degraded primary is left after 7 beaten
// attempts, and LLM answers stream for seconds.
func TestRouteLearnsAtTheCommit(t *testing.T) {
	hs := newHarness(t, fastestConfig())
	r := hs.h.state.router
	r.cold = false // the first request hedges after its delay, not at once
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(100 * time.Millisecond)
	b := hs.tr.next(t)
	hs.clock.Advance(20 * time.Millisecond)
	b.respond(200, "text/event-stream")
	b.write(tokenChunk("B"))
	// The winner's stream goes on: this write returns once the answer is
	// being streamed to the client, after the commit.
	b.write(tokenChunk(" more"))
	r.mu.Lock()
	beaten, finished, last := r.est[0].beatenRecent, r.est[0].recentCount, r.est[0].recent[0]
	r.mu.Unlock()
	if finished != 1 || beaten != 1 || time.Duration(last) != 120*time.Millisecond {
		t.Fatalf("while the winner streams, A has %d finished attempts (%d beaten, the first %v), want 1 beaten at 120ms (its wait until the commit)",
			finished, beaten, time.Duration(last))
	}
	b.write("data: [DONE]\n\n")
	b.end()
	<-out
	<-hs.reports
	r.mu.Lock()
	finished = r.est[0].recentCount
	r.mu.Unlock()
	if finished != 1 {
		t.Fatalf("after the race A has %d finished attempts, want 1 (counted once)", finished)
	}
}
