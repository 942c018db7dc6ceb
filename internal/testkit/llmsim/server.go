package llmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"time"
)

// Headers the Server reads or sets.
const (
	// HeaderRequest names the request id that seeds the draws and the answer.
	// Without it the Idempotency-Key header is used, else a counter.
	HeaderRequest = "X-Sim-Request"
	// HeaderUpstream is set on every answer to the Server's Name.
	HeaderUpstream = "X-Sim-Upstream"
	// HeaderIdempotencyKey is the idempotency key header.
	HeaderIdempotencyKey = "Idempotency-Key"
)

// maxBody bounds the request body the Server reads.
const maxBody = 64 << 20

// Server is a simulated LLM upstream; it implements http.Handler. Set its
// fields before it serves requests; it is then safe for concurrent use. Its
// zero value serves the reference workload (Scale 1) under the empty name.
//
// Each request is answered in the format of its path (see Format): a stream
// when the body says "stream": true (Ollama: unless it says false), else one
// JSON object once the whole answer is ready. A stream sends status 200, its
// headers and its preamble at once, ": ping" comments every PingEvery until
// the TTFT, then Tokens content events TokenGap apart, then its terminator,
// flushing after every event. The Behavior of the request may script a
// failure instead.
type Server struct {
	// Name names the upstream: it seeds the draws and appears in the answer
	// ids and the X-Sim-Upstream header.
	Name string
	// Workload draws the TTFT and sets the token count and pacing.
	Workload Workload
	// Behave, if set, chooses the Behavior of each request. An entry for
	// this Name (or "*") in the X-Sim-Behavior header takes precedence.
	Behave func(r *http.Request) Behavior
	// OnCancel, if set, is called in the handler's goroutine when the
	// client of a request went away before its answer ended; at is when the
	// server observed it.
	OnCancel func(requestID string, at time.Time)
	// LogLimit bounds the request and cancellation logs (default 10,000
	// each; the oldest entries are dropped).
	LogLimit int

	counters
	nextID atomic.Int64
	regime regimeSlot // see SetRegime
}

// Running is a Server listening on a loopback port.
type Running struct {
	*Server
	// URL is the base URL, e.g. http://127.0.0.1:41234 (no trailing slash).
	URL string
	ts  *httptest.Server
}

// Start starts a Server named name with workload w on 127.0.0.1, port
// chosen by the system.
func Start(name string, w Workload) *Running {
	return (&Server{Name: name, Workload: w}).Start()
}

// Start serves s on 127.0.0.1, port chosen by the system.
func (s *Server) Start() *Running {
	ts := httptest.NewServer(s)
	return &Running{Server: s, URL: ts.URL, ts: ts}
}

// Client returns an HTTP client for the server.
func (r *Running) Client() *http.Client { return r.ts.Client() }

// Close closes every client connection, which cancels the requests in
// flight (they count as Cancelled), and stops the server once their
// handlers have returned.
func (r *Running) Close() {
	r.ts.CloseClientConnections()
	r.ts.Close()
}

// ServeHTTP answers one request; see Server.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	body, _ := io.ReadAll(io.LimitReader(r.Body, maxBody))
	var fields struct {
		Model  string `json:"model"`
		Stream *bool  `json:"stream"`
	}
	var jsonErr error
	if len(bytes.TrimSpace(body)) > 0 {
		jsonErr = json.Unmarshal(body, &fields)
	}
	format, known := FormatForPath(r.URL.Path)
	stream := fields.Stream != nil && *fields.Stream
	if format == Ollama && fields.Stream == nil {
		stream = true
	}
	id := s.requestID(r)
	attempt := r.Header.Get(HeaderAttempt)
	nth := s.begin(Request{
		RequestID:      id,
		Method:         r.Method,
		Path:           r.URL.Path,
		Format:         format,
		Stream:         stream,
		Model:          fields.Model,
		Attempt:        attempt,
		IdempotencyKey: r.Header.Get(HeaderIdempotencyKey),
		Authorization:  r.Header.Get("Authorization"),
		Header:         r.Header.Clone(),
		Body:           body,
		At:             start,
	})

	w.Header().Set(HeaderUpstream, s.Name)
	w.Header().Set(HeaderRequest, id)
	wl := s.Workload.WithDefaults()
	x := &exchange{
		w:       w,
		rc:      http.NewResponseController(w),
		ctx:     r.Context(),
		format:  format,
		outcome: outcomeCancelled,
	}
	x.cancel.RequestID, x.cancel.Attempt = id, attempt
	defer func() {
		// Runs on return and on the reset panic alike.
		if x.timer != nil {
			x.timer.Stop()
		}
		s.finish(x.outcome, x.cancel)
	}()

	b, err := s.behavior(r)
	switch {
	case err != nil:
		x.fail(http.StatusBadRequest, err.Error(), 0)
		return
	case !known:
		x.fail(http.StatusNotFound, "llmsim: no API at "+r.URL.Path, 0)
		return
	case r.Method != http.MethodPost:
		x.fail(http.StatusMethodNotAllowed, "llmsim: use POST", 0)
		return
	case jsonErr != nil:
		x.fail(http.StatusBadRequest, "llmsim: request body is not JSON: "+jsonErr.Error(), 0)
		return
	}
	if b.SlowHeaders > 0 && !x.waitUntil(start.Add(b.SlowHeaders), false) {
		return
	}
	if b.Status != 0 && b.Status != http.StatusOK {
		x.fail(b.Status, "llmsim: simulated "+strconv.Itoa(b.Status)+" from upstream "+s.Name, b.RetryAfter)
		return
	}

	sc := Call{Format: format, Stream: stream, Upstream: s.Name, Model: fields.Model, RequestID: id, Tokens: wl.Tokens}.script()
	ttft := s.regime.p.Load().apply(wl.TTFT(s.Name, drawID(id, nth)), start, wl.Scale)
	if b.TTFT > 0 {
		ttft = b.TTFT
	}
	x.firstAt = start.Add(ttft)
	x.gap = wl.Scaled(wl.gap())
	if wl.PingEvery > 0 && !b.NoPings && sc.ping != nil {
		x.pingEvery = wl.Scaled(wl.PingEvery)
	}
	if stream {
		x.stream(sc, b)
	} else {
		x.answer(sc, b)
	}
}

// drawID is what the TTFT of the nth request with id at a server is drawn
// for: id for the first, "id#n" after it (since the last ResetCounters).
// A provider gives a second request of the same prompt a latency of its
// own: a hedge sent back to the same upstream draws again, as it would.
func drawID(id string, nth int) string {
	if nth <= 1 {
		return id
	}
	return id + "#" + strconv.Itoa(nth)
}

// requestID is the X-Sim-Request header, else the Idempotency-Key header,
// else "sim-<n>" from a counter.
func (s *Server) requestID(r *http.Request) string {
	if id := r.Header.Get(HeaderRequest); id != "" {
		return id
	}
	if id := r.Header.Get(HeaderIdempotencyKey); id != "" {
		return id
	}
	return "sim-" + strconv.FormatInt(s.nextID.Add(1), 10)
}

// behavior is Behave's choice, overridden by the X-Sim-Behavior header's
// entry for this upstream.
func (s *Server) behavior(r *http.Request) (Behavior, error) {
	var b Behavior
	if s.Behave != nil {
		b = s.Behave(r)
	}
	if v := r.Header.Get(HeaderBehavior); v != "" {
		byName, err := ParseBehaviors(v)
		if err != nil {
			return b, err
		}
		if hb, ok := behaviorFor(byName, s.Name); ok {
			b = hb
		}
	}
	return b, nil
}

// exchange is the state of one request being answered.
type exchange struct {
	w         http.ResponseWriter
	rc        *http.ResponseController
	ctx       context.Context
	format    Format
	firstAt   time.Time     // when the first token is due
	gap       time.Duration // between tokens
	pingEvery time.Duration // 0: no pings
	lastPing  time.Time
	timer     *time.Timer
	outcome   outcome
	cancel    Cancellation // RequestID, Attempt; At and TokensSent when cancelled
}

// stream sends a streaming answer.
func (x *exchange) stream(sc script, b Behavior) {
	h := x.w.Header()
	h.Set("Content-Type", sc.contentType)
	h.Set("Cache-Control", "no-cache")
	x.w.WriteHeader(http.StatusOK)
	if !x.send(sc.preamble) {
		return
	}
	x.lastPing = time.Now()
	if b.DoneBeforeOutput {
		if x.send(sc.doneEarly) {
			x.outcome = outcomeFailed
		}
		return
	}
	if b.Stall {
		x.waitUntil(time.Time{}, true) // returns when cancelled
		return
	}
	if !x.waitUntil(x.firstAt, true) {
		return
	}
	if b.ErrorEventBeforeOutput {
		if x.send(sc.errorEvent) {
			x.outcome = outcomeFailed
		}
		return
	}
	for i := 0; i < sc.tokens; i++ {
		if i > 0 && !x.waitUntil(x.firstAt.Add(time.Duration(i)*x.gap), false) {
			return
		}
		if b.resets() && i == b.ResetAfterTokens {
			x.reset()
		}
		if !x.send(sc.token(i)) {
			return
		}
		x.cancel.TokensSent++
	}
	if b.resets() {
		x.reset()
	}
	if x.send(sc.trailer) {
		x.outcome = outcomeCompleted
	}
}

// answer sends a non-streaming answer when its last token is due.
func (x *exchange) answer(sc script, b Behavior) {
	if b.Stall {
		x.waitUntil(time.Time{}, false)
		return
	}
	due := x.firstAt.Add(time.Duration(sc.tokens-1) * x.gap)
	if b.ErrorEventBeforeOutput {
		due = x.firstAt
	}
	if !x.waitUntil(due, false) {
		return
	}
	if b.ErrorEventBeforeOutput {
		x.fail(http.StatusInternalServerError, "llmsim: simulated upstream error", 0)
		return
	}
	if b.resets() {
		x.reset()
	}
	body := sc.full()
	h := x.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	x.w.WriteHeader(http.StatusOK)
	if x.send(body) {
		x.outcome = outcomeCompleted
	}
}

// fail answers with an error status and a JSON error body. retryAfter is
// the Retry-After of a 429 or 503 (see Behavior.RetryAfter).
func (x *exchange) fail(status int, message string, retryAfter int) {
	body := errorBody(x.format, status, message)
	h := x.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if status == http.StatusTooManyRequests && retryAfter == 0 {
		retryAfter = 1
	}
	if (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable) && retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	x.w.WriteHeader(status)
	if x.send(body) {
		x.outcome = outcomeFailed
	}
}

// send writes p and flushes it. A failure means the client went away.
func (x *exchange) send(p []byte) bool {
	_, err := x.w.Write(p)
	if err == nil {
		err = x.rc.Flush()
	}
	if err != nil {
		x.cancelled()
		return false
	}
	return true
}

// waitUntil waits until deadline (the zero time: forever), sending pings if
// asked and enabled. It returns false when the request was cancelled first.
func (x *exchange) waitUntil(deadline time.Time, ping bool) bool {
	ping = ping && x.pingEvery > 0
	for {
		now := time.Now()
		if !deadline.IsZero() && !now.Before(deadline) {
			return true
		}
		wake := deadline
		if ping {
			pingAt := x.lastPing.Add(x.pingEvery)
			if !now.Before(pingAt) {
				if !x.send([]byte(Ping)) {
					return false
				}
				x.lastPing = now
				continue
			}
			if wake.IsZero() || pingAt.Before(wake) {
				wake = pingAt
			}
		}
		var fire <-chan time.Time
		if !wake.IsZero() {
			if x.timer == nil {
				x.timer = time.NewTimer(wake.Sub(now))
			} else {
				x.timer.Reset(wake.Sub(now))
			}
			fire = x.timer.C
		}
		select {
		case <-fire:
		case <-x.ctx.Done():
			x.cancelled()
			return false
		}
	}
}

// cancelled marks the request as cancelled by its client, now.
func (x *exchange) cancelled() {
	if x.outcome == outcomeCancelled && x.cancel.At.IsZero() {
		x.cancel.At = time.Now()
	}
}

// reset aborts the connection without ending the response: net/http closes
// it without the chunked terminator, so the client sees a broken stream.
func (x *exchange) reset() {
	x.outcome = outcomeReset
	panic(http.ErrAbortHandler)
}
