package core

import (
	"net/http"
	"strconv"
	"time"
)

// What a client's own retry logic reads from an answer. Stainless-generated
// SDKs (OpenAI's and Anthropic's, in every language) obey x-should-retry
// before their own rules (retry 408, 409, 429, 5xx), and Retry-After /
// retry-after-ms for the wait. When the gateway has already tried what it
// was allowed to, a client retry only multiplies the load (an SDK's two
// retries make three calls, each with its own race): the answer says so.

// HeaderShouldRetry tells a client whether retrying can help.
const HeaderShouldRetry = "X-Should-Retry"

// bestFailure returns the failed attempt whose answer is the most useful
// to the client (see errorRank), the held fatal one when nothing ranks
// above it; nil when no attempt failed.
func bestFailure(rc *race) *attempt {
	best := rc.heldFatal
	for _, a := range rc.attempts {
		if (a.result == ResultFailed || a.result == ResultInvalid) && (best == nil || errorRank(a) > errorRank(best) || moreComplete(a, best)) {
			best = a
		}
	}
	return best
}

// exhausted reports whether the race ended having tried what it could:
// every failed attempt failed in a way another attempt could have fixed
// (so the gateway retried or hedged it, or was denied doing so by the
// budget, a breaker, max_attempts or the deadline). A client retry would
// run the same race again.
func exhausted(rc *race) bool {
	failed := false
	for _, a := range rc.attempts {
		if a.result != ResultFailed {
			continue
		}
		if !a.retryable || a.fatal {
			return false
		}
		failed = true
	}
	return failed
}

// setNoRetryHeaders marks an error answer of an exhausted race: no client
// retry, and when it is the upstreams that asked for a pause, the soonest
// Retry-After they gave (the answer's own, if it has one, is kept).
func setNoRetryHeaders(rc *race, hdr http.Header) {
	hdr.Set(HeaderShouldRetry, "false")
	if hdr.Get("Retry-After") != "" {
		return
	}
	if v := soonestRetryAfter(rc); v != "" {
		hdr.Set("Retry-After", v)
	}
}

// soonestRetryAfter returns the smallest Retry-After (in seconds) among
// the failed attempts' answers, "" when none gave one.
func soonestRetryAfter(rc *race) string {
	now := rc.h.now()
	best := time.Duration(-1)
	for _, a := range rc.attempts {
		if a.resp == nil || a.result != ResultFailed {
			continue
		}
		v := a.resp.Header.Get("Retry-After")
		if v == "" {
			continue
		}
		d := time.Duration(-1)
		if secs, err := strconv.Atoi(v); err == nil && secs >= 0 {
			d = time.Duration(secs) * time.Second
		} else if at, err := http.ParseTime(v); err == nil {
			d = at.Sub(now)
			if d < 0 {
				d = 0
			}
		}
		if d >= 0 && (best < 0 || d < best) {
			best = d
		}
	}
	if best < 0 {
		return ""
	}
	secs := int64((best + time.Second - 1) / time.Second)
	return strconv.FormatInt(secs, 10)
}

// setErrorReport adds the report header to an answer without a winner.
func setErrorReport(rc *race, hdr http.Header) {
	name := rc.h.cfg.ReportHeader
	if name == "" {
		return
	}
	hdr.Set(name, "llmhedge;desc=\"attempts="+strconv.Itoa(len(rc.attempts))+" winner=none outcome="+rc.rep.Outcome+
		" delay_ms="+strconv.FormatInt(rc.delay.Milliseconds(), 10)+"\"")
}

// setNoRaceReport adds the report header to an answer that ran no race:
// a replay of a stored answer, a follower of another request's race, a
// request refused before any upstream was tried.
func setNoRaceReport(h *Hedger, hdr http.Header, outcome string) {
	if h.cfg.ReportHeader == "" {
		return
	}
	hdr.Set(h.cfg.ReportHeader, "llmhedge;desc=\""+outcome+" attempts=0\"")
}

// errorAnswerHeaders adds the report and, for an exhausted race that is
// not answered with a complete 2xx, the no-retry headers.
func errorAnswerHeaders(rc *race, hdr http.Header, best *attempt) {
	setErrorReport(rc, hdr)
	if (best == nil || !best.answered) && exhausted(rc) {
		setNoRetryHeaders(rc, hdr)
	}
}

// clearNoRaceReport removes what setNoRaceReport set, for a fleet follower
// that got no answer and runs a race after all.
func clearNoRaceReport(h *Hedger, hdr http.Header) {
	if h.cfg.ReportHeader != "" {
		hdr.Del(h.cfg.ReportHeader)
	}
}
