package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

type eventKind int

// Explicit values: Yaegi v0.16.1 compares a typed `iota + 1` constant
// unequal to a variable holding the same value.
const (
	evReady      eventKind = 1 // an attempt has its first output event
	evFailed     eventKind = 2 // an attempt ended without one
	evHedgeTimer eventKind = 3 // the hedge delay passed
	evClientGone eventKind = 4 // the client's context ended
	evDeadline   eventKind = 5 // the shared deadline passed
)

// event is the only way anything reaches a race loop. Attempts, timers and
// context callbacks post to one buffered channel that the loop reads with
// plain receives: no select (Yaegi v0.16.1's select returns other
// invocations' values under concurrency). The buffer holds every event a race
// can ever be sent (one per attempt, one per armed timer, client gone,
// deadline), so no sender ever blocks, even after the loop has returned.
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
	clientCtx context.Context
	ctx       context.Context // parent of every attempt
	cancel    context.CancelFunc
	timedOut  int32 // atomic: the deadline callback fired

	limit       int    // attempts allowed
	limitReason string // denial reason when a hedge hits limit
	passthrough bool   // single unhedged attempt: any response wins on headers
	delay       time.Duration
	deadline    time.Time

	attempts   []*attempt
	used       []int
	inFlight   int
	timer      Timer
	timerSeq   int
	heldFatal  *attempt
	winner     *attempt
	commitAt   time.Time
	stopReason string // OutcomeClientGone or OutcomeTimeout
}

func (h *Hedger) newRace(p *preparedRequest, rep *Report, start time.Time) *race {
	rc := &race{h: h, p: p, rep: rep, start: start, clientCtx: p.orig.Context(), limit: h.cfg.MaxAttempts,
		used: make([]int, len(h.cfg.Upstreams))}
	rc.events = make(chan event, 2*h.cfg.MaxAttempts+4)
	ctx, cancel := context.WithCancel(rc.clientCtx)
	rc.ctx = ctx
	rc.cancel = cancel
	if !p.hedgeable {
		rc.limit = 1
		rc.passthrough = true
	} else if p.stateful && !p.clientKey {
		rc.limit = 1
		rc.limitReason = DenyNotIdempotent
	}
	rep.Hedged = p.hedgeable
	return rc
}

// run drives the race to a winner or a final failure, writes the answer, and
// waits for every attempt goroutine to end before it returns.
func (rc *race) run(w http.ResponseWriter) error {
	h := rc.h
	defer rc.cancel()
	stopClient := context.AfterFunc(rc.clientCtx, func() { rc.events <- event{kind: evClientGone} })
	defer stopClient()
	if h.cfg.Timeout > 0 {
		rc.deadline = rc.start.Add(h.cfg.Timeout)
	}
	if d, ok := rc.clientCtx.Deadline(); ok && (rc.deadline.IsZero() || d.Before(rc.deadline)) {
		rc.deadline = d
	}
	if !rc.deadline.IsZero() {
		t := h.opts.Clock.AfterFunc(rc.deadline.Sub(rc.start), func() {
			atomic.StoreInt32(&rc.timedOut, 1)
			rc.cancel()
			rc.events <- event{kind: evDeadline}
		})
		defer t.Stop()
	}
	// Attempt 0 goes out even when every upstream is unavailable.
	first, _ := h.pickUpstream(nil, rc.start)
	rc.delay = h.state.delay(&h.cfg, first)
	rc.rep.Delay = rc.delay
	role := RolePrimary
	if rc.passthrough {
		role = RoleSingle
	}
	rc.launch(role, first)
	rc.loop()
	if rc.timer != nil {
		rc.timer.Stop()
	}
	var err error
	switch {
	case rc.winner != nil:
		err = rc.deliver(w)
	case rc.stopReason == OutcomeClientGone:
		rc.rep.Outcome = OutcomeClientGone
		rc.rep.Status = 499
	case rc.stopReason == OutcomeTimeout:
		rc.rep.Outcome = OutcomeTimeout
		rc.rep.Status = http.StatusGatewayTimeout
		writeJSONError(w, http.StatusGatewayTimeout, "upstream_timeout", "no upstream answered before the deadline")
	default:
		rc.failAll(w)
	}
	rc.cancel()
	rc.drain()
	rc.finishReport()
	return err
}

// loop reads events until a winner, a final failure, or a stop.
func (rc *race) loop() {
	for {
		ev := <-rc.events
		switch ev.kind {
		case evHedgeTimer:
			if ev.seq == rc.timerSeq && rc.heldFatal == nil {
				rc.tryLaunch(RoleHedge)
			}
		case evReady:
			rc.settle(ev.attempt)
			rc.winner = ev.attempt
			return
		case evFailed:
			a := ev.attempt
			rc.settle(a)
			if rc.stopped() {
				return
			}
			rc.noteFailure(a)
			if a.fatal {
				if rc.inFlight == 0 {
					return
				}
				rc.heldFatal = a
				continue
			}
			if a.retryable && rc.heldFatal == nil {
				role := RoleHedge
				if rc.inFlight == 0 {
					role = RoleRetry
				}
				rc.tryLaunch(role)
			}
			if rc.inFlight == 0 {
				return
			}
		case evClientGone, evDeadline:
			if rc.stopped() {
				return
			}
		}
	}
}

// stopped reports (and records) whether the client left or the deadline passed.
func (rc *race) stopped() bool {
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
func (rc *race) settle(a *attempt) {
	rc.inFlight--
	if a.role == RoleHedge {
		atomic.AddInt64(&rc.h.state.hedgesInFlight, -1)
	}
}

// tryLaunch starts another attempt if the limits, budgets and health allow,
// and records why not otherwise. Hedges (extra load while another attempt
// runs) pay from the budget; a retry after the only attempt failed does not.
func (rc *race) tryLaunch(role string) bool {
	h, st := rc.h, rc.h.state
	now := h.opts.Clock.Now()
	deny := func(reason string) bool {
		rc.rep.Denials = append(rc.rep.Denials, reason)
		return false
	}
	if len(rc.attempts) >= rc.limit {
		if rc.limitReason != "" {
			return deny(rc.limitReason)
		}
		return deny(DenyMaxAttempts)
	}
	minLeft := h.cfg.MinTimeLeft
	if minLeft == 0 {
		minLeft = rc.delay
	}
	if !rc.deadline.IsZero() && rc.deadline.Sub(now) < minLeft {
		return deny(DenyDeadline)
	}
	extra := role == RoleHedge
	if extra && st.overload.tooHigh(h.cfg.Budget.OverloadRate) {
		return deny(DenyOverload)
	}
	if extra && h.cfg.Budget.MaxConcurrentHedges >= 0 &&
		atomic.LoadInt64(&st.hedgesInFlight) >= int64(h.cfg.Budget.MaxConcurrentHedges) {
		return deny(DenyConcurrency)
	}
	up, available := h.pickUpstream(rc.used, now)
	if !available {
		return deny(DenyNoUpstream)
	}
	if extra && h.cfg.Budget.TenantTokensPerMinute > 0 && rc.p.tenant != "" &&
		!st.tenants.take(rc.p.tenant, promptTokens(rc.p), now) {
		return deny(DenyTenant)
	}
	if extra && !st.bucket.take() {
		return deny(DenyBudget)
	}
	rc.launch(role, up)
	return true
}

// launch starts attempt len(rc.attempts) on upstream up and re-arms the
// hedge timer for the next one.
func (rc *race) launch(role string, up int) {
	h := rc.h
	a := &attempt{index: len(rc.attempts), upstream: up, role: role, started: h.opts.Clock.Now()}
	actx, acancel := context.WithCancel(rc.ctx)
	a.ctx = actx
	a.cancel = acancel
	rc.attempts = append(rc.attempts, a)
	rc.used[up]++
	rc.inFlight++
	if role == RoleHedge {
		atomic.AddInt64(&h.state.hedgesInFlight, 1)
	}
	if role != RolePrimary && role != RoleSingle {
		rc.rep.HedgesStarted++
	}
	go h.run(a, rc.p, rc.events, rc.passthrough)
	if rc.timer != nil {
		rc.timer.Stop()
	}
	rc.timerSeq++
	if rc.p.hedgeable && len(rc.attempts) < h.cfg.MaxAttempts {
		seq := rc.timerSeq
		events := rc.events
		rc.timer = h.opts.Clock.AfterFunc(rc.delay, func() { events <- event{kind: evHedgeTimer, seq: seq} })
	}
}

// noteFailure feeds a failed attempt into upstream health and overload.
func (rc *race) noteFailure(a *attempt) {
	a.result = ResultFailed
	h, st := rc.h, rc.h.state
	now := h.opts.Clock.Now()
	if a.status != 0 {
		st.overload.record(a.status)
	}
	if a.fatal {
		return
	}
	retryAfter := ""
	if a.resp != nil {
		retryAfter = a.resp.Header.Get("Retry-After")
	}
	st.health[a.upstream].record(now, false, coolDownFor(a.status, retryAfter, now, &h.cfg.Budget), &h.cfg.Budget)
}

// drain cancels every attempt and waits for each goroutine's terminal event,
// closing the bodies of late winners. After it no goroutine of this request
// is left.
func (rc *race) drain() {
	for _, a := range rc.attempts {
		if a != rc.winner {
			a.cancel()
		}
	}
	for rc.inFlight > 0 {
		ev := <-rc.events
		if ev.attempt == nil {
			continue
		}
		rc.settle(ev.attempt)
		a := ev.attempt
		if ev.kind == evReady && a.resp != nil {
			a.resp.Body.Close()
		}
		if a.result == "" {
			if rc.winner != nil {
				a.result = ResultLost
			} else {
				a.result = ResultCancelled
			}
		}
	}
	if rc.winner != nil && rc.winner.resp != nil {
		rc.winner.resp.Body.Close()
	}
	for _, a := range rc.attempts {
		a.cancel()
		if a.result == "" {
			a.result = ResultCancelled
		}
		if a.result == ResultLost && !rc.commitAt.IsZero() {
			if a.endedAt.After(rc.commitAt) {
				a.cancelLatency = a.endedAt.Sub(rc.commitAt)
			}
		}
	}
}

// finishReport fills the attempt list, TTFT and the wasted-token estimate,
// and feeds the TTFT estimators.
func (rc *race) finishReport() {
	h, st := rc.h, rc.h.state
	rep := rc.rep
	tokens := promptTokens(rc.p)
	for _, a := range rc.attempts {
		ar := AttemptReport{Index: a.index, Upstream: h.cfg.Upstreams[a.upstream].Name, Role: a.role,
			Result: a.result, Status: a.status, Started: a.started.Sub(rc.start), CancelLatency: a.cancelLatency}
		if a.result == ResultFailed {
			ar.Error = a.reason
		}
		if !a.firstAt.IsZero() && a == rc.winner {
			ar.TTFT = a.firstAt.Sub(a.started)
		}
		if a != rc.winner {
			rep.WastedPromptTokens += tokens
		}
		rep.Attempts = append(rep.Attempts, ar)
	}
	if rc.winner != nil {
		w := rc.winner
		rep.Winner = w.index
		rep.TTFT = w.firstAt.Sub(rc.start)
		if !rc.passthrough {
			st.estimators[w.upstream].Add(w.firstAt.Sub(w.started))
		}
		// A primary that lost had no output for at least this long: a
		// lower bound, and above the delay, so it keeps the quantile honest
		// instead of leaving the slow tail out of the window.
		if p := rc.attempts[0]; p != w && p.result == ResultLost && !rc.passthrough {
			st.estimators[p.upstream].Add(rc.commitAt.Sub(p.started))
		}
	}
	rep.Total = h.opts.Clock.Now().Sub(rc.start)
}

// promptTokens estimates a request's prompt tokens from its body (4 bytes a token).
func promptTokens(p *preparedRequest) int64 { return int64(len(p.body)) / 4 }

// failAll answers the client when no attempt won: a held fatal error, else
// the most useful upstream error, else 502.
func (rc *race) failAll(w http.ResponseWriter) {
	best := rc.heldFatal
	for _, a := range rc.attempts {
		if a.result == ResultFailed && (best == nil || errorRank(a) > errorRank(best)) {
			best = a
		}
	}
	rep := rc.rep
	rep.Outcome = OutcomeUpstreamError
	switch {
	case best != nil && best.fatal:
		rep.Outcome = OutcomeFatal
		fallthrough
	case best != nil && best.resp != nil && best.status != 0 && (best.status < 200 || best.status > 299):
		rep.Status = best.status
		hdr := w.Header()
		copyHeader(hdr, best.resp.Header)
		removeHopHeaders(hdr)
		hdr.Del("Content-Length")
		if len(best.errBody) == 0 {
			writeJSONError(w, best.status, "upstream_error", best.reason)
			return
		}
		w.WriteHeader(best.status)
		w.Write(best.errBody)
	default:
		msg := "no upstream could be reached"
		if best != nil && best.reason != "" {
			msg = best.reason
		}
		rep.Status = http.StatusBadGateway
		writeJSONError(w, http.StatusBadGateway, "upstream_failed", msg)
	}
}

// errorRank orders failures by how useful they are to the client.
func errorRank(a *attempt) int {
	switch {
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
func (rc *race) deliver(w http.ResponseWriter) error {
	h, a := rc.h, rc.winner
	rc.commitAt = h.opts.Clock.Now()
	rc.rep.CommitAt = rc.commitAt
	// Losers are cancelled at once; their goroutines end on their own and
	// are collected by drain.
	for _, other := range rc.attempts {
		if other != a {
			other.cancel()
		}
	}
	a.result = ResultWon
	if !rc.passthrough {
		h.state.health[a.upstream].record(rc.commitAt, true, 0, &h.cfg.Budget)
		h.state.overload.record(a.status)
	}
	rep := rc.rep
	rep.Outcome = OutcomeOK
	rep.Status = a.status
	hdr := w.Header()
	copyHeader(hdr, a.resp.Header)
	removeHopHeaders(hdr)
	if a.streaming || !a.complete {
		hdr.Del("Content-Length")
	}
	if h.cfg.ReportHeader != "" {
		hdr.Set(h.cfg.ReportHeader, fmt.Sprintf("llmhedge;dur=%d;desc=\"attempts=%d winner=%d upstream=%s delay_ms=%d\"",
			a.firstAt.Sub(rc.start).Milliseconds(), len(rc.attempts), a.index, h.cfg.Upstreams[a.upstream].Name, rc.delay.Milliseconds()))
	}
	w.WriteHeader(a.status)
	if len(a.prefix) > 0 {
		if _, err := w.Write(a.prefix); err != nil {
			rep.Outcome = OutcomeClientGone
			return nil
		}
	}
	flush(w)
	if a.complete {
		return nil
	}
	buf := getBuffer()
	defer putBuffer(buf)
	// Every statement of this loop runs once per upstream read, and under
	// Yaegi each call and interface conversion costs microseconds: the flush
	// function is resolved once, locals replace field loads, and the tail is
	// appended inline and cut back only now and then.
	flushW := flusherFor(w)
	body := a.resp.Body
	keep := a.streaming // only a stream's tail is ever looked at
	var tail []byte
	if keep {
		tail = make([]byte, 0, tailCompactAt)
		tail = keepTail(tail, a.prefix)
	}
	for {
		n, err := body.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if _, werr := w.Write(chunk); werr != nil {
				rep.Outcome = OutcomeClientGone
				return nil
			}
			flushW()
			if keep {
				tail = append(tail, chunk...)
				if len(tail) > tailCompactAt {
					tail = keepTail(tail[:0], tail[len(tail)-tailSize:])
				}
			}
		}
		if err == nil {
			continue
		}
		if err == io.EOF || errors.Is(err, io.EOF) {
			return nil
		}
		if rc.clientCtx.Err() != nil && atomic.LoadInt32(&rc.timedOut) == 0 {
			// A client (e.g. the OpenAI SDK) may close as soon as it reads
			// the stream's end marker, before the upstream's EOF arrives:
			// that answer was delivered in full.
			if len(tail) > tailSize {
				tail = tail[len(tail)-tailSize:]
			}
			if !a.streaming || !streamFinished(tail) {
				rep.Outcome = OutcomeClientGone
			}
			return nil
		}
		rep.Outcome = OutcomeStreamFailed
		if atomic.LoadInt32(&rc.timedOut) == 1 {
			rep.Outcome = OutcomeTimeout
		}
		if h.cfg.StreamErrorEvent && a.streaming {
			writeStreamErrorEvent(w, "upstream stream failed: "+err.Error())
			flush(w)
			return nil
		}
		return ErrStreamAborted
	}
}
