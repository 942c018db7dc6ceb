package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
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

	result        string
	cancelLatency time.Duration
}

// errorBodyLimit bounds the upstream error body kept for the client.
const errorBodyLimit = 64 << 10

// fatalStatus are client errors that no other upstream would answer better.
func fatalStatus(status int) bool {
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

// run sends the attempt and reads until its first output event (ready) or a
// failure, then posts exactly one event.
func (h *Hedger) run(a *attempt, p *preparedRequest, events chan<- event, passthrough bool) {
	ev := event{kind: evFailed, attempt: a}
	defer func() {
		a.endedAt = h.opts.Clock.Now()
		events <- ev
	}()
	req, err := h.attemptRequest(a.ctx, p, a.upstream, a.index)
	if err != nil {
		a.reason = "building the upstream request: " + err.Error()
		a.connErr = true
		return
	}
	resp, err := h.opts.Transport.RoundTrip(req)
	if err != nil {
		a.reason = "upstream request failed: " + err.Error()
		a.connErr = true
		a.retryable = true
		return
	}
	a.status = resp.StatusCode
	if passthrough {
		// An unhedged request is a plain proxy: its answer, whatever it
		// is, goes to the client as it comes.
		a.resp = resp
		a.firstAt = h.opts.Clock.Now()
		ev.kind = evReady
		return
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		errBody, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyLimit))
		a.errBody = errBody
		resp.Body.Close()
		a.resp = resp
		a.reason = fmt.Sprintf("upstream answered %d", resp.StatusCode)
		a.fatal = fatalStatus(resp.StatusCode)
		a.retryable = retryableStatus(resp.StatusCode)
		return
	}
	format, streaming := streamFormatOf(resp.Header.Get("Content-Type"))
	a.streaming = streaming
	if h.readUntilDecided(a, resp, format) {
		a.resp = resp
		ev.kind = evReady
		return
	}
	resp.Body.Close()
	a.retryable = true
}

// readUntilDecided reads resp until the first output event (stream) or the
// whole body (non-stream), keeping every byte in a.prefix. It reports whether
// the attempt is ready to win.
func (h *Hedger) readUntilDecided(a *attempt, resp *http.Response, format streamFormat) bool {
	buf := getBuffer()
	defer putBuffer(buf)
	var det *firstEventDetector
	if a.streaming {
		det = newFirstEventDetector(format, h.cfg.FirstEvent, h.cfg.MaxLine)
	}
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			a.prefix = append(a.prefix, buf[:n]...)
			if det != nil {
				v, why := det.Feed(buf[:n])
				if v == verdictOutput {
					a.firstAt = h.opts.Clock.Now()
					return true
				}
				if v == verdictFailure {
					a.reason = why
					return false
				}
			}
			if len(a.prefix) > h.cfg.MaxPrefix {
				if det == nil {
					// A large non-streaming answer: it wins on what it has,
					// and the rest is streamed rather than held in memory.
					a.firstAt = h.opts.Clock.Now()
					return true
				}
				a.reason = fmt.Sprintf("no output event in the first %d bytes", h.cfg.MaxPrefix)
				return false
			}
		}
		if err == io.EOF {
			if det != nil {
				v, why := det.End()
				if v == verdictOutput {
					a.firstAt = h.opts.Clock.Now()
					return true
				}
				a.reason = why
				return false
			}
			if looksJSON(resp.Header.Get("Content-Type")) && resp.Header.Get("Content-Type") != "" && !json.Valid(a.prefix) {
				a.reason = "upstream answered 2xx with invalid JSON"
				return false
			}
			a.complete = true
			a.firstAt = h.opts.Clock.Now()
			return true
		}
		if err != nil {
			a.reason = "upstream stream broke before the first output event: " + err.Error()
			if errors.Is(err, context.Canceled) {
				a.reason = "cancelled"
			}
			return false
		}
	}
}
