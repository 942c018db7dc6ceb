package core

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// fakeClock is a manual clock: timers fire only when the test advances it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	armed  chan struct{} // one token per AfterFunc call
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	f       func()
	stopped bool
	fired   bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), armed: make(chan struct{}, 1024)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	c.armed <- struct{}{}
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.fired || t.stopped {
		return false
	}
	t.stopped = true
	return true
}

// Advance moves time forward and runs the timers that came due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	for _, t := range c.timers {
		if !t.fired && !t.stopped && !t.at.After(c.now) {
			t.fired = true
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	// Synchronously: engine callbacks only post to buffered channels, and
	// the test then knows the event is queued before anything it does next.
	for _, t := range due {
		t.f()
	}
}

// drainArmed forgets the timers armed so far (no select: Yaegi).
func (c *fakeClock) drainArmed() {
	for len(c.armed) > 0 {
		<-c.armed
	}
}

// waitDue waits until a timer is armed that Advance(d) would fire (not
// stopped, not fired, due within d): a race re-arms its hedge timer as it
// launches attempts, so a count of armings may be met by one that was
// replaced before the clock moves.
func (c *fakeClock) waitDue(t *testing.T, d time.Duration) {
	t.Helper()
	for {
		c.mu.Lock()
		due := false
		for _, tm := range c.timers {
			if !tm.fired && !tm.stopped && !tm.at.After(c.now.Add(d)) {
				due = true
			}
		}
		c.mu.Unlock()
		if due {
			return
		}
		<-c.armed
	}
}

// waitArmed waits until n more timers have been armed.
func (c *fakeClock) waitArmed(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		<-c.armed
	}
}

// call is one upstream attempt seen by the scripted transport. The test
// answers it with respond (or fail), then streams the body with write.
type call struct {
	req     *http.Request
	outcome chan roundTrip // respond, fail and cancellation post here
	body    *io.PipeWriter
	bodyR   *io.PipeReader
	closed  chan struct{} // closed once cancellation has closed the body
}

type roundTrip struct {
	resp *http.Response
	err  error
}

func (c *call) attempt() int {
	n, _ := strconv.Atoi(c.req.Header.Get(HeaderAttempt))
	return n
}

// respond sends a status and headers; the body is streamed by write/end.
func (c *call) respond(status int, contentType string, header ...string) {
	h := make(http.Header)
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	c.outcome <- roundTrip{resp: &http.Response{StatusCode: status, Header: h, Body: c.bodyR, Request: c.req}}
}

func (c *call) fail(err error) { c.outcome <- roundTrip{err: err} }

// write sends body bytes; it reports false once the reader side is closed
// (the attempt was cancelled).
func (c *call) write(s string) bool {
	_, err := c.body.Write([]byte(s))
	return err == nil
}

func (c *call) end()   { c.body.Close() }
func (c *call) reset() { c.body.CloseWithError(errors.New("connection reset by peer")) }

// waitCancelled blocks until the attempt was cancelled and its body closed.
func (c *call) waitCancelled() { <-c.closed }

// scriptTransport hands every attempt to the test through calls.
type scriptTransport struct {
	calls chan *call
	mu    sync.Mutex
	seen  []*http.Request
}

func newScriptTransport() *scriptTransport {
	return &scriptTransport{calls: make(chan *call, 64)}
}

func (s *scriptTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	pr, pw := io.Pipe()
	c := &call{req: req, outcome: make(chan roundTrip, 3), body: pw, bodyR: pr, closed: make(chan struct{})}
	s.mu.Lock()
	s.seen = append(s.seen, req)
	s.mu.Unlock()
	// Cancelling the request fails the round trip and closes the body, as
	// a real transport does.
	context.AfterFunc(req.Context(), func() {
		pr.CloseWithError(context.Canceled)
		c.outcome <- roundTrip{err: context.Canceled}
		close(c.closed)
	})
	s.calls <- c
	rt := <-c.outcome
	return rt.resp, rt.err
}

func (s *scriptTransport) next(t *testing.T) *call {
	t.Helper()
	c := <-s.calls // (yaegi v0.16.1 panics on `return <-ch`)
	return c
}

func (s *scriptTransport) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

// harness runs one Hedger with the scripted transport and the fake clock.
type harness struct {
	t       *testing.T
	h       *Hedger
	tr      *scriptTransport
	clock   *fakeClock
	reports chan *Report
}

// testConfig is a race of at most two attempts (the scripts answer each
// one; the default third is tested with its own scripts: rescue tests).
func testConfig() config.Config {
	return config.Config{
		Upstreams:   []config.UpstreamConfig{{Name: "A", URL: "http://a.test/base"}, {Name: "B", URL: "http://b.test"}},
		Delay:       config.DelayConfig{Fixed: config.Duration(100 * time.Millisecond)},
		MaxAttempts: 2,
	}
}

func newHarness(t *testing.T, cfg config.Config) *harness {
	hs := &harness{t: t, tr: newScriptTransport(), clock: newFakeClock(), reports: make(chan *Report, 64)}
	h, err := New(cfg, Options{Transport: hs.tr, Clock: hs.clock, Observer: ObserverFunc(func(r *Report) { hs.reports <- r })})
	if err != nil {
		t.Fatal(err)
	}
	hs.h = h
	return hs
}

// served is a finished client request.
type served struct {
	rec *httptest.ResponseRecorder
	err error
}

// serve runs one request in the background.
func (hs *harness) serve(r *http.Request) chan served {
	out := make(chan served, 1)
	go func() {
		rec := httptest.NewRecorder()
		err := hs.h.Handle(rec, r)
		out <- served{rec, err}
	}()
	return out
}

func chatRequest(body string) *http.Request {
	if body == "" {
		body = `{"model":"gpt-x","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	}
	r := httptest.NewRequest("POST", "/v1/chat/completions?x=1", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}

const (
	roleChunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
	ping      = ": ping\n\n"
)

func tokenChunk(s string) string {
	return "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + s + "\"}}]}\n\n"
}

func bodyOf(s served) string { return s.rec.Body.String() }

var _ = bytes.NewReader
