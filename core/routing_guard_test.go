package core

import (
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// The rules of primary fastest that hold wherever a run starts: the cold
// start's race, the hedge that goes back to a healthy primary, the hedges
// the budget does not pay for, the hedge asked again after a denial, and
// the adaptive delay's cap.

// calmSamples gives upstream up n finished attempts of d each.
func calmSamples(r *router, up, n int, d time.Duration) {
	for i := 0; i < n; i++ {
		routeFinish(r, up, 0, d, false, false, false)
	}
}

// warmFastest is a fastest route past its cold start whose budget holds one
// hedge, A its primary with a calm estimate (30ms).
func warmFastest(t *testing.T) (*harness, *router) {
	cfg := fastestConfig()
	cfg.Budget = config.BudgetConfig{Ratio: 0.1, Burst: 1}
	hs := newHarness(t, cfg)
	r := hs.h.state.router
	r.cold = false
	calmSamples(r, 0, routeWindow, 30*time.Millisecond)
	return hs, r
}

// afterStall lets the race's newest attempt stall until its hedge timer
// fires d later, and returns the attempt that starts then, its headers sent.
func afterStall(t *testing.T, hs *harness, d time.Duration) *call {
	hs.clock.waitDue(t, d)
	hs.clock.Advance(d)
	c := hs.tr.next(t)
	c.respond(200, "text/event-stream")
	return c
}

// emptyBudget leaves the hedge budget without a whole token.
func emptyBudget(st *State) {
	st.bucket.mu.Lock()
	st.bucket.tokens = 0
	st.bucket.mu.Unlock()
}

// A new route races its first requests on its first two upstreams at once,
// without the budget, and counts who won.
func TestColdStartRacesTheFirstTwoUpstreams(t *testing.T) {
	cfg := fastestConfig()
	cfg.ReportHeader = "X-Hedge"
	cfg.Budget = config.BudgetConfig{Ratio: 0.1, Burst: 1}
	hs := newHarness(t, cfg)
	st := hs.h.state
	out := hs.serve(chatRequest(""))
	// Both attempts arrive with the clock standing still.
	c1 := hs.tr.next(t)
	c2 := hs.tr.next(t)
	a, b := c1, c2
	if c1.req.URL.Host == "b.test" {
		a, b = c2, c1
	}
	if a.req.URL.Host != "a.test" || b.req.URL.Host != "b.test" {
		t.Fatalf("the cold start's attempts went to %s and %s, want a.test and b.test", c1.req.URL.Host, c2.req.URL.Host)
	}
	a.respond(200, "text/event-stream")
	answerToken(b, "B")
	res := <-out
	rep := <-hs.reports
	if got := res.rec.Header().Get("X-Hedge"); !strings.Contains(got, "cold_race=1") {
		t.Fatalf("report header %q, want cold_race=1", got)
	}
	if tokens := budgetTokens(st.bucket); tokens != 1 {
		t.Fatalf("budget after the race = %v tokens, want 1 (the race is not the budget's)", tokens)
	}
	if len(rep.Denials) != 0 || rep.HedgesStarted != 1 {
		t.Fatalf("race report: %d extra attempts, denials %v; want 1 and none", rep.HedgesStarted, rep.Denials)
	}
	r := st.router
	r.mu.Lock()
	done, wonB, beatenA := r.racesDone, r.raceWins[1], r.est[0].beatenRecent
	r.mu.Unlock()
	if done != 1 || wonB != 1 || beatenA != 1 {
		t.Fatalf("after one race: %d races counted, B won %d, A beaten %d times; want 1, 1, 1", done, wonB, beatenA)
	}
}

// The cold start ends on its 16th race: an upstream that won 14 of them is
// the primary; one that won 13, or two of equal speed, keep the configured
// one.
func TestColdStartEndsOnItsTally(t *testing.T) {
	r := newRouter(2)
	for i := 0; i < routeColdRaces-2; i++ {
		routeRaceWon(r, 1)
	}
	routeRaceWon(r, 0)
	if r.primary != 0 || !r.cold {
		t.Fatalf("after %d races the primary = %d (cold %v), want 0 and still cold", routeColdRaces-1, r.primary, r.cold)
	}
	routeRaceWon(r, 0)
	if r.primary != 1 || r.cold || r.changes != 1 {
		t.Fatalf("B won 14 of 16 races: primary %d, cold %v, %d changes; want 1, false, 1", r.primary, r.cold, r.changes)
	}
	close := newRouter(2)
	for i := 0; i < routeColdRaces; i++ {
		routeRaceWon(close, map[bool]int{true: 1, false: 0}[i < routeColdWins-1])
	}
	if close.primary != 0 || close.changes != 0 {
		t.Fatalf("B won 13 of 16 races: primary %d, %d changes; want 0, 0", close.primary, close.changes)
	}
	even := newRouter(2)
	for i := 0; i < routeColdRaces; i++ {
		routeRaceWon(even, i%2)
	}
	if even.primary != 0 || even.cold || even.changes != 0 {
		t.Fatalf("8 of 16 races each: primary %d, cold %v, %d changes; want 0, false, 0", even.primary, even.cold, even.changes)
	}
}

// A cold start costs at most routeColdRaceMax racing requests, and none
// once the primary has an estimate.
func TestColdStartIsBounded(t *testing.T) {
	r := newRouter(2)
	races, explores := 0, 0
	for i := 0; i < 4*int(routeColdRaceMax); i++ {
		c := routePlanOf(r)
		if c.race {
			races++
		}
		if c.explore {
			explores++
		}
	}
	if races != int(routeColdRaceMax) || explores == 0 {
		t.Fatalf("no race ever finished: %d racing requests and %d exploring ones, want %d and some", races, explores, routeColdRaceMax)
	}
	known := newRouter(2)
	calmSamples(known, 0, routeMinSamples, 30*time.Millisecond)
	if routePlanOf(known).race {
		t.Fatal("a request raced though the primary has an estimate")
	}
}

// A hedge goes back to a healthy primary while the runner-up's newest
// attempt found it slow (an incident): a stall is one request's.
func TestHedgeGoesBackWhenTheRunnerUpIsSlow(t *testing.T) {
	hs, r := warmFastest(t)
	calmSamples(r, 1, 1, 300*time.Millisecond)
	out := hs.serve(chatRequest(""))
	first := hs.tr.next(t)
	first.respond(200, "text/event-stream")
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(100 * time.Millisecond)
	hedge := hs.tr.next(t)
	if first.req.URL.Host != "a.test" || hedge.req.URL.Host != "a.test" {
		t.Fatalf("attempts went to %s then %s, want a.test twice (B's newest attempt took 10x A's median)", first.req.URL.Host, hedge.req.URL.Host)
	}
	answerToken(hedge, "A")
	<-out
	<-hs.reports
}

// An exploring race's hedge is never denied for the budget, and a probe
// that found an incident leaves the request a second hedge, to the
// primary again.
func TestExploringRaceHedgesFreeAndTwice(t *testing.T) {
	hs, r := warmFastest(t)
	calmSamples(r, 1, routeWindow, 60*time.Millisecond)
	r.requests = routeExploreEvery - 1
	emptyBudget(hs.h.state)
	out := hs.serve(chatRequest(""))
	probe := hs.tr.next(t)
	probe.respond(200, "text/event-stream")
	hedge := afterStall(t, hs, 45*time.Millisecond)
	second := afterStall(t, hs, 45*time.Millisecond)
	hosts := probe.req.URL.Host + " " + hedge.req.URL.Host + " " + second.req.URL.Host
	if hosts != "b.test a.test a.test" {
		t.Fatalf("the exploring race's attempts went to %s, want b.test a.test a.test", hosts)
	}
	answerToken(second, "A")
	<-out
	rep := <-hs.reports
	if len(rep.Denials) != 0 || rep.HedgesStarted != 2 {
		t.Fatalf("exploring race with an empty budget: %d hedges, denials %v; want 2 and none", rep.HedgesStarted, rep.Denials)
	}
}

// A hedge the budget denied asks again one delay later, and goes once a
// token is there; the report names the denial once.
func TestDeniedHedgeAsksAgain(t *testing.T) {
	cfg := testConfig()
	cfg.Budget = config.BudgetConfig{Ratio: 0.1, Burst: 1}
	cfg.ReportHeader = "X-Hedge"
	hs := newHarness(t, cfg)
	st := hs.h.state
	emptyBudget(st)
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	for i := 0; i < 2; i++ {
		hs.clock.waitArmed(t, 1)
		hs.clock.Advance(100 * time.Millisecond)
	}
	hs.clock.waitArmed(t, 1)
	if n := hs.tr.count(); n != 1 {
		t.Fatalf("%d attempts with an empty budget, want 1", n)
	}
	st.bucket.mu.Lock()
	st.bucket.tokens = 1
	st.bucket.mu.Unlock()
	hs.clock.Advance(100 * time.Millisecond)
	b := hs.tr.next(t)
	answerToken(b, "B")
	res := <-out
	rep := <-hs.reports
	if b.req.URL.Host != "b.test" || rep.HedgesStarted != 1 || len(rep.Denials) != 1 || rep.Denials[0] != DenyBudget {
		t.Fatalf("hedge to %s, %d hedges, denials %v; want b.test, 1, [budget]", b.req.URL.Host, rep.HedgesStarted, rep.Denials)
	}
	if got := res.rec.Header().Get("X-Hedge"); !strings.Contains(got, " delay_ms=100 denied=budget\"") {
		t.Fatalf("report header %q, want it to say denied=budget", got)
	}
}

// A request left on an upstream the route has since moved away from is
// hedged without the budget.
func TestHedgeAfterThePrimaryMovedIsFree(t *testing.T) {
	hs, r := warmFastest(t)
	calmSamples(r, 1, routeWindow, 30*time.Millisecond)
	emptyBudget(hs.h.state)
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	hs.clock.waitArmed(t, 1)
	r.mu.Lock()
	r.primary = 1
	r.changes++
	r.mu.Unlock()
	hs.clock.Advance(100 * time.Millisecond)
	b := hs.tr.next(t)
	answerToken(b, "B")
	<-out
	rep := <-hs.reports
	if a.req.URL.Host != "a.test" || b.req.URL.Host != "b.test" || len(rep.Denials) != 0 {
		t.Fatalf("attempts to %s then %s, denials %v; want a.test, b.test and none", a.req.URL.Host, b.req.URL.Host, rep.Denials)
	}
}

// On a fastest route the adaptive delay is at most twice the other
// upstreams' best median: it does not climb with a degraded primary.
func TestAdaptiveDelayIsCappedByTheOthers(t *testing.T) {
	cfg := fastestConfig()
	cfg.Delay = config.DelayConfig{Mode: config.DelayAdaptive, Fixed: config.Duration(100 * time.Millisecond), MinSamples: 1}
	hs := newHarness(t, cfg)
	st := hs.h.state
	for i := 0; i < 20; i++ {
		addSample(st.estimators[0], 500*time.Millisecond)
	}
	if d := hedgeDelay(st, hs.h.cfg, 0); d != 100*time.Millisecond {
		t.Fatalf("delay with no other estimate = %v, want the starting delay, 100ms", d)
	}
	calmSamples(st.router, 1, routeMinSamples, 30*time.Millisecond)
	if d := hedgeDelay(st, hs.h.cfg, 0); d != 60*time.Millisecond {
		t.Fatalf("delay = %v, want 60ms (twice B's median)", d)
	}
	ordered := *hs.h.cfg
	ordered.Primary = config.PrimaryOrdered
	if d := hedgeDelay(st, &ordered, 0); d != 500*time.Millisecond {
		t.Fatalf("ordered route's delay = %v, want A's own 500ms", d)
	}
}

// A primary whose recent attempts are slow moves once hedges beat 3 of
// its last routeHedged attempts that had one, though the budget hedged
// few of them; two hedges that lost keep it (the gateway may be slow).
func TestSlowPrimaryMovesOnItsFewHedgedAttempts(t *testing.T) {
	for _, lost := range []bool{false, true} {
		r := newRouter(2)
		r.hedging = true
		calmSamples(r, 0, routeWindow, 30*time.Millisecond)
		calmSamples(r, 1, routeWindow, 30*time.Millisecond)
		for i := 0; i < routeHedged; i++ {
			beaten := !(lost && i%2 == 1)
			routeFinish(r, 0, 0, 90*time.Millisecond, beaten, beaten, true)
		}
		// Then the unhedged ones: fewer than half the last 8 are beaten.
		for i := 0; i < routeRecent-routeHedged+1; i++ {
			routeFinish(r, 0, 0, 240*time.Millisecond, false, false, false)
		}
		routePlan(r)
		if want := map[bool]int{false: 1, true: 0}[lost]; r.primary != want {
			t.Errorf("slow primary, %d of its last %d hedged attempts beaten: primary = %d, want %d",
				r.est[0].hedgesWon, routeHedged, r.primary, want)
		}
	}
}

// With the default max_attempts (3) a request whose primary and hedge both
// stall gets a third attempt: back to a healthy primary while the
// runner-up is in an incident (its newest attempt took 10x A's median),
// every hedge does; else where the route sends requests now, not back to
// a primary the route has left since the request was planned.
func TestThirdAttemptRescuesTwoStalls(t *testing.T) {
	cases := []struct {
		name      string
		bSamples  int
		bTTFT     time.Duration
		moveToB   bool
		wantHosts string
	}{
		{"runner-up in an incident", 1, 300 * time.Millisecond, false, "a.test a.test a.test"},
		{"the route moved to B meanwhile", routeWindow, 30 * time.Millisecond, true, "a.test b.test b.test"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fastestConfig()
			cfg.MaxAttempts = 0 // the default
			hs := newHarness(t, cfg)
			r := hs.h.state.router
			r.cold = false
			calmSamples(r, 0, routeWindow, 30*time.Millisecond)
			calmSamples(r, 1, tc.bSamples, tc.bTTFT)
			out := hs.serve(chatRequest(""))
			first := hs.tr.next(t)
			first.respond(200, "text/event-stream")
			hedge := afterStall(t, hs, 100*time.Millisecond)
			if tc.moveToB {
				r.mu.Lock()
				r.primary = 1
				r.changes++
				r.mu.Unlock()
			}
			third := afterStall(t, hs, 100*time.Millisecond)
			hosts := first.req.URL.Host + " " + hedge.req.URL.Host + " " + third.req.URL.Host
			if hosts != tc.wantHosts {
				t.Fatalf("attempts went to %s, want %s", hosts, tc.wantHosts)
			}
			third.write(tokenChunk("C") + "data: [DONE]\n\n")
			third.end()
			<-out
			if rep := <-hs.reports; rep.HedgesStarted != 2 {
				t.Fatalf("%d hedges, want 2", rep.HedgesStarted)
			}
		})
	}
}

// A cold start's race whose two attempts both stall gets its third attempt
// on the upstream that has won most races so far.
func TestColdRaceRescueGoesToTheTallyLeader(t *testing.T) {
	cfg := fastestConfig()
	cfg.MaxAttempts = 3
	hs := newHarness(t, cfg)
	r := hs.h.state.router
	r.mu.Lock()
	r.raceWins[1] = 3
	r.racesDone = 3
	r.mu.Unlock()
	out := hs.serve(chatRequest(""))
	c1 := hs.tr.next(t)
	c2 := hs.tr.next(t)
	c1.respond(200, "text/event-stream")
	c2.respond(200, "text/event-stream")
	third := afterStall(t, hs, 100*time.Millisecond)
	if third.req.URL.Host != "b.test" {
		t.Fatalf("the cold race's third attempt went to %s, want b.test (it won 3 of 3 races)", third.req.URL.Host)
	}
	third.write(tokenChunk("B") + "data: [DONE]\n\n")
	third.end()
	<-out
	<-hs.reports
}

// On an ordered route a third attempt after two stalls goes to the
// hedge's upstream again, not back to the primary that stalled longer.
func TestOrderedRouteRescueGoesToTheHedgesUpstream(t *testing.T) {
	cfg := testConfig()
	cfg.MaxAttempts = 0 // the default
	hs := newHarness(t, cfg)
	out := hs.serve(chatRequest(""))
	first := hs.tr.next(t)
	first.respond(200, "text/event-stream")
	hedge := afterStall(t, hs, 100*time.Millisecond)
	third := afterStall(t, hs, 100*time.Millisecond)
	if hosts := first.req.URL.Host + " " + hedge.req.URL.Host + " " + third.req.URL.Host; hosts != "a.test b.test b.test" {
		t.Fatalf("attempts went to %s, want a.test b.test b.test", hosts)
	}
	third.write(tokenChunk("B") + "data: [DONE]\n\n")
	third.end()
	<-out
	<-hs.reports
}
