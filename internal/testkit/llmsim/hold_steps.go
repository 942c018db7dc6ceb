package llmsim

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
)

// TokenHold holds a content token of chosen requests of a Server until
// the test releases it, for tests that must act while an upstream answer
// is at a given step (kill a proxy before it commits, or after its client
// got the first token) without betting on a TTFT or a token gap being long
// enough. Unlike Holder, which holds a request before its status line, a
// request held here has sent its status, headers, preamble and pings, and
// the tokens before the held one: only the write that carries the held
// token (TokenText(id, i)) waits. Serve a Server through it with Start.
type TokenHold struct {
	mu    sync.Mutex
	holds map[string]*tokenHold
}

// tokenHold is the hold of one request id.
type tokenHold struct {
	token   []byte
	reached chan struct{} // closed when a request with the id is at its first token
	reach   sync.Once
	release chan struct{}
	free    sync.Once
}

// Hold holds the first token of every request with this id (the
// X-Sim-Request header, else the Idempotency-Key header) until release is
// called; reached is closed once the first of them has its token ready and
// waits. release may be called more than once; requests with the id that
// arrive after it are not held.
func (h *TokenHold) Hold(id string) (reached <-chan struct{}, release func()) {
	return h.HoldToken(id, 0)
}

// HoldToken is Hold for token i (0 is the first): the tokens before it go
// out, the write that carries it waits.
func (h *TokenHold) HoldToken(id string, i int) (reached <-chan struct{}, release func()) {
	th := &tokenHold{token: []byte(TokenText(id, i)), reached: make(chan struct{}), release: make(chan struct{})}
	h.mu.Lock()
	if h.holds == nil {
		h.holds = map[string]*tokenHold{}
	}
	h.holds[id] = th
	h.mu.Unlock()
	return th.reached, func() { th.free.Do(func() { close(th.release) }) }
}

// Start serves s through h on 127.0.0.1, port chosen by the system.
func (h *TokenHold) Start(s *Server) *Running {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(HeaderRequest)
		if id == "" {
			id = r.Header.Get(HeaderIdempotencyKey)
		}
		h.mu.Lock()
		th := h.holds[id]
		h.mu.Unlock()
		if th != nil {
			w = &tokenHoldWriter{ResponseWriter: w, ctx: r.Context(), hold: th}
		}
		s.ServeHTTP(w, r)
	}))
	return &Running{Server: s, URL: ts.URL, ts: ts}
}

// tokenHoldWriter passes every write through but the first that carries
// the held token, which waits for the release or the client's leaving.
type tokenHoldWriter struct {
	http.ResponseWriter
	ctx    context.Context
	hold   *tokenHold
	passed bool
}

func (w *tokenHoldWriter) Write(p []byte) (int, error) {
	if !w.passed && bytes.Contains(p, w.hold.token) {
		w.passed = true
		w.hold.reach.Do(func() { close(w.hold.reached) })
		select {
		case <-w.hold.release:
		case <-w.ctx.Done():
		}
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection's writer (the
// Server flushes through it).
func (w *tokenHoldWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
