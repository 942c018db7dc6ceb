package core

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// evKeepAlive: the grace time (then each keep-alive interval) passed with
// the streaming race still undecided.
const evKeepAlive eventKind = 6

// keepAliveComment is the SSE comment sent while the race runs: every SSE
// parser skips it (a line starting with ':'), the blank line ends it.
var keepAliveComment = []byte(": keep-alive\n\n")

// earlyHeaders is the state of a streaming race that may answer its
// headers before it has a winner. Only the race's goroutine uses it. Most
// races are decided before the grace time: what only an answer sent early
// needs is read when the headers go out (sendEarlyHeaders), not per race.
type earlyHeaders struct {
	w     http.ResponseWriter
	fire  func()      // posts evKeepAlive; created once per race (Yaegi: no literal per re-arm)
	sys   *time.Timer // the system clock's timer: stopped by a compiled call, not through Timer
	timer Timer       // an injected clock's timer
	sent  bool        // the status and headers are out
	// Set when the headers go out:
	anthropic bool // errors go out as Anthropic's `event: error`
	trailers  bool // the client accepts trailers (TE: trailers)
}

// startEarlyHeaders arms the grace timer of a race that may send early
// headers: the route has them on, the client asked for a stream
// ("stream": true, runRace's test) of an API whose streams are SSE (OpenAI
// Chat, Completions and Responses, Anthropic Messages), and the request is
// raced (pass-through answers go out as they come anyway). The test and
// the first arming are one function: under Yaegi each call allocates the
// callee's whole frame.
func startEarlyHeaders(rc *race, w http.ResponseWriter) {
	h := rc.h
	if h.earlyHeaders == 0 || rc.passthrough {
		return
	}
	orig := rc.p.orig
	// The SSE APIs' paths (OpenAI Chat and Completions, Responses,
	// Anthropic Messages).
	path := strings.TrimRight(orig.URL.Path, "/")
	if !strings.HasSuffix(path, "/completions") && !strings.HasSuffix(path, "/responses") && !strings.HasSuffix(path, "/messages") ||
		orig.Context().Value(noEarlyHeadersKey) != nil {
		return
	}
	e := &earlyHeaders{w: w}
	events := rc.events
	e.fire = func() { events <- event{kind: evKeepAlive} }
	rc.early = e
	if h.systemClock {
		e.sys = time.AfterFunc(h.earlyHeaders, e.fire) // armKeepAlive's first, inline
		return
	}
	e.timer = clockAfterFunc(h, h.earlyHeaders, e.fire)
}

// noEarlyHeadersKey marks a request context in which early headers are
// off. A pointer to a compiled type: under Yaegi a key of an interpreted
// type would be converted to an interface on every lookup.
var noEarlyHeadersKey = new(earlyHeadersOff)

type earlyHeadersOff int

// WithoutEarlyHeaders returns r marked so that its race sends no early
// headers: for hosts that cannot send a response's headers before the
// whole answer (Envoy's ext_proc in a buffered body mode sends one
// ImmediateResponse), where early headers would only turn a failure's
// status into a 200.
func WithoutEarlyHeaders(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), noEarlyHeadersKey, true))
}

// armKeepAlive arms the timer of the next keep-alive (the first: the grace
// time). The system clock's timer is kept as it is: under Yaegi converting
// it to Timer, and calling Stop through that interface, cost a reflective
// method value each.
func armKeepAlive(rc *race, e *earlyHeaders) {
	h := rc.h
	if h.systemClock {
		e.sys = time.AfterFunc(h.earlyHeaders, e.fire)
		return
	}
	e.timer = clockAfterFunc(h, h.earlyHeaders, e.fire)
}

// stopEarlyHeaders stops the keep-alive timer of a race with early headers
// (rc.early set); an event it posts late is dropped by whoever reads the
// race's channel next (it names no attempt).
func stopEarlyHeaders(rc *race) {
	e := rc.early
	if e.sys != nil {
		e.sys.Stop()
	} else if e.timer != nil {
		e.timer.Stop()
	}
}

// earlySent reports whether rc's headers went out before its winner.
func earlySent(rc *race) bool { return rc.early != nil && rc.early.sent }

// keepAlive sends the early headers the first time, then a keep-alive
// comment, and re-arms the timer. A failed write is not acted on here: a
// client that left cancels every attempt, whose events end the race.
func keepAlive(rc *race) {
	e := rc.early
	if !e.sent {
		sendEarlyHeaders(rc, e)
	}
	e.w.Write(keepAliveComment)
	flush(e.w)
	armKeepAlive(rc, e)
}

// sendEarlyHeaders writes the status and the headers every attempt's
// answer would agree on: 200, an SSE content type, no caching. What only
// the winner knows (its other headers, the race report) can follow as
// trailers when the client accepts them.
func sendEarlyHeaders(rc *race, e *earlyHeaders) {
	e.sent = true
	orig := rc.p.orig
	e.anthropic = strings.HasSuffix(strings.TrimRight(orig.URL.Path, "/"), "/messages")
	e.trailers = acceptsTrailers(orig)
	rc.rep.EarlyHeaders = true
	hdr := e.w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no") // a buffering proxy in front must pass the keep-alives on
	hdr.Del("Content-Length")
	if rc.h.cfg.ReportHeader != "" {
		hdr.Set(rc.h.cfg.ReportHeader, "llmhedge;desc=\"early_headers attempts="+strconv.Itoa(len(rc.attempts))+
			" delay_ms="+strconv.FormatInt(rc.delay.Milliseconds(), 10)+"\"")
	}
	e.w.WriteHeader(http.StatusOK)
}

// acceptsTrailers reports whether the client sent TE: trailers.
func acceptsTrailers(r *http.Request) bool {
	for _, v := range r.Header.Values("Te") {
		for _, part := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(strings.SplitN(part, ";", 2)[0]), "trailers") {
				return true
			}
		}
	}
	return false
}

// lateWinner starts the winner's delivery after early headers: its status
// and headers cannot be sent any more. It reports whether the winner's
// body may follow: an SSE answer; anything else (an upstream that
// answered JSON to a stream request) cannot follow an SSE preamble, and
// the client gets an error event instead.
func lateWinner(rc *race, a *attempt, w http.ResponseWriter) bool {
	if !a.sse {
		rc.rep.Outcome = OutcomeUpstreamError
		writeEarlyError(rc, w, nil, codeUpstreamBadResponse, rc.h.publicNames[a.upstream]+" answered a stream request without a stream")
		return false
	}
	if rc.early.trailers {
		offerWinnerTrailers(rc, a, w.Header())
	}
	return true
}

// notTrailers are the winner's headers that make no sense as trailers:
// framing, content, caching, cookies and the hop-by-hop ones.
var notTrailers = map[string]bool{"Content-Type": true, "Content-Length": true, "Content-Encoding": true,
	"Cache-Control": true, "Set-Cookie": true, "Date": true, "Trailer": true, "Transfer-Encoding": true,
	"Connection": true, "Keep-Alive": true, "Vary": true}

// offerWinnerTrailers sets the winner's remaining headers and the race
// report as trailers (under http.TrailerPrefix: sent after the body).
func offerWinnerTrailers(rc *race, a *attempt, hdr http.Header) {
	for name, values := range a.resp.Header {
		if notTrailers[name] {
			continue
		}
		hdr[http.TrailerPrefix+name] = append([]string(nil), values...)
	}
	if rc.h.cfg.ReportHeader != "" {
		tmp := make(http.Header)
		setReportHeader(rc, a, tmp)
		hdr[http.TrailerPrefix+http.CanonicalHeaderKey(rc.h.cfg.ReportHeader)] = tmp[http.CanonicalHeaderKey(rc.h.cfg.ReportHeader)]
	}
}

// earlyFailure answers a race that ended without a winner after its
// headers went out: the status is gone, so the failure is an error event
// in the API's own format, which the SDKs raise as an error (never a
// clean end the client would take for an empty answer).
func earlyFailure(rc *race, w http.ResponseWriter) {
	rep := rc.rep
	rep.Status = http.StatusOK
	if rc.stopReason == OutcomeTimeout {
		rep.Outcome = OutcomeTimeout
		writeEarlyError(rc, w, nil, codeUpstreamTimeout, "no upstream answered before the deadline")
		return
	}
	best := bestFailure(rc)
	if best != nil && best.invalid != "" {
		earlyInvalid(rc, w, best)
		return
	}
	rep.Outcome = OutcomeUpstreamError
	if best != nil && best.fatal {
		rep.Outcome = OutcomeFatal
	}
	if best != nil && best.answered && best.sse {
		// A complete stream without output: what the client would have
		// got without early headers, and it ends as that stream ends.
		w.Write(best.errBody)
		flush(w)
		return
	}
	code := codeUpstreamUnreachable
	msg := "no upstream could be reached"
	var upstreamBody []byte
	if best != nil {
		code = best.code
		msg = upstreamMessage(rc.h, best)
		upstreamBody = best.errBody
	}
	writeEarlyError(rc, w, upstreamBody, code, msg)
}

// writeEarlyError writes an error event: the upstream's own JSON error
// (redacted already) when it has an "error" object, else ours. OpenAI's
// SDKs raise a `data:` line whose JSON has an "error" member; Anthropic's
// raise `event: error`.
func writeEarlyError(rc *race, w http.ResponseWriter, upstreamBody []byte, code, msg string) {
	payload := errorEventPayload(upstreamBody)
	if payload == nil && rc.early.anthropic {
		payload, _ = json.Marshal(anthropicError{Type: "error", Error: anthropicErrorDetail{Type: "api_error", Message: msg}})
	} else if payload == nil {
		payload, _ = json.Marshal(errorBody{Error: errorDetail{Message: msg, Type: errTypeUpstream, Code: code}})
	}
	var out []byte
	if rc.early.anthropic {
		out = append(out, "event: error\n"...)
	}
	out = append(out, "data: "...)
	out = append(out, payload...)
	out = append(out, "\n\n"...)
	w.Write(out)
	flush(w)
}

// anthropicError is the shape of Anthropic's error event.
type anthropicError struct {
	Type  string               `json:"type"`
	Error anthropicErrorDetail `json:"error"`
}

type anthropicErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// errorEventPayload returns body on one line when it is a JSON object
// with an "error" member, else nil.
func errorEventPayload(body []byte) []byte {
	if len(body) == 0 || !json.Valid(body) {
		return nil
	}
	var probe errorProbe
	if json.Unmarshal(body, &probe) != nil || len(probe.Error) == 0 || string(probe.Error) == "null" {
		return nil
	}
	var line bytes.Buffer
	if json.Compact(&line, body) != nil {
		return nil
	}
	return line.Bytes()
}

// errorProbe and streamProbe read one member of a JSON object (named
// types: plain to Yaegi, which interprets the core).
type errorProbe struct {
	Error json.RawMessage `json:"error"`
}

// streamProbe reads "stream": a body that plainJSON passed (at most one
// "stream" key, in lowercase, unescaped) asks for a stream at its top
// level when its decoding into a streamProbe finds "stream": true
// (prepare). The standard library's decoding (compiled under Yaegi too)
// checks the whole body as json.Valid does first, and fails with a
// *json.SyntaxError exactly when it is not valid: one pass over the body,
// where json.Valid and a decoding would be two.
type streamProbe struct {
	Stream json.RawMessage `json:"stream"`
}
