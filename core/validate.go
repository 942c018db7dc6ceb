package core

import (
	"encoding/json"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/redact"
	"github.com/llmhedge/llmhedge/core/stream"
)

// Validity checks: with `validate` set an answer must pass them before it
// may win. A non-streaming answer is checked whole before commit; a
// streaming one is held (nothing reaches the client) until it is complete,
// at most max_prefix bytes, and then checked: the client's time to first
// token becomes the time to the whole answer. An invalid answer is a
// retryable failure: the next attempt starts at once, the upstream's breaker
// is not told (the upstream works, its answer did not fit), and when every
// attempt is invalid the client gets the most complete invalid answer,
// marked with HeaderValidation, or a 502 (validate_failure 502).

// HeaderValidate lets a client ask for checks on top of the route's
// (`X-LLM-Hedge-Validate: json_schema,finish`); it cannot remove any. It is
// never forwarded upstream.
const HeaderValidate = "X-LLM-Hedge-Validate"

// HeaderValidation marks an answer that failed validation
// (`X-LLM-Hedge-Validation: failed; check=json_schema`), sent when every
// attempt's answer was invalid.
const HeaderValidation = "X-LLM-Hedge-Validation"

// OutcomeInvalid: every attempt's answer failed validation.
const OutcomeInvalid = "invalid"

// ResultInvalid: an attempt's answer failed validation.
const ResultInvalid = "invalid"

// Report.Validation values.
const (
	ValidationPassed    = "passed"    // the winner's answer passed every check
	ValidationUnchecked = "unchecked" // the winner's answer outgrew max_prefix and went out unchecked
	ValidationFailed    = "failed"    // every answer was invalid
)

// codeUpstreamInvalid is the error code of validate_failure 502.
const codeUpstreamInvalid = "upstream_invalid_answer"

var (
	canonicalValidate   = http.CanonicalHeaderKey(HeaderValidate)
	canonicalValidation = http.CanonicalHeaderKey(HeaderValidation)
)

// validation is a route's validity configuration, parsed once at New.
type validation struct {
	checks  int         // the route's check bits
	schema  interface{} // validate_schema decoded, nil when none
	fail502 bool
}

// newValidation parses cfg's checks (Validate has accepted them).
func newValidation(cfg *config.Config) *validation {
	v := &validation{fail502: string(cfg.ValidateFailure) == config.ValidateFailure502}
	checks, _ := stream.CheckBits(cfg.ValidateChecks)
	v.checks = checks
	if cfg.ValidateSchema != "" {
		var schema interface{}
		if json.Unmarshal([]byte(cfg.ValidateSchema), &schema) == nil {
			v.schema = schema
		}
	}
	return v
}

// prepareValidation sets the request's checks (the route's and the
// client's header's) and the schema json_schema uses. It runs only for a
// hedged request: a single unhedged attempt is plain proxying.
func prepareValidation(h *Hedger, p *preparedRequest) error {
	checks := h.validation.checks
	if values := p.orig.Header[canonicalValidate]; len(values) > 0 {
		extra, err := stream.CheckBits(values)
		if err != nil {
			return &badRequest{http.StatusBadRequest, "invalid_validate_header", HeaderValidate + ": " + err.Error()}
		}
		checks |= extra
	}
	p.checks = checks
	if checks&stream.CheckJSONSchema != 0 {
		p.schema = stream.RequestSchema(p.body)
		if p.schema == nil {
			p.schema = h.validation.schema
		}
	}
	return nil
}

// validateAttempt checks an attempt that is ready to win, holding a
// streamed answer until it is complete. It returns the event to post.
func validateAttempt(h *Hedger, a *attempt, p *preparedRequest) eventKind {
	if !a.complete {
		if !a.streaming {
			a.unchecked = true // a non-streaming answer over max_prefix
			return evReady
		}
		// Set for good: the race loop asks only about attempts it has not
		// settled yet.
		atomic.StoreInt32(&a.holding, 1)
		if !holdStream(h, a, p) {
			return heldStreamFailed(a)
		}
		if !a.complete {
			a.unchecked = true // over max_prefix: delivered as it is, the rest streamed
			return evReady
		}
	}
	check, why := stream.FailedCheck(stream.AnswerOf(a.prefix, a.streaming, a.sse), p.checks, p.schema)
	if check == "" {
		return evReady
	}
	a.invalid = check
	a.reason = redactReason("invalid answer ("+check+"): "+why, reasonSecrets(h, p.orig))
	a.retryable = true
	a.code = codeUpstreamBadResponse
	a.errBody = redact.Body(append([]byte(nil), a.prefix...), h.secrets)
	return releaseHeld(a)
}

// holdStream reads the rest of a streamed answer into a.prefix until its
// end (a.complete) or until it outgrows max_prefix. It reports false when
// the stream broke, or ended inside an event, first.
func holdStream(h *Hedger, a *attempt, p *preparedRequest) bool {
	body := a.resp.Body
	limit := int(h.cfg.MaxPrefix)
	buf := a.prefix
	for len(buf) <= limit {
		if len(buf) == cap(buf) {
			buf = grow(buf)
		}
		end := len(buf)
		n, err := body.Read(buf[end:cap(buf)])
		buf = buf[:end+n]
		a.prefix = buf
		if err == io.EOF {
			if a.sse && stream.EndsMidLine(buf) && !stream.Finished(buf[len(buf)-tailOf(buf):]) {
				a.reason = "upstream ended its stream inside an event while held for validation"
				return false
			}
			a.complete = true
			return true
		}
		if err != nil {
			a.reason = "cancelled"
			if a.ctx.Err() == nil {
				a.reason = "upstream stream broke while held for validation: " + redact.Text(err.Error(), reasonSecrets(h, p.orig))
			}
			return false
		}
	}
	return true
}

// tailOf is how many of b's last bytes Finished looks at.
func tailOf(b []byte) int {
	if len(b) < tailSize {
		return len(b)
	}
	return tailSize
}

// heldStreamFailed ends an attempt whose held stream broke: a retryable
// failure of the upstream, before anything reached the client.
func heldStreamFailed(a *attempt) eventKind {
	a.retryable = true
	a.code = codeUpstreamBadResponse
	return releaseHeld(a)
}

// releaseHeld closes an attempt's body and frees its prefix; a.resp stays
// for its headers.
func releaseHeld(a *attempt) eventKind {
	a.resp.Body.Close()
	putBuffer(a.prefix)
	a.prefix = nil
	return evFailed
}

// holdingOutput reports whether an attempt in flight has output that is
// being held for validation: the hedge delay (a wait for a first token) is
// then over, and an invalid answer starts the next attempt at once.
func holdingOutput(rc *race) bool {
	for _, a := range rc.attempts {
		if a.result == "" && atomic.LoadInt32(&a.holding) == 1 {
			return true
		}
	}
	return false
}

// failedResult is the result of a failed attempt: invalid, or failed.
func failedResult(a *attempt) string {
	if a.invalid != "" {
		return ResultInvalid
	}
	return ResultFailed
}

// moreComplete reports whether invalid answer a is more complete than the
// best so far: finished normally where best did not, else longer.
func moreComplete(a, best *attempt) bool {
	if a.invalid == "" || best == nil || best.invalid == "" {
		return false
	}
	if (a.invalid == config.ValidateFinish) != (best.invalid == config.ValidateFinish) {
		return best.invalid == config.ValidateFinish
	}
	return len(a.errBody) > len(best.errBody)
}

// answerInvalid answers the client when every attempt's answer was
// invalid: the most complete of them, marked, or a 502.
func answerInvalid(rc *race, w http.ResponseWriter, best *attempt) {
	rep := rc.rep
	rep.Outcome = OutcomeInvalid
	rep.Validation = ValidationFailed
	hdr := w.Header()
	mark := "failed; check=" + best.invalid
	if rc.h.validation.fail502 {
		rep.Status = http.StatusBadGateway
		hdr.Set(HeaderValidation, mark)
		writeJSONError(w, http.StatusBadGateway, errTypeUpstream, codeUpstreamInvalid,
			"no upstream's answer passed validation ("+best.invalid+")")
		return
	}
	rep.Status = best.status
	copyHeader(hdr, best.resp.Header)
	removeHopHeaders(hdr)
	hdr.Del("Content-Length")
	hdr.Set(HeaderValidation, mark)
	setErrorReport(rc, hdr)
	w.WriteHeader(best.status)
	w.Write(best.errBody)
}

// earlyInvalid is answerInvalid for a race whose headers went out early
// (a held answer takes long): the mark can no longer be a header. A client
// that accepts trailers (TE: trailers) gets the most complete invalid
// stream with the mark as a trailer; any other, and validate_failure 502,
// an error event (code upstream_invalid_answer) in the API's format, so
// that no client takes an unmarked invalid answer for a good one.
func earlyInvalid(rc *race, w http.ResponseWriter, best *attempt) {
	rep := rc.rep
	rep.Outcome = OutcomeInvalid
	rep.Validation = ValidationFailed
	if !rc.h.validation.fail502 && rc.early.trailers && best.sse {
		w.Header()[http.TrailerPrefix+canonicalValidation] = []string{"failed; check=" + best.invalid}
		w.Write(best.errBody)
		flush(w)
		return
	}
	writeEarlyError(rc, w, nil, codeUpstreamInvalid, "no upstream's answer passed validation ("+best.invalid+")")
}

// noteValidation completes the report of a validated winner: whether its
// answer was checked, and the client's time to first byte, which for a
// held stream is the commit (the estimators keep the upstream's own TTFT).
func noteValidation(rc *race) {
	w := rc.winner
	if w == nil || rc.p.checks == 0 || rc.passthrough {
		return
	}
	rc.rep.Validation = ValidationPassed
	if w.unchecked {
		rc.rep.Validation = ValidationUnchecked
	}
	if w.streaming {
		rc.rep.TTFT = rc.commitAt.Sub(rc.start)
	}
}
