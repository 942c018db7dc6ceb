package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/llmhedge/llmhedge/core/redact"
	"github.com/llmhedge/llmhedge/core/stream"
)

// attempt is one upstream request of a race. Its goroutine owns it until it
// posts its one terminal event (ready or failed); after that the race loop
// owns it, including resp.Body.
type attempt struct {
	index    int
	upstream int
	role     string
	ctx      context.Context
	cancel   context.CancelFunc
	started  time.Time
	probe    uint64 // the breaker's probe ticket (see admit), 0: an ordinary attempt
	// routeSample is the number of this attempt's sample in its
	// upstream's routing estimate, 0 when it has none yet (see routeWaiting).
	routeSample uint64

	// Set by the goroutine before it posts.
	resp      *http.Response
	prefix    []byte // every byte read before the decision
	complete  bool   // prefix is the whole body
	streaming bool
	firstAt   time.Time
	endedAt   time.Time
	status    int
	errBody   []byte
	reason    string
	retryable bool
	fatal     bool
	connErr   bool // no response at all (connect error, reset before headers)
	// code is the stable error code the client gets if this failure is the
	// one answered (codeUpstream*); reason, redacted, goes to the report.
	code string
	// answered: a complete 2xx answer without output or a final event (it
	// ended, or sent [DONE]); it lost the race, but if every attempt fails
	// it is the client's best answer (errBody holds it).
	answered bool
	sse      bool // the answer is text/event-stream
	// Validity checks (validate.go): invalid names the check the answer
	// failed; unchecked, it outgrew max_prefix before it could be checked;
	// holding (atomic, read by the race loop) is 1 once a streamed answer
	// with output is being held until complete.
	invalid   string
	unchecked bool
	holding   int32

	result        string
	cancelLatency time.Duration

	// Traced requests only: the trace headers the attempt sends (see
	// Trace.Attempt).
	traceparent string
	tracestate  string
}

// Error codes of the answers the engine writes itself when no attempt won,
// all with type "upstream_error" (errTypeUpstream).
const (
	codeUpstreamUnreachable = "upstream_unreachable"  // no response: connect, DNS, TLS, reset before headers
	codeUpstreamTimeout     = "upstream_timeout"      // the deadline passed, or the transport timed out
	codeUpstreamBadResponse = "upstream_bad_response" // 2xx without output: invalid JSON, stream ended or broke first
	codeUpstreamError       = "upstream_error"        // an error status with an empty body
)

// errorBodyLimit bounds the upstream error body kept for the client.
const errorBodyLimit = 64 << 10

// FatalStatus reports whether an upstream status is a client error that no
// other upstream would answer better: it goes to the client at once and
// starts nothing more.
func FatalStatus(status int) bool {
	switch status {
	case 400, 401, 403, 404, 413, 422:
		return true
	}
	return false
}

// retryableStatus may succeed on another attempt.
func retryableStatus(status int) bool {
	return status == 408 || status == 429 || status >= 500
}

// runAttempt sends the attempt and reads until its first output event
// (ready) or a failure, then posts exactly one event.
func runAttempt(h *Hedger, a *attempt, p *preparedRequest, events chan<- event, passthrough bool) {
	kind := sendAttempt(h, a, p, passthrough)
	a.endedAt = h.now()
	events <- event{kind: kind, attempt: a}
}

// sendAttempt does runAttempt's work and returns the event kind to post.
func sendAttempt(h *Hedger, a *attempt, p *preparedRequest, passthrough bool) eventKind {
	req, err := attemptRequest(h, a.ctx, p, a.upstream, a.index)
	if err != nil {
		return notBuilt(h, a, p, err)
	}
	if a.traceparent != "" {
		setTraceHeaders(req.Header, a)
	}
	resp, err := h.transport.RoundTrip(req)
	if err != nil {
		transportFailed(h, a, p, err)
		return evFailed
	}
	a.status = resp.StatusCode
	if passthrough {
		return passedThrough(h, a, resp)
	}
	if a.status/100 != 2 { // not 2xx, in fewer frame slots under Yaegi
		keepErrorAnswer(h, a, resp)
		return evFailed
	}
	// The two common Content-Types without stream.FormatOf's call: under
	// Yaegi a call allocates the callee's whole frame.
	var ready bool
	if ct := resp.Header.Get("Content-Type"); ct == "text/event-stream" {
		a.streaming = true
		a.sse = true
		ready = readUntilFirstEvent(h, a, p, resp, stream.FormatSSE)
	} else if ct == "application/json" {
		ready = readWhole(h, a, p, resp, true)
	} else {
		ready = readByFormat(h, a, p, resp, ct)
	}
	if ready {
		a.resp = resp
		if p.checks != 0 {
			return validateAttempt(h, a, p)
		}
		return evReady // a.prefix goes back to the pool once delivered
	}
	return lostRace(h, a, resp)
}

// readByFormat reads resp, of Content-Type ct, as a stream or a whole
// answer, whichever ct says. It reports whether the attempt is ready to
// win.
func readByFormat(h *Hedger, a *attempt, p *preparedRequest, resp *http.Response, ct string) bool {
	format, streaming := stream.FormatOf(ct)
	a.streaming = streaming
	a.sse = format == stream.FormatSSE
	if streaming {
		return readUntilFirstEvent(h, a, p, resp, format)
	}
	return readWhole(h, a, p, resp, ct != "" && looksJSON(ct))
}

// notBuilt records an attempt whose request could not be built. (The rare
// branches of sendAttempt are functions of their own: under Yaegi a call
// allocates every slot of its frame, taken branch or not.)
func notBuilt(h *Hedger, a *attempt, p *preparedRequest, err error) eventKind {
	a.reason = "building the upstream request: " + redact.Text(err.Error(), reasonSecrets(h, p.orig))
	a.code = codeUpstreamUnreachable
	a.connErr = true
	return evFailed
}

// passedThrough readies an unhedged attempt: a plain proxy, whose answer,
// whatever it is, goes to the client as it comes.
func passedThrough(h *Hedger, a *attempt, resp *http.Response) eventKind {
	a.resp = resp
	a.firstAt = h.now()
	return evReady
}

// lostRace ends a 2xx attempt that failed before its first output event.
// A complete answer without output is kept (bounded like an error body,
// redacted like one) for the client in case no attempt wins.
func lostRace(h *Hedger, a *attempt, resp *http.Response) eventKind {
	if (a.reason == stream.ReasonEnded || a.reason == stream.ReasonDone) && len(a.prefix) <= errorBodyLimit && !cutMidLine(a) {
		a.errBody = redact.Body(append([]byte(nil), a.prefix...), h.secrets)
		a.answered = true
		a.resp = resp
	}
	putBuffer(a.prefix)
	a.prefix = nil
	resp.Body.Close()
	a.retryable = true
	a.code = codeUpstreamBadResponse
	return evFailed
}

// cutMidLine: an SSE answer that ended inside a line is broken, not an
// empty answer (see core/stream, complete.go), unless its end marker is there.
func cutMidLine(a *attempt) bool {
	return a.sse && stream.EndsMidLine(a.prefix) && !stream.Finished(a.prefix)
}

// transportFailed records an attempt that got no response. The transport's
// error names the URL (the client's query included), addresses and the
// resolver: the report gets it redacted, the client only a code.
func transportFailed(h *Hedger, a *attempt, p *preparedRequest, err error) {
	if a.ctx.Err() != nil {
		// Cancelled (a loser, the deadline, the client gone): no report
		// shows this reason, and a loser's is the common case.
		a.reason = "cancelled"
	} else {
		a.reason = "upstream request failed: " + redact.Text(err.Error(), reasonSecrets(h, p.orig))
	}
	a.code = codeUpstreamUnreachable
	if isTimeout(err) {
		a.code = codeUpstreamTimeout
	}
	a.connErr = true
	a.retryable = true
}

// isTimeout reports whether err, or an error it wraps, is a timeout. By
// type assertion to the compiled net.Error: Yaegi-safe, unlike errors.As.
func isTimeout(err error) bool {
	for err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return true
		}
		err = errors.Unwrap(err)
	}
	return false
}

// keepErrorAnswer records a non-2xx answer, its body bounded, for the
// client in case no attempt wins. The body may quote the key the gateway
// sent (`Incorrect API key provided: sk-…`): configured secrets are
// redacted from it.
func keepErrorAnswer(h *Hedger, a *attempt, resp *http.Response) {
	errBody, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyLimit))
	a.errBody = redact.Body(errBody, h.secrets)
	resp.Body.Close()
	a.resp = resp
	a.reason = fmt.Sprintf("upstream answered %d", resp.StatusCode)
	a.code = codeUpstreamError
	a.fatal = FatalStatus(resp.StatusCode)
	a.retryable = retryableStatus(resp.StatusCode)
}

// readUntilFirstEvent reads a streamed resp of the given format until its
// first output event (a stream.Detector decides), keeping every byte in
// a.prefix, a pooled buffer read into directly. It reports whether the
// attempt is ready to win. (Streams and whole answers are read by two
// functions: under Yaegi each call allocates every slot of its frame, so
// neither carries the other's.)
func readUntilFirstEvent(h *Hedger, a *attempt, p *preparedRequest, resp *http.Response, format stream.Format) bool {
	det := stream.NewDetector(format, h.cfg.FirstEvent, int(h.cfg.MaxLine))
	body := resp.Body
	limit := h.maxPrefix
	buf := buffers.Get().([]byte)[:0] // a pooled buffer, taken inline: one call fewer under Yaegi
	for {
		if len(buf) == cap(buf) {
			buf = grow(buf) // only when MaxPrefix exceeds the buffer
		}
		end := len(buf)
		n, err := body.Read(buf[end:cap(buf)])
		buf = buf[:end+n]
		a.prefix = buf
		if n > 0 {
			if v, why := stream.Feed(det, buf[end:]); v == stream.VerdictOutput {
				a.firstAt = h.now() // decided's common case, without its frame
				return true
			} else if v != stream.VerdictPending {
				return decided(h, a, p, v, why)
			}
			if len(buf) > limit {
				return prefixFull(h, a, true)
			}
		}
		if err != nil {
			return readEnded(h, a, p, det, err)
		}
	}
}

// readWhole reads a resp that is not a stream until its end, or until
// MaxPrefix (the rest is then streamed), into a.prefix as
// readUntilFirstEvent does. It reports whether the attempt is ready to win.
// io.ReadFull reads until the buffer is full or the body ends: one compiled
// call where an interpreted loop would take one iteration per read. A body
// that fits the first read (the common case) needs no loop: a longer one
// is read on by readMore, whose slots this frame does not carry (under
// Yaegi a call allocates every slot of the callee's frame).
//
// isJSON: resp's Content-Type names JSON, whose validity is then checked.
// The body's end is decided here (readEnded's case for a whole answer).
func readWhole(h *Hedger, a *attempt, p *preparedRequest, resp *http.Response, isJSON bool) bool {
	buf := buffers.Get().([]byte)[:h.firstRead] // a pooled buffer, taken inline: one call fewer under Yaegi
	n, err := io.ReadFull(resp.Body, buf)
	a.prefix = buf[:n]
	if err == nil {
		// The buffer filled: the body may go on.
		if err = readMore(h, a, resp.Body); err == nil {
			return prefixFull(h, a, false)
		}
	}
	if err != io.ErrUnexpectedEOF && err != io.EOF {
		return readEnded(h, a, p, nil, err)
	}
	// The body ended (before the buffer filled, for ErrUnexpectedEOF).
	if isJSON && !json.Valid(a.prefix) {
		a.reason = "upstream answered 2xx with invalid JSON"
		return false
	}
	a.complete = true
	a.firstAt = h.now()
	return true
}

// readMore reads body on into a.prefix, growing it past its buffer when
// MaxPrefix allows, until the body ends or fails (the error, io.EOF or
// io.ErrUnexpectedEOF for an end) or a.prefix holds more than MaxPrefix
// (nil).
func readMore(h *Hedger, a *attempt, body io.Reader) error {
	limit := h.maxPrefix
	buf := a.prefix
	for len(buf) <= limit {
		if len(buf) == cap(buf) {
			buf = grow(buf) // only when MaxPrefix exceeds the buffer
		}
		end := len(buf)
		want := cap(buf)
		if want > limit+1 {
			want = limit + 1 // one byte past MaxPrefix says it was exceeded
		}
		n, err := io.ReadFull(body, buf[end:want])
		buf = buf[:end+n]
		a.prefix = buf
		if err != nil {
			return err
		}
	}
	return nil
}

// decided records the detector's verdict on an attempt and reports
// whether it is ready to win.
func decided(h *Hedger, a *attempt, p *preparedRequest, v stream.Verdict, why string) bool {
	if v == stream.VerdictOutput {
		a.firstAt = h.now()
		return true
	}
	a.reason = why
	if why != stream.ReasonEnded && why != stream.ReasonDone {
		// Upstream text may quote the gateway's key or echo the client's.
		a.reason = redactReason(why, reasonSecrets(h, p.orig))
	}
	return false
}

// grow returns b with room for more bytes after its length.
func grow(b []byte) []byte {
	return append(b, 0)[:len(b)]
}

// prefixFull decides an attempt whose undecided bytes reached MaxPrefix.
func prefixFull(h *Hedger, a *attempt, streaming bool) bool {
	if !streaming {
		// A large non-streaming answer: it wins on what it has, and the
		// rest is streamed rather than held in memory.
		a.firstAt = h.now()
		return true
	}
	a.reason = fmt.Sprintf("no output event in the first %d bytes", h.cfg.MaxPrefix)
	return false
}

// readEnded decides an attempt whose body ended (err, io.EOF included)
// before readUntilFirstEvent could, or failed (not io.EOF) before
// readWhole could (readWhole decides a whole body's end itself).
func readEnded(h *Hedger, a *attempt, p *preparedRequest, det *stream.Detector, err error) bool {
	if err != io.EOF || det == nil {
		a.reason = "cancelled" // a loser's, the common case: nothing to redact
		if !errors.Is(err, context.Canceled) {
			a.reason = "upstream stream broke before the first output event: " + redact.Text(err.Error(), reasonSecrets(h, p.orig))
		}
		return false
	}
	v, why := det.End()
	return decided(h, a, p, v, why)
}
