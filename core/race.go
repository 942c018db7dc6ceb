package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/stream"
)

type eventKind int

// Explicit values: Yaegi v0.16.1 compares a typed `iota + 1` constant
// unequal to a variable holding the same value.
const (
	evReady      eventKind = 1 // an attempt has its first output event
	evFailed     eventKind = 2 // an attempt ended without one
	evHedgeTimer eventKind = 3 // the hedge delay passed
	evDeadline   eventKind = 5 // the shared deadline passed
)

// event is the only way anything reaches a race loop. Attempts and timers
// post to one buffered channel that the loop reads with plain receives: no
// select (Yaegi v0.16.1's select returns other invocations' values under
// concurrency). The buffer holds every event a race can ever be sent (one
// per attempt, one per armed timer, the deadline), so no sender ever
// blocks, even after the loop has returned.
//
// A client that leaves needs no event of its own: every attempt's context
// derives from the client's, so each attempt in flight fails at once and
// its event wakes the loop, which then finds the client gone. The loop
// never waits with no attempt in flight.
type event struct {
	kind    eventKind
	attempt *attempt
	seq     int
}

// race is the state of one hedged request; only its loop goroutine (the
// request's goroutine) touches it, apart from the atomic timedOut.
type race struct {
	h         *Hedger
	p         *preparedRequest
	rep       *Report
	start     time.Time
	events    chan event
	clientCtx context.Context    // the client's; for an idempotency leader, its flight's readers' (leadFlight)
	ctx       context.Context    // parent of every attempt: clientCtx, or its child when there is a deadline
	cancel    context.CancelFunc // ctx's, when it is the race's own
	// deadlineTimer cancels ctx at the deadline (with cancel, nil without).
	deadlineTimer Timer
	timedOut      int32 // atomic: the deadline callback fired

	limit       int    // attempts allowed
	limitReason string // denial reason when a hedge hits limit
	passthrough bool   // single unhedged attempt: any response wins on headers
	delay       time.Duration
	deadline    time.Time

	attempts []*attempt
	used     []int
	// order ranks the upstreams for this race on a fastest route (nil:
	// the configured order); exploring: attempt 0 probes order[0], the
	// runner-up, and delayFrom is the upstream whose delay the race uses.
	order      []int
	exploring  bool
	delayFrom  int
	exploreCap time.Duration // an exploring race's delay at most (see planRoute)
	// racing: a cold start's race, attempt 1 at once (routeColdRaces);
	// hedgeBack: the next hedge goes to the primary's upstream (hedgeBack);
	// reasked: a denied hedge asked again (askAgain).
	racing        bool
	hedgeBack     bool
	reasked       bool
	changesAtPlan int64 // the route's primary changes when it was planned (freeHedge)
	inFlight      int
	timer         Timer // the hedge timer on an injected clock
	// sysTimer is the hedge timer on the system clock, kept as it is:
	// under Yaegi converting it to Timer, and calling Stop through that
	// interface, cost a reflective method value each (see earlyHeaders.sys).
	sysTimer   *time.Timer
	timerSeq   int
	heldFatal  *attempt
	winner     *attempt
	commitAt   time.Time
	stopReason string        // OutcomeClientGone or OutcomeTimeout
	early      *earlyHeaders // nil: this race holds its headers until commit
}

func newRace(h *Hedger, p *preparedRequest, rep *Report, start time.Time) *race {
	clientCtx := p.orig.Context()
	rc := &race{h: h, p: p, rep: rep, start: start, clientCtx: clientCtx, ctx: clientCtx, limit: h.maxAttempts,
		used: make([]int, len(h.bases))}
	rc.events = make(chan event, h.eventsBuffer)
	if !p.hedgeable || p.stateful {
		limitRace(rc, p)
	}
	rep.Hedged = p.hedgeable
	return rc
}

// limitRace limits to one attempt the race of a request that may not be
// raced, or that may change state upstream without a key of the client's.
// (newRace's rare case: under Yaegi every slot of a frame is allocated on
// each call.)
func limitRace(rc *race, p *preparedRequest) {
	if !p.hedgeable {
		rc.limit = 1
		rc.passthrough = true
	} else if !p.clientKey {
		rc.limit = 1
		rc.limitReason = DenyNotIdempotent
	}
}

// runRace drives the race to a winner or a final failure, writes the
// answer, and waits for every attempt goroutine to end before it returns.
// Cleanup is explicit rather than deferred: a panic here is a bug that
// aborts the request anyway, and each deferred call costs Yaegi a
// reflective call.
func runRace(rc *race, w http.ResponseWriter) error {
	h := rc.h
	if clientDeadline, ok := rc.clientCtx.Deadline(); ok || h.timeout {
		armDeadline(rc, clientDeadline)
	}
	// Attempt 0 goes out even when every upstream is unavailable.
	var first int
	var probe uint64
	if h.fastest {
		planRoute(rc)
	}
	if rc.passthrough {
		// Pass-through is never a breaker's probe: its answer says
		// nothing to the breaker (commit records nothing for it), and a
		// long stream would hold the probe slot, keeping every hedged
		// request off the upstream for as long as it runs.
		first = passThroughUpstream(rc)
	} else {
		// claimUpstream's attempt 0, inline (the first upstream in order,
		// admitted when healthy): under Yaegi a call allocates the
		// callee's whole frame.
		if rc.order != nil {
			first = rc.order[0]
		}
		ok := false
		if probe, ok = admit(h.health[first], rc.start); !ok {
			first, _, probe = pickAndAdmit(h, rc.order, nil, rc.start)
		}
	}
	rc.delay = delayInForce(h, rc, first)
	rc.rep.Delay = rc.delay
	role := RolePrimary
	if rc.passthrough {
		role = RoleSingle
	}
	launch(rc, role, first, probe)
	if rc.racing {
		tryLaunch(rc, RoleHedge)
	}
	// startEarlyHeaders's first test inline: a request that asks for no
	// stream costs no call (Yaegi allocates the callee's whole frame).
	if rc.p.streams {
		startEarlyHeaders(rc, w)
	}
	raceLoop(rc)
	if rc.sysTimer != nil {
		rc.sysTimer.Stop()
	} else if rc.timer != nil {
		rc.timer.Stop()
	}
	if rc.early != nil {
		stopEarlyHeaders(rc)
	}
	var err error
	if rc.winner != nil {
		err = deliver(rc, w)
	} else {
		answerNoWinner(rc, w)
	}
	if rc.cancel != nil {
		endDeadline(rc)
	}
	drain(rc)
	finishReport(rc)
	return err
}

// passThroughUpstream picks the upstream of a pass-through race's one
// attempt (runRace's rare case, a function of its own for Yaegi).
func passThroughUpstream(rc *race) int {
	up, _ := pickUpstreamIn(rc.h, rc.order, nil, rc.start)
	return up
}

// armDeadline computes the race's deadline (the route's timeout, or the
// client's own, zero when it has none, if sooner) and arms its timer.
func armDeadline(rc *race, clientDeadline time.Time) {
	if rc.h.cfg.Timeout > 0 {
		rc.deadline = rc.start.Add(time.Duration(rc.h.cfg.Timeout))
	}
	if !clientDeadline.IsZero() && (rc.deadline.IsZero() || clientDeadline.Before(rc.deadline)) {
		rc.deadline = clientDeadline
	}
	rc.deadlineTimer = deadlineTimer(rc)
}

// endDeadline ends a race that had a deadline, once its answer has gone
// out: it cancels the race's context (what is left of every attempt) and
// stops the deadline's timer. (runRace's rare case, a function of its
// own: under Yaegi every slot of a frame is allocated on each call.)
func endDeadline(rc *race) {
	rc.cancel()
	rc.deadlineTimer.Stop()
}

// deadlineTimer arms the timer that stops the race at its deadline, and
// gives the race a context of its own for the timer to cancel every
// attempt with.
func deadlineTimer(rc *race) Timer {
	ctx, cancel := context.WithCancel(rc.clientCtx)
	rc.ctx = ctx
	rc.cancel = cancel
	t := clockAfterFunc(rc.h, rc.deadline.Sub(rc.start), func() {
		atomic.StoreInt32(&rc.timedOut, 1)
		rc.cancel()
		rc.events <- event{kind: evDeadline}
	})
	return t
}

// answerNoWinner answers the client when the race ended without a winner.
func answerNoWinner(rc *race, w http.ResponseWriter) {
	if earlySent(rc) && rc.stopReason != OutcomeClientGone {
		earlyFailure(rc, w)
		return
	}
	switch rc.stopReason {
	case OutcomeClientGone:
		rc.rep.Outcome = OutcomeClientGone
		rc.rep.Status = 499
	case OutcomeTimeout:
		rc.rep.Outcome = OutcomeTimeout
		rc.rep.Status = http.StatusGatewayTimeout
		setErrorReport(rc, w.Header())
		setNoRetryHeaders(rc, w.Header())
		writeJSONError(w, http.StatusGatewayTimeout, errTypeUpstream, codeUpstreamTimeout, "no upstream answered before the deadline")
	default:
		failAll(rc, w)
	}
}

// raceLoop reads events until a winner, a final failure, or a stop.
func raceLoop(rc *race) {
	for {
		ev := <-rc.events
		switch ev.kind {
		case evHedgeTimer:
			onHedgeTimer(rc, ev.seq)
		case evReady:
			// settle, inline.
			rc.inFlight--
			if ev.attempt.role == RoleHedge {
				releaseHedgeSlot(rc.h.state)
			}
			rc.winner = ev.attempt
			return
		case evFailed:
			if !onFailed(rc, ev.attempt) {
				return
			}
		case evDeadline:
			if stopped(rc) {
				return
			}
		case evKeepAlive:
			if rc.early != nil {
				keepAlive(rc)
			}
		}
	}
}

// onHedgeTimer handles the hedge timer armed as seq: unless it is stale
// or the race holds back, it launches a hedge. (raceLoop's rare case, a
// function of its own: under Yaegi every slot of a frame is allocated on
// each call, taken branch or not.)
func onHedgeTimer(rc *race, seq int) {
	if seq == rc.timerSeq && rc.heldFatal == nil && !holdingOutput(rc) {
		if rc.order != nil {
			routeWaiting(rc)
			rc.hedgeBack = hedgeBack(rc)
		}
		if !tryLaunch(rc, RoleHedge) {
			askAgain(rc)
		}
		// hedgeBack is this timer's choice: a retry after a
		// failure goes elsewhere.
		rc.hedgeBack = false
	}
}

// onFailed handles an attempt's failure: it may hold a fatal answer, retry
// or hedge. It reports whether the race goes on.
func onFailed(rc *race, a *attempt) bool {
	settle(rc, a)
	if stopped(rc) {
		return false
	}
	noteFailure(rc, a)
	if a.fatal {
		if rc.inFlight == 0 {
			return false
		}
		rc.heldFatal = a
		return true
	}
	// A rate limit is not asked again within milliseconds: after a 429
	// the race retries only on an upstream it has not tried.
	if a.retryable && rc.heldFatal == nil && (a.status != 429 || untried(rc)) {
		role := RoleHedge
		if rc.inFlight == 0 {
			role = RoleRetry
		}
		tryLaunch(rc, role)
	}
	return rc.inFlight > 0
}

// untried reports whether some upstream has had no attempt of rc yet.
func untried(rc *race) bool {
	for _, n := range rc.used {
		if n == 0 {
			return true
		}
	}
	return false
}

// stopped reports (and records) whether the client left or the deadline passed.
func stopped(rc *race) bool {
	if atomic.LoadInt32(&rc.timedOut) == 1 {
		rc.stopReason = OutcomeTimeout
		return true
	}
	if rc.clientCtx.Err() != nil {
		rc.stopReason = OutcomeClientGone
		return true
	}
	return false
}

// settle marks an attempt's terminal event as received.
func settle(rc *race, a *attempt) {
	rc.inFlight--
	if a.role == RoleHedge {
		releaseHedgeSlot(rc.h.state)
	}
}

// tryLaunch starts another attempt if the limits, budgets and health allow,
// and records why not otherwise. Hedges (extra load while another attempt
// runs) pay from the budget; a retry after the only attempt failed does not.
func tryLaunch(rc *race, role string) bool {
	h, st := rc.h, rc.h.state
	now := h.now()
	deny := func(reason string) bool {
		// A hedge asked again is denied once in the report for each reason.
		if n := len(rc.rep.Denials); !rc.reasked || n == 0 || rc.rep.Denials[n-1] != reason {
			rc.rep.Denials = append(rc.rep.Denials, reason)
		}
		return false
	}
	if len(rc.attempts) >= rc.limit {
		if rc.limitReason != "" {
			return deny(rc.limitReason)
		}
		return deny(DenyMaxAttempts)
	}
	minLeft := time.Duration(h.cfg.MinTimeLeft)
	if minLeft == 0 {
		minLeft = rc.delay
	}
	if !rc.deadline.IsZero() && rc.deadline.Sub(now) < minLeft {
		return deny(DenyDeadline)
	}
	extra := role == RoleHedge
	if extra && switchInForce(h).Paused {
		return deny(DenyPaused)
	}
	if extra && overloaded(st.overload, h.cfg.Budget.OverloadRate, now) {
		return deny(DenyOverload)
	}
	// From here on each check takes something; a later denial gives back
	// what the earlier ones took. The hedge's slot is released when its
	// terminal event is settled.
	if extra && !takeHedgeSlot(st, hedgeCap(h)) {
		return deny(DenyConcurrency)
	}
	up, available, probe := claimNext(rc, now)
	if !available {
		if extra {
			releaseHedgeSlot(st)
		}
		return deny(DenyNoUpstream)
	}
	if extra {
		if reason := payForHedge(rc, now); reason != "" {
			releaseHedgeSlot(st)
			releaseProbe(st.health[up], probe)
			return deny(reason)
		}
	}
	launch(rc, role, up, probe)
	return true
}

// payForHedge charges a hedge that passed every other check (see
// chargeHedge). It returns the denial reason, or "" when the hedge is
// paid for.
func payForHedge(rc *race, now time.Time) string {
	return chargeHedge(rc, now)
}

// claimNext claims the upstream of the race's next attempt: the one
// hedgeBack chose at the hedge timer, when it admits one (an exploring
// race's newest attempt's, the primary; any other race's attempt 0's),
// else the next by claimUpstream in rescueOrder.
func claimNext(rc *race, now time.Time) (int, bool, uint64) {
	if rc.hedgeBack {
		rc.hedgeBack = false
		up := rc.attempts[0].upstream
		if rc.exploring {
			up = rc.attempts[len(rc.attempts)-1].upstream
		}
		if probe, ok := admit(rc.h.state.health[up], now); ok {
			return up, true, probe
		}
	}
	up, available, probe := claimUpstream(rc.h, rescueOrder(rc), rc.used, now)
	return up, available, probe
}

// askAgain re-arms the hedge timer after a hedge the budget or the cap on
// hedges in flight denied: both refill as requests come and hedges end,
// and a primary stalled for seconds would otherwise wait them out alone.
// Other denials stand (the race is full, hedging is paused, the spend cap
// is reached, no upstream is free, too little time is left).
func askAgain(rc *race) {
	n := len(rc.rep.Denials)
	if n == 0 || len(rc.attempts) >= rc.limit {
		return
	}
	if last := rc.rep.Denials[n-1]; last == DenyBudget || last == DenyConcurrency {
		rc.reasked = true
		stopHedgeTimer(rc)
		armHedgeTimer(rc)
	}
}

// hedgeCap is the cap on hedges in flight: the configured one, or in a
// fleet this replica's share of it (fleetsync.go).
func hedgeCap(h *Hedger) int {
	if h.fleet != nil {
		if share := atomic.LoadInt64(&h.state.share.cap); share > 0 {
			return int(share)
		}
	}
	return h.cfg.Budget.MaxConcurrentHedges
}

// launch starts attempt len(rc.attempts) on upstream up (as its breaker's
// probe when probe is not 0) and re-arms the hedge timer for the next one.
func launch(rc *race, role string, up int, probe uint64) {
	h := rc.h
	a := &attempt{index: len(rc.attempts), upstream: up, role: role, started: h.now(), probe: probe}
	actx, acancel := context.WithCancel(rc.ctx)
	a.ctx = actx
	a.cancel = acancel
	rc.attempts = append(rc.attempts, a)
	rc.used[up]++
	rc.inFlight++
	if rc.rep.trace != nil {
		startAttemptSpan(rc, a)
	}
	if a.index > 0 {
		countExtra(rc)
		stopHedgeTimer(rc)
	}
	go runAttempt(h, a, rc.p, rc.events, rc.passthrough)
	armHedgeTimer(rc)
}

// stopHedgeTimer stops the hedge timer armed for an earlier attempt
// before armHedgeTimer arms the next (attempt 0 has none: its own
// function, as under Yaegi every slot of a frame is allocated on each call).
func stopHedgeTimer(rc *race) {
	if rc.sysTimer != nil {
		rc.sysTimer.Stop()
	} else if rc.timer != nil {
		rc.timer.Stop()
	}
}

// armHedgeTimer arms the hedge timer for the race's next attempt, one
// delay from now, when there may be one; a timer armed before has been
// stopped (stopHedgeTimer), and its event, if already sent, is stale
// (timerSeq).
func armHedgeTimer(rc *race) {
	h := rc.h
	rc.timerSeq++
	// An exploring race's limit may be above max_attempts (exploreRoute);
	// a race limited to one attempt still times its hedge, whose denial
	// says why.
	most := h.maxAttempts
	if rc.limit > most {
		most = rc.limit
	}
	if rc.p.hedgeable && len(rc.attempts) < most {
		seq := rc.timerSeq
		events := rc.events
		fire := func() { events <- event{kind: evHedgeTimer, seq: seq} }
		if h.systemClock {
			rc.sysTimer = time.AfterFunc(rc.delay, fire)
		} else {
			rc.timer = clockAfterFunc(h, rc.delay, fire)
		}
	}
}

// countExtra counts an attempt after the first: a hedge (its slot in
// hedgesInFlight was taken by tryLaunch) or a retry.
func countExtra(rc *race) {
	rc.rep.HedgesStarted++
}

// noteFailure feeds a failed attempt into upstream health and overload.
func noteFailure(rc *race, a *attempt) {
	a.result = failedResult(a)
	h, st := rc.h, rc.h.state
	now := h.now()
	if a.status == 429 && callersOwn429(h, rc.p, a.upstream) {
		// That caller's rate limit, not the upstream's state.
		releaseProbe(st.health[a.upstream], a.probe)
		return
	}
	if a.status != 0 {
		recordStatus(st.overload, a.status)
	}
	if a.fatal {
		releaseProbe(st.health[a.upstream], a.probe)
		return
	}
	if a.answered || a.invalid != "" {
		// A complete but empty answer: as likely a broken upstream as a
		// working one, so it counts neither way; as a probe it lets the
		// next attempt probe. An invalid answer came from a working
		// upstream: it does not open the breaker either.
		releaseProbe(st.health[a.upstream], a.probe)
		return
	}
	retryAfter := ""
	if a.resp != nil {
		retryAfter = a.resp.Header.Get("Retry-After")
	}
	cooled, opened := recordFailure(st.health[a.upstream], now, coolDownFor(a.status, retryAfter, now, &h.cfg.Budget), a.probe, &h.cfg.Budget)
	if h.fleet != nil {
		fleetNoteFailure(h, a, cooled, opened)
	}
}

// callersOwn429 reports whether a 429 from upstream i answered the
// caller's own credentials (see BudgetConfig.Caller429).
func callersOwn429(h *Hedger, p *preparedRequest, i int) bool {
	if h.cfg.Budget.Caller429 != config.Caller429Caller {
		return false
	}
	for _, name := range h.passedCredentials[i] {
		if p.orig.Header.Get(name) != "" {
			return true
		}
	}
	return false
}

// drain cancels every attempt and waits for each goroutine's terminal event,
// closing the bodies of late winners. After it no goroutine of this request
// is left.
func drain(rc *race) {
	if len(rc.attempts) == 1 && rc.inFlight == 0 {
		// The common case: one attempt, settled. Only a winner still has
		// an open body.
		a := rc.attempts[0]
		if a == rc.winner && a.resp != nil {
			a.resp.Body.Close()
		}
		a.cancel()
		if a.result == "" {
			a.result = ResultCancelled
		}
		if a.probe != 0 {
			releaseAttemptProbe(rc, a)
		}
		return
	}
	drainAll(rc)
}

// releaseAttemptProbe frees the breaker's probe slot a holds. (drain's
// rare case: under Yaegi the arguments of a call in a branch not taken
// are frame slots all the same.)
func releaseAttemptProbe(rc *race, a *attempt) {
	releaseProbe(rc.h.state.health[a.upstream], a.probe)
}

// drainAll is drain for a race with several attempts or any in flight.
func drainAll(rc *race) {
	for _, a := range rc.attempts {
		if a != rc.winner {
			a.cancel()
		}
	}
	if rc.inFlight > 0 {
		awaitAttempts(rc)
	}
	if rc.winner != nil && rc.winner.resp != nil {
		rc.winner.resp.Body.Close()
	}
	for _, a := range rc.attempts {
		a.cancel()
		if a.result == "" {
			a.result = ResultCancelled
		}
		// A probe that ended without an answer frees its breaker's slot.
		releaseProbe(rc.h.state.health[a.upstream], a.probe)
		if a.result == ResultLost && !rc.commitAt.IsZero() && a.endedAt.After(rc.commitAt) {
			a.cancelLatency = a.endedAt.Sub(rc.commitAt)
		}
	}
}

// awaitAttempts receives the terminal event of every attempt still in
// flight, closing the bodies of late winners.
func awaitAttempts(rc *race) {
	for rc.inFlight > 0 {
		ev := <-rc.events
		if ev.attempt == nil {
			continue
		}
		settle(rc, ev.attempt)
		a := ev.attempt
		if ev.kind == evReady && a.resp != nil {
			a.resp.Body.Close() // a late winner
			putBuffer(a.prefix)
			a.prefix = nil
		}
		if a.result == "" {
			if rc.winner != nil {
				a.result = ResultLost
			} else {
				a.result = ResultCancelled
			}
		}
	}
}

// finishReport feeds the TTFT estimators and, when someone reads the
// report (an observer, a trace), completes it.
//
// The winner's sample goes to the estimators here, not in a function of
// its own: under Yaegi a call allocates the callee's whole frame.
func finishReport(rc *race) {
	if w := rc.winner; w != nil && !rc.passthrough {
		addSample(rc.h.estimators[w.upstream], w.firstAt.Sub(w.started))
		if len(rc.attempts) > 1 {
			learnFromLostPrimary(rc)
		}
	}
	if rc.h.reports {
		completeReport(rc)
	}
}

// completeReport fills what only the report's readers see: the winner,
// the client's TTFT, the validation, and the attempt list and
// wasted-token estimate when an observer or the request's trace reads
// them. (finishReport's rare case, a function of its own: under Yaegi
// every slot of a frame is allocated on each call.)
func completeReport(rc *race) {
	if w := rc.winner; w != nil {
		rc.rep.Winner = w.index
		rc.rep.TTFT = w.firstAt.Sub(rc.start)
		if rc.p.checks != 0 {
			noteValidation(rc)
		}
	}
	if rc.h.observed || rc.rep.trace != nil {
		reportAttempts(rc)
	}
}

// learnFromLostPrimary records a primary that lost: it had no output for
// at least this long, a lower bound and above the delay, which keeps the
// quantile honest instead of leaving the slow tail out of the window.
func learnFromLostPrimary(rc *race) {
	if p := rc.attempts[0]; p != rc.winner && p.result == ResultLost {
		addSample(rc.h.state.estimators[p.upstream], rc.commitAt.Sub(p.started))
	}
}

// reportAttempts fills the report's attempt list and wasted-token estimate.
func reportAttempts(rc *race) {
	h, rep := rc.h, rc.rep
	total := h.now().Sub(rc.start)
	rep.Total = total
	tokens := promptTokens(rc.p)
	for _, a := range rc.attempts {
		ar := AttemptReport{Index: a.index, Upstream: h.cfg.Upstreams[a.upstream].Name, Role: a.role,
			Result: a.result, Status: a.status, Started: a.started.Sub(rc.start), CancelLatency: a.cancelLatency,
			Explore: rc.exploring && a.index == 0}
		if a.result == ResultFailed || a.result == ResultInvalid {
			ar.Error = a.reason
			ar.Invalid = a.invalid
			ar.ErrorType = errorType(a)
		}
		if rep.trace != nil {
			ar.Ended = attemptEnded(rc, a, total)
			describeUpstream(h, &ar, a.upstream)
		}
		if !a.firstAt.IsZero() && a == rc.winner {
			ar.TTFT = a.firstAt.Sub(a.started)
		}
		if a != rc.winner {
			rep.WastedPromptTokens += tokens
		}
		rep.Attempts = append(rep.Attempts, ar)
	}
}

// promptTokens estimates a request's prompt tokens from its body (4 bytes a token).
func promptTokens(p *preparedRequest) int64 { return int64(len(p.body)) / 4 }

// failAll answers the client when no attempt won: a complete 2xx answer
// without output, else a held fatal error, else the most useful upstream
// error, else 502.
func failAll(rc *race, w http.ResponseWriter) {
	best := bestFailure(rc)
	if best != nil && best.invalid != "" {
		answerInvalid(rc, w, best)
		return
	}
	rep := rc.rep
	rep.Outcome = OutcomeUpstreamError
	switch {
	case best != nil && best.fatal:
		rep.Outcome = OutcomeFatal
		fallthrough
	case best != nil && best.resp != nil && best.status != 0 && (best.answered || best.status < 200 || best.status > 299):
		rep.Status = best.status
		hdr := w.Header()
		copyHeader(hdr, best.resp.Header)
		removeHopHeaders(hdr)
		hdr.Del("Content-Length")
		errorAnswerHeaders(rc, hdr, best)
		if len(best.errBody) == 0 && !best.answered {
			writeJSONError(w, best.status, errTypeUpstream, codeUpstreamError, upstreamMessage(rc.h, best))
			return
		}
		w.WriteHeader(best.status)
		w.Write(best.errBody)
	default:
		// The client gets a code and the upstream's name; the cause
		// (addresses, resolver, URL) is in the report only.
		code := codeUpstreamUnreachable
		msg := "no upstream could be reached"
		if best != nil && best.code != "" {
			code = best.code
			msg = upstreamMessage(rc.h, best)
		}
		rep.Status = http.StatusBadGateway
		errorAnswerHeaders(rc, w.Header(), best)
		writeJSONError(w, http.StatusBadGateway, errTypeUpstream, code, msg)
	}
}

// errorRank orders failures by how useful they are to the client.
func errorRank(a *attempt) int {
	switch {
	case a.invalid != "":
		return 7 // a complete answer that failed validation
	case a.answered:
		return 6 // a complete 2xx answer beats any error status
	case a.fatal:
		return 5
	case a.status == 429:
		return 4
	case a.status >= 300:
		return 3
	case a.status != 0:
		return 2 // 2xx whose stream failed before output
	}
	return 1
}

// deliver commits the winner: its status, headers and every byte read so far
// go out as they came, then the rest is streamed with a flush per read.
func deliver(rc *race, w http.ResponseWriter) error {
	a := rc.winner
	commit(rc, a)
	if rc.early != nil && rc.early.sent { // earlySent, without a call's frame
		if !lateWinner(rc, a, w) {
			putBuffer(a.prefix)
			a.prefix = nil
			return nil
		}
	} else {
		writeWinnerHeader(rc, a, w)
	}
	var err error
	if a.complete {
		deliverComplete(rc, a, w)
	} else {
		err = deliverBody(rc, a, w)
	}
	// The prefix has been written, and copied into the tail: its pooled
	// buffer can go (a streamed body's went already: no call then).
	if a.prefix != nil {
		putBuffer(a.prefix)
		a.prefix = nil
	}
	return err
}

// deliverComplete writes a winner whose whole body was read (a.complete):
// it is sent in full when the handler returns; the whole body was read, so
// the trailers are known. (deliverBody's other case, a function of its
// own: under Yaegi every slot of a frame is allocated on each call.)
func deliverComplete(rc *race, a *attempt, w http.ResponseWriter) {
	if len(a.prefix) > 0 {
		if _, err := w.Write(a.prefix); err != nil {
			rc.rep.Outcome = OutcomeClientGone
			return
		}
	}
	if len(a.resp.Trailer) > 0 {
		forwardTrailers(w, a.resp.Trailer)
	}
}

// deliverBody writes the winner's prefix and streams the rest of its body
// (a winner that is not a.complete).
func deliverBody(rc *race, a *attempt, w http.ResponseWriter) error {
	if len(a.prefix) > 0 {
		if _, err := w.Write(a.prefix); err != nil {
			rc.rep.Outcome = OutcomeClientGone
			return nil
		}
	}
	buf := buffers.Get().([]byte) // a pooled buffer, taken inline: one call fewer under Yaegi
	// The end of the pooled buffer holds the stream's tail, the rest takes
	// the reads: one allocation less per request.
	reads := buf[:len(buf)-tailCompactAt]
	var tail []byte
	if a.streaming {
		tail = keepTail(buf[len(buf)-tailCompactAt:len(buf)-tailCompactAt], a.prefix)
	}
	var shape *stream.Shape
	if !a.streaming {
		shape = shapeFor(a)
	}
	// Streaming holds one buffer, not two.
	putBuffer(a.prefix)
	a.prefix = nil
	tail, err := copyRest(w, a.resp.Body, reads, tail, shape)
	if err == nil && (a.sse && stream.EndsMidLine(tail) && !stream.Finished(tail) || shape != nil && stream.ShapeOpen(shape)) {
		err = errEndedBroken
	}
	if err != nil {
		err = streamEnded(rc, a, w, tail, err)
	} else if len(a.resp.Trailer) > 0 {
		forwardTrailers(w, a.resp.Trailer) // filled in at the body's EOF
	}
	putBuffer(buf) // after streamEnded: tail may live in buf
	return err
}

// commit records the winner and cancels the losers at once; their
// goroutines end on their own and are collected by drain.
func commit(rc *race, a *attempt) {
	h := rc.h
	rc.commitAt = h.now()
	rc.rep.CommitAt = rc.commitAt
	if len(rc.attempts) > 1 {
		cancelLosers(rc, a)
	}
	a.result = ResultWon
	if !rc.passthrough {
		recordSuccess(h.health[a.upstream], a.probe)
		recordStatus(h.overload, a.status)
		if rc.order != nil {
			learnRoute(rc) // at the commit, not after the stream: see learnRoute
		}
	}
	rc.rep.Outcome = OutcomeOK
	rc.rep.Status = a.status
}

// cancelLosers cancels every attempt but the winner a.
func cancelLosers(rc *race, a *attempt) {
	for _, other := range rc.attempts {
		if other != a {
			other.cancel()
			releaseProbe(rc.h.state.health[other.upstream], other.probe)
		}
	}
}

// writeWinnerHeader sends the winner's status and headers.
func writeWinnerHeader(rc *race, a *attempt, w http.ResponseWriter) {
	h := rc.h
	resp := a.resp
	hdr := w.Header()
	// copyHeader, inline, sharing the values: resp is this request's
	// alone and its header is not changed after, and under Yaegi a copy
	// of each costs an append and a conversion per header.
	for k, vv := range resp.Header {
		hdr[k] = vv
	}
	removeHopHeaders(hdr)
	if (a.streaming || !a.complete) && !rc.passthrough {
		// Pass-through streams the body unchanged, so its length holds
		// (HEAD and GET answers keep theirs, as in a reverse proxy).
		hdr.Del("Content-Length")
	}
	if len(resp.Trailer) > 0 {
		announceTrailers(hdr, resp.Trailer)
	}
	if h.cfg.ReportHeader != "" {
		setReportHeader(rc, a, hdr)
	}
	w.WriteHeader(a.status)
}

// setReportHeader adds the optional header that reports the race.
func setReportHeader(rc *race, a *attempt, hdr http.Header) {
	h := rc.h
	denied := ""
	if len(rc.rep.Denials) > 0 {
		// Why a slow answer had no (further) hedge.
		denied = " denied=" + strings.Join(rc.rep.Denials, ",")
	}
	hdr.Set(h.cfg.ReportHeader, fmt.Sprintf("llmhedge;dur=%d;desc=\"attempts=%d winner=%d upstream=%s delay_ms=%d%s%s\"",
		a.firstAt.Sub(rc.start).Milliseconds(), len(rc.attempts), a.index, h.cfg.Upstreams[a.upstream].Name, rc.delay.Milliseconds(),
		denied, routeReport(rc)))
}

// errClientWrite marks a failed write to the client in copyRest's result.
var errClientWrite = errors.New("writing to the client failed")

// copyRest flushes what w holds, then streams body to w through buf with a
// flush per read until io.EOF (nil), a failed write (errClientWrite) or a
// read error (returned). Given a tail (a stream's), it appends what it
// delivers to it, keeping the last bytes, and returns it, to tell a
// finished stream from a cut one. Every statement of the loop runs once per
// upstream read, and under Yaegi each call and interface conversion costs
// microseconds: the flush method is resolved once, and the tail is appended
// inline and cut back only now and then.
func copyRest(w http.ResponseWriter, body io.Reader, buf, tail []byte, shape *stream.Shape) ([]byte, error) {
	// Flush called directly where it can be (see flusherFor): a function
	// value would cost an interpreted call per read.
	hf, hasFlush := w.(http.Flusher)
	var flushW func()
	if hasFlush {
		hf.Flush()
	} else {
		flushW = flusherFor(w)
		flushW()
	}
	keep := tail != nil
	for {
		n, err := body.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if _, werr := w.Write(chunk); werr != nil {
				return tail, errClientWrite
			}
			if hasFlush {
				hf.Flush()
			} else {
				flushW()
			}
			if shape != nil {
				stream.FeedShape(shape, chunk)
			}
			if keep {
				tail = append(tail, chunk...)
				if len(tail) > tailCompactAt {
					tail = keepTail(tail[:0], tail[len(tail)-tailSize:])
				}
			}
		}
		if err == io.EOF {
			return tail, nil
		}
		if err != nil {
			return tail, err
		}
	}
}

// errEndedBroken: the upstream ended its body cleanly inside its answer.
var errEndedBroken = errors.New("the upstream ended its answer in the middle")

// shapeFor returns a Shape fed with a's prefix when a is a JSON answer
// whose rest is streamed, else nil.
func shapeFor(a *attempt) *stream.Shape {
	ct := a.resp.Header.Get("Content-Type")
	if ct == "" || !looksJSON(ct) {
		return nil
	}
	shape := &stream.Shape{}
	stream.FeedShape(shape, a.prefix)
	return shape
}

// streamEnded classifies how the winner's copy ended (err from copyRest)
// and returns ErrStreamAborted when the client got an incomplete answer it
// must see as failed.
func streamEnded(rc *race, a *attempt, w http.ResponseWriter, tail []byte, err error) error {
	rep := rc.rep
	if err == io.EOF || errors.Is(err, io.EOF) {
		return nil
	}
	if err == errClientWrite {
		rep.Outcome = OutcomeClientGone
		return nil
	}
	if rc.clientCtx.Err() != nil && atomic.LoadInt32(&rc.timedOut) == 0 {
		// A client (e.g. the OpenAI SDK) may close as soon as it reads the
		// stream's end marker, before the upstream's EOF arrives: that
		// answer was delivered in full.
		if len(tail) > tailSize {
			tail = tail[len(tail)-tailSize:]
		}
		if !a.streaming || !stream.Finished(tail) {
			rep.Outcome = OutcomeClientGone
		}
		return nil
	}
	rep.Outcome = OutcomeStreamFailed
	if atomic.LoadInt32(&rc.timedOut) == 1 {
		rep.Outcome = OutcomeTimeout
	}
	if rc.h.cfg.StreamErrorEvent && a.streaming {
		// The upstream may have broken off mid-line or mid-event: end both
		// first, or the error event's lines would join the partial event
		// and no client would dispatch it.
		if end := sseEventEnd(tail); end != "" {
			w.Write([]byte(end))
		}
		// The cause (a read error quoting addresses) is not the client's to see.
		msg := rc.h.publicNames[a.upstream] + " broke off its answer"
		if rep.Outcome == OutcomeTimeout {
			msg = "the deadline passed during the answer"
		}
		writeStreamErrorEvent(w, msg)
		flush(w)
		return nil
	}
	return ErrStreamAborted
}

// sseEventEnd returns the line ends that complete an SSE stream whose
// delivered bytes end with tail: "" when tail ends with a blank line (an
// event boundary), "\n" after one line end, "\n\n" mid-line. A lone "\r"
// also gets "\n\n": a "\n" right after it belongs to the same line end.
func sseEventEnd(tail []byte) string {
	i := len(tail)
	ends := 0
	for ends < 2 && i > 0 {
		switch tail[i-1] {
		case '\n':
			i--
			if i > 0 && tail[i-1] == '\r' {
				i--
			}
		case '\r':
			i--
		default:
			return endsToPad(ends, tail)
		}
		ends++
	}
	return endsToPad(ends, tail)
}

// endsToPad is sseEventEnd's answer for a tail with `ends` line ends.
func endsToPad(ends int, tail []byte) string {
	switch {
	case ends >= 2:
		return ""
	case ends == 1 && tail[len(tail)-1] == '\n':
		return "\n"
	}
	return "\n\n"
}

// announceTrailers declares the trailers an upstream announced in its
// Trailer header (the key set of resp.Trailer before the body is read), so
// that the client's response is framed to carry them: chunked in HTTP/1.1,
// so without a Content-Length (an HTTP/2 upstream may send both).
func announceTrailers(hdr http.Header, trailer http.Header) {
	delete(hdr, "Content-Length")
	names := make([]string, 0, len(trailer))
	for name := range trailer {
		names = append(names, name)
	}
	hdr["Trailer"] = []string{strings.Join(names, ", ")}
}

// forwardTrailers passes the upstream's trailers on once its body has
// ended, announced or not (HTTP/2 trailers need no announcement): under
// http.TrailerPrefix, which net/http sends as trailers and never as headers.
func forwardTrailers(w http.ResponseWriter, trailer http.Header) {
	hdr := w.Header()
	for name, values := range trailer {
		hdr[http.TrailerPrefix+name] = append([]string(nil), values...)
	}
}
