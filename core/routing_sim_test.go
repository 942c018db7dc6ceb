package core

import (
	"math"
	"math/rand"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// raceSim runs a route's policy on virtual time with the engine's own
// functions: planRoute, the hedge delay (hedgeDelay, exploreDelay), the
// hedge budget, routeWaiting when the hedge timer fires, commit, and
// finishReport when the race is over (what they learn, where they learn
// it). Only the attempts are modelled: each
// answers its first token after a TTFT drawn for its request and upstream
// from the reference workload at time scale 0.05 (lognormal, median 30ms,
// sigma 0.3, 2 % stalls of 0.5–1s), A's multiplied by a regime factor
// while degraded (4s period, 1.5s window at 2.5s, the reference regime
// scaled), and streams its other 19 tokens in 19ms; clients send their
// next request when the last token arrived. Request i has the same draws
// under every policy, as the proxy benchmark's requests do (ids by index),
// so ordered, fastest and the ideal hedge compare on the same draws, and a
// run is deterministic: no goroutine, no real clock.
type raceSim struct {
	h       *Hedger
	clock   *simClock
	draws   [6][]time.Duration
	factor  float64       // A's TTFT multiplier while degraded; 0: calm
	epoch   time.Duration // regime periods count from here
	events  simQueue
	seq     int
	next    int // the next request index to send
	limit   int // requests to send
	measure int // requests from this index on are measured

	ttft    []time.Duration
	onA     []bool // attempt 0 went to A and the request did not explore
	explore []bool
	started []time.Duration
	hedges  int
	delays  []time.Duration // of each measured request

	// both: B degrades with A. inst: the incident instrumentation
	// (routing_incident_sim_test.go), nil when not recorded.
	both bool
	inst *simInst
	// period, winFrom, winTo override the reference regime's timing (0: it).
	period, winFrom, winTo time.Duration
	// restartAt: the first request started at or after it goes to a new
	// Hedger of restartCfg, as after a restart of the gateway (0: never).
	restartAt  time.Duration
	restartCfg config.Config
}

// Timing of the reference regime at time scale 0.05 (llmsim.RegimeShift).
const (
	simPeriod     = 4 * time.Second
	simWindowFrom = 2500 * time.Millisecond
	simWindowTo   = 4000 * time.Millisecond
	simStream     = 19 * time.Millisecond
)

// simClock is the clock the engine functions read; the simulation sets it.
type simClock struct{ now time.Time }

func (c *simClock) Now() time.Time { return c.now }

func (c *simClock) AfterFunc(d time.Duration, f func()) Timer {
	panic("raceSim: no timers") // the simulation schedules the hedge timer itself
}

type simEventKind int

const (
	simStart simEventKind = 0
	simTimer simEventKind = 1
	simFirst simEventKind = 2
	simEnd   simEventKind = 3
)

type simEvent struct {
	at   time.Duration
	seq  int
	kind simEventKind
	req  *simRequest
}

// simQueue holds the pending events: a few per client, so the earliest is
// found by a scan (no container/heap: its interface calls into interpreted
// methods are slow under Yaegi).
type simQueue struct{ events []*simEvent }

func (q *simQueue) push(e *simEvent) { q.events = append(q.events, e) }

// pop removes and returns the earliest event (the first pushed of a tie).
func (q *simQueue) pop() *simEvent {
	best := 0
	for i := 1; i < len(q.events); i++ {
		e, b := q.events[i], q.events[best]
		if e.at < b.at || e.at == b.at && e.seq < b.seq {
			best = i
		}
	}
	e := q.events[best]
	last := len(q.events) - 1
	q.events[best] = q.events[last]
	q.events[last] = nil
	q.events = q.events[:last]
	return e
}

// simPrepared is every simulated request: hedgeable, no validity checks.
var simPrepared = &preparedRequest{hedgeable: true}

// simCancel is every simulated attempt's cancel (commit cancels the losers).
func simCancel() {}

// simRequest is one request in flight.
type simRequest struct {
	i       int
	rc      *race
	t0      time.Duration
	firstAt time.Duration // when the winner so far has its first token
	winner  *attempt
}

// simDraws draws n requests' TTFTs on two upstreams from seed: [up] for a
// request's first attempt on upstream up, [2+up] for a second one, [4+up]
// for a third (a new request to the same provider draws again).
func simDraws(seed int64, n int) [6][]time.Duration {
	rng := rand.New(rand.NewSource(seed))
	var d [6][]time.Duration
	for up := 0; up < 6; up++ {
		d[up] = make([]time.Duration, n)
		for i := 0; i < n; i++ {
			coin := rng.Float64()
			z := rng.NormFloat64()
			u := rng.Float64()
			if coin < 0.02 {
				d[up][i] = time.Duration(float64(500*time.Millisecond) * (1 + u))
			} else {
				d[up][i] = time.Duration(float64(30*time.Millisecond) * math.Exp(0.3*z))
			}
		}
	}
	return d
}

// simTrueP95 is the workload's true TTFT p95, rounded to the millisecond
// as the benchmark rounds its starting delay (and the ideal hedge's).
func simTrueP95() time.Duration {
	z := math.Sqrt2 * math.Erfinv(2*0.95/0.98-1)
	return time.Duration(float64(30*time.Millisecond) * math.Exp(0.3*z)).Round(time.Millisecond)
}

// newRaceSim builds a route of two upstreams, A (prefer_margin preferA)
// and B, with primary policy, the benchmark's delay (adaptive from the
// true p95) and budget.
func newRaceSim(primary string, preferA float64, draws [6][]time.Duration) *raceSim {
	cfg := config.Config{
		Primary:   primary,
		Upstreams: []config.UpstreamConfig{{Name: "A", URL: "http://a.test", PreferMargin: config.Fraction(preferA)}, {Name: "B", URL: "http://b.test"}},
		Delay:     config.DelayConfig{Mode: config.DelayAdaptive, Fixed: config.Duration(simTrueP95())},
		Budget:    config.BudgetConfig{Burst: 40},
	}
	clock := &simClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	h, err := New(cfg, Options{Clock: clock})
	if err != nil {
		panic(err)
	}
	return &raceSim{h: h, clock: clock, draws: draws, measure: math.MaxInt32}
}

func (s *raceSim) at(d time.Duration) time.Time {
	return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(d)
}

func (s *raceSim) push(at time.Duration, kind simEventKind, r *simRequest) {
	s.seq++
	s.events.push(&simEvent{at: at, seq: s.seq, kind: kind, req: r})
}

// ttftOf is the TTFT of the nth attempt (from 1) of request i on
// upstream up, sent at t.
func (s *raceSim) ttftOf(up, nth, i int, t time.Duration) time.Duration {
	d := s.draws[up][i]
	if nth > 3 {
		nth = 3 // a fourth attempt draws as the third did
	}
	if nth > 1 {
		d = s.draws[2*(nth-1)+up][i]
	}
	if (up == 0 || s.both) && s.degraded(t) {
		d = time.Duration(float64(d) * s.factor)
	}
	return d
}

func (s *raceSim) degraded(t time.Duration) bool {
	if s.factor <= 0 || t < s.epoch {
		return false
	}
	period, from, to := simPeriod, simWindowFrom, simWindowTo
	if s.period > 0 {
		period, from, to = s.period, s.winFrom, s.winTo
	}
	phase := (t - s.epoch) % period
	return phase >= from && phase < to
}

// run sends requests [from, to) with clients at a time, starting at now,
// and returns when the last one ended (the virtual time then).
func (s *raceSim) run(from, to, clients int, now time.Duration) time.Duration {
	s.next = from
	s.limit = to
	for c := 0; c < clients && s.next < s.limit; c++ {
		s.push(now, simStart, &simRequest{i: s.next})
		s.next++
	}
	for len(s.events.events) > 0 {
		ev := s.events.pop()
		now = ev.at
		s.clock.now = s.at(now)
		switch ev.kind {
		case simStart:
			s.start(ev.req, now)
		case simTimer:
			s.hedgeTimer(ev.req, now)
		case simFirst:
			s.firstToken(ev.req, now)
		case simEnd:
			s.end(ev.req, now)
		}
	}
	return now
}

// start is runRace up to the launch of attempt 0 (and a cold start's
// racing attempt 1).
func (s *raceSim) start(r *simRequest, now time.Duration) {
	if s.restartAt > 0 && now >= s.restartAt {
		h, err := New(s.restartCfg, Options{Clock: s.clock})
		if err != nil {
			panic(err)
		}
		s.h = h
		s.restartAt = 0
	}
	h := s.h
	deposit(h.state.bucket)
	rc := &race{h: h, p: simPrepared, rep: &Report{}, limit: h.cfg.MaxAttempts, used: make([]int, 2), start: s.clock.now}
	r.rc = rc
	r.t0 = now
	planRoute(rc)
	first := 0
	if rc.order != nil {
		first = rc.order[0]
	}
	rc.delay = delayInForce(h, rc, first)
	s.launch(r, first, RolePrimary, now)
	if rc.racing {
		s.launch(r, 1-first, RoleHedge, now)
	}
	if r.i >= s.measure {
		s.started[r.i-s.measure] = now
		s.onA[r.i-s.measure] = first == 0 && !rc.exploring
		s.explore[r.i-s.measure] = rc.exploring
		s.delays[r.i-s.measure] = rc.delay
	}
	if s.inst != nil {
		s.inst.started(s, r, now)
	}
	s.queueNext(r, now)
}

// launch starts an attempt of r on upstream up at now.
func (s *raceSim) launch(r *simRequest, up int, role string, now time.Duration) {
	rc := r.rc
	a := &attempt{index: len(rc.attempts), upstream: up, role: role, started: s.clock.now, cancel: simCancel}
	rc.attempts = append(rc.attempts, a)
	rc.used[up]++
	if a.index > 0 {
		s.hedges++
	}
	if at := now + s.ttftOf(up, rc.used[up], r.i, now); r.winner == nil || at < r.firstAt {
		r.firstAt = at
		r.winner = a
	}
}

// queueNext queues r's next event: the hedge timer when another attempt may
// start before the winner so far answers, else the first token.
func (s *raceSim) queueNext(r *simRequest, now time.Duration) {
	rc := r.rc
	if len(rc.attempts) < rc.limit && now+rc.delay < r.firstAt {
		s.push(now+rc.delay, simTimer, r)
		return
	}
	s.push(r.firstAt, simFirst, r)
}

// hedgeTimer is the race loop's hedge timer: the primary's wait is noted,
// and the hedge goes where the engine sends it (the other upstream, or the
// primary's again: hedgeBack) if it is free or the budget has a token; a
// denied hedge asks again one delay later (askAgain).
func (s *raceSim) hedgeTimer(r *simRequest, now time.Duration) {
	rc := r.rc
	if rc.order != nil {
		routeWaiting(rc)
		rc.hedgeBack = hedgeBack(rc)
	}
	up, _, _ := claimNext(rc, s.clock.now)
	took := freeHedge(rc) || rc.h.state.bucket.take(s.clock.now)
	if s.inst != nil {
		s.inst.timer(s, r, now, took, up)
	}
	if took {
		s.launch(r, up, RoleHedge, now)
	}
	s.queueNext(r, now)
}

// firstToken commits the winner (commit), then the others lose (drain).
func (s *raceSim) firstToken(r *simRequest, now time.Duration) {
	rc := r.rc
	r.winner.firstAt = s.clock.now
	rc.winner = r.winner
	commit(rc, r.winner)
	for _, a := range rc.attempts {
		if a != r.winner {
			a.result = ResultLost
		}
	}
	if r.i >= s.measure {
		s.ttft[r.i-s.measure] = now - r.t0
	}
	s.push(now+simStream, simEnd, r)
}

// end is the race's end (finishReport); the client sends its next request.
func (s *raceSim) end(r *simRequest, now time.Duration) {
	finishReport(r.rc)
	if s.next < s.limit {
		s.push(now, simStart, &simRequest{i: s.next})
		s.next++
	}
}

// simRun is what one simulated benchmark run measured.
type simRun struct {
	ttft    []time.Duration
	extra   float64
	changes int64
	sim     *raceSim
}

// simulate warms a route of policy primary (A preferred by preferA) up
// with warmup calm requests, then measures n more, A degraded by factor in
// its windows (0: calm), 20 clients at a time.
func simulate(primary string, preferA float64, seed int64, warmup, n int, factor float64) simRun {
	s := newRaceSim(primary, preferA, simDraws(seed, warmup+n))
	now := s.run(0, warmup, 20, 0)
	s.measure = warmup
	s.ttft = make([]time.Duration, n)
	s.onA = make([]bool, n)
	s.explore = make([]bool, n)
	s.started = make([]time.Duration, n)
	s.delays = make([]time.Duration, n)
	s.hedges = 0
	s.factor = factor
	s.epoch = now
	s.run(warmup, warmup+n, 20, now)
	return simRun{ttft: s.ttft, extra: float64(s.hedges) / float64(n), changes: s.h.state.router.changes, sim: s}
}

// idealHedge is the ideal hedge at the true p95 on the measured draws of
// run: TTFT min(A, d+B), and the share of requests it hedges.
func idealHedge(run simRun) ([]time.Duration, float64) {
	d := simTrueP95()
	s := run.sim
	var out []time.Duration
	hedged := 0
	for i := s.measure; i < s.measure+len(run.ttft); i++ {
		a, b := s.draws[0][i], s.draws[1][i]
		t := a
		if a > d {
			hedged++
			if d+b < a {
				t = d + b
			}
		}
		out = append(out, t)
	}
	return out, float64(hedged) / float64(len(out))
}

// simP99 is the nearest-rank p99 of ds.
func simP99(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(math.Ceil(0.99*float64(len(s))))-1]
}

// compiledTest: the simulations below run a few seconds compiled and far
// longer under Yaegi (yaegi test runs the package's tests without a test
// binary), where the policy's own tests are enough.
func compiledTest(t *testing.T) {
	if !strings.HasSuffix(os.Args[0], ".test") && os.Getenv("LLMHEDGE_ROUTESIM") != "1" {
		t.Skip("simulation: compiled tests only (LLMHEDGE_ROUTESIM=1 runs it anyway)")
	}
}

// In the calm workload, primary fastest is no worse than ordered: on the
// same draws its TTFT p99 is within 1.05x the ideal hedge and within 2 %
// of ordered's, its extra load within the ideal's + 1 point, and two
// upstreams of equal speed never trade the primary.
func TestRouteSimCalm(t *testing.T) {
	compiledTest(t)
	for seed := int64(1); seed <= 3; seed++ {
		ord := simulate(config.PrimaryOrdered, 0, seed, 200, 4000, 0)
		fast := simulate(config.PrimaryFastest, 0, seed, 200, 4000, 0)
		ideal, idealExtra := idealHedge(fast)
		fp, op, ip := simP99(fast.ttft), simP99(ord.ttft), simP99(ideal)
		if r := float64(fp) / float64(ip); r > 1.05 {
			t.Errorf("seed %d: calm fastest p99 %v = %.3fx the ideal hedge's %v, want <= 1.05", seed, fp, r, ip)
		}
		if r := float64(fp) / float64(op); r > 1.02 {
			t.Errorf("seed %d: calm fastest p99 %v = %.3fx ordered's %v on the same draws, want <= 1.02", seed, fp, r, op)
		}
		if fast.extra > idealExtra+0.01 {
			t.Errorf("seed %d: calm fastest extra load %.2f%%, want <= the ideal's %.2f%% + 1 point", seed, 100*fast.extra, 100*idealExtra)
		}
		if fast.changes != 0 {
			t.Errorf("seed %d: the primary changed %d times between two upstreams of equal speed, want 0", seed, fast.changes)
		}
	}
}

// Under the regime shift (A 8x slower for 1.5s of every 4s), averaged over
// 12 sets of draws: fastest's TTFT p99 is within 1.15x its calm run's, and
// A stops being the primary within 90ms of the first window (about one
// hedge delay and a hedge's TTFT: the 7 attempts it takes are counted at
// their commits, not when the winners' streams end, which took 106ms).
func TestRouteSimShift(t *testing.T) {
	compiledTest(t)
	if testing.Short() {
		t.Skip("-short: 12 simulated regime shifts, over a minute under -race")
	}
	const seeds = 12
	var ratios float64
	var left time.Duration
	for seed := int64(1); seed <= seeds; seed++ {
		calm := simulate(config.PrimaryFastest, 0, seed, 200, 4000, 0)
		shift := simulate(config.PrimaryFastest, 0, seed, 200, 4000, 8)
		ratios += float64(simP99(shift.ttft)) / float64(simP99(calm.ttft))
		left += simReactions(shift)[0].leftAfter
	}
	if r := ratios / seeds; r > 1.15 {
		t.Errorf("shifting fastest p99 = %.3fx its calm run's (mean of %d seeds), want <= 1.15", r, seeds)
	}
	if d := left / seeds; d > 90*time.Millisecond {
		t.Errorf("A was still primary %v into the first degraded window (mean of %d seeds), want <= 90ms", d, seeds)
	}
}

// TestRouteSimCompare logs, per seed, the calm p99 of ordered and fastest
// against the ideal hedge on the same draws, fastest's shifting p99
// against its calm run, and how fast it left A (LLMHEDGE_ROUTESIM=1 go
// test -run TestRouteSimCompare -v ./core; a few seconds).
func TestRouteSimCompare(t *testing.T) {
	if os.Getenv("LLMHEDGE_ROUTESIM") != "1" {
		t.Skip("LLMHEDGE_ROUTESIM=1 runs the comparison")
	}
	var sumOrd, sumFast, sumShift float64
	var sumLeft time.Duration
	seeds := 12
	for seed := int64(1); seed <= int64(seeds); seed++ {
		ord := simulate(config.PrimaryOrdered, 0, seed, 200, 4000, 0)
		fast := simulate(config.PrimaryFastest, 0, seed, 200, 4000, 0)
		shift := simulate(config.PrimaryFastest, 0, seed, 200, 4000, 8)
		ideal, idealExtra := idealHedge(fast)
		ip := float64(simP99(ideal))
		ro, rf := float64(simP99(ord.ttft))/ip, float64(simP99(fast.ttft))/ip
		rs := float64(simP99(shift.ttft)) / float64(simP99(fast.ttft))
		react := simReactions(shift)[0]
		sumOrd += ro
		sumFast += rf
		sumShift += rs
		sumLeft += react.leftAfter
		t.Logf("seed %2d: ideal p99 %v extra %.2f%% | ordered %.3fx extra %.2f%% | fastest %.3fx extra %.2f%% changes %d | shifting %.3fx its calm, extra %.2f%% changes %d, A left %d requests, %.1fms into the first window",
			seed, time.Duration(ip).Round(10*time.Microsecond), 100*idealExtra, ro, 100*ord.extra, rf, 100*fast.extra, fast.changes, rs, 100*shift.extra, shift.changes,
			react.left, float64(react.leftAfter.Microseconds())/1000)
	}
	n := float64(seeds)
	t.Logf("mean: ordered %.3fx ideal, fastest %.3fx ideal, fastest shifting %.3fx its calm, A left %.1fms into the first window",
		sumOrd/n, sumFast/n, sumShift/n, float64(sumLeft.Microseconds())/1000/n)
}

// simReaction is how the fastest route of a shifting run reacted to one
// degraded window: how many requests started in it still went to A (not
// exploring), the last how long into it, and how many requests after it
// ended until the first one went to A again (-1: none before the next
// window or the run's end).
type simReaction struct {
	left       int
	leftAfter  time.Duration
	backAfter  int
	backWithin time.Duration
}

func simReactions(run simRun) []simReaction {
	s := run.sim
	var out []simReaction
	for from := s.epoch + simWindowFrom; ; from += simPeriod {
		to := from - simWindowFrom + simWindowTo
		next := from + simPeriod
		re := simReaction{backAfter: -1}
		seen := false
		after := 0
		for i := range run.ttft {
			at := s.started[i]
			switch {
			case at >= from && at < to:
				seen = true
				if s.onA[i] {
					re.left++
					re.leftAfter = at - from
				}
			case at >= to && at < next && re.backAfter < 0 && !s.explore[i]:
				if s.onA[i] {
					re.backAfter = after
					re.backWithin = at - to
				}
				after++
			}
		}
		if !seen {
			return out
		}
		out = append(out, re)
	}
}
