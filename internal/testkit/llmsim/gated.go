package llmsim

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"
)

// Gated is a Chat Completions upstream whose stream goes on only when the
// test says so, for tests that prove a proxy flushes every event: a proxy
// that buffered one would stall it. Its tokens are TokenText of the
// request's HeaderRequest id.
//
// Without hold, token i+1 is sent only after the test has put i on
// Received (its client got token i), or 10s passed, counted in Late. With
// hold, every stream stops after its first token, announced on First,
// until Release is closed; its tokens are then not gated on receipt.
type Gated struct {
	*httptest.Server
	Received chan int     // the client got content token i
	Late     atomic.Int32 // tokens whose receipt was not confirmed in time
	First    chan string  // a stream sent its first token (hold mode): its id
	Release  chan struct{}
	tokens   int
	hold     bool
}

// StartGated starts a Gated upstream that sends tokens tokens per answer.
func StartGated(tokens int, hold bool) *Gated {
	g := &Gated{Received: make(chan int, 1024), First: make(chan string, 1024), Release: make(chan struct{}), tokens: tokens, hold: hold}
	if !hold {
		close(g.Release)
	}
	g.Server = httptest.NewServer(http.HandlerFunc(g.serve))
	return g
}

func (g *Gated) serve(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	id := r.Header.Get(HeaderRequest)
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	write := func(s string) bool {
		if _, err := io.WriteString(w, s); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	chunk := func(delta, finish string) string {
		return `data: {"id":"chatcmpl-G-` + id + `","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}` + "\n\n"
	}
	if !write(chunk(`{"role":"assistant","content":""}`, "null")) {
		return
	}
	for i := 0; i < g.tokens; i++ {
		if !write(chunk(`{"content":"`+TokenText(id, i)+`"}`, "null")) {
			return
		}
		if i == 0 && g.hold {
			g.First <- id
			select {
			case <-g.Release:
			case <-r.Context().Done():
				return
			}
		}
		if i < g.tokens-1 && !g.hold {
			select {
			case <-g.Received:
			case <-time.After(10 * time.Second):
				g.Late.Add(1)
			case <-r.Context().Done():
				return
			}
		}
	}
	write(chunk(`{}`, `"stop"`) + "data: [DONE]\n\n")
}

// Holder holds chosen requests of a Server until the test releases them:
// its Behave blocks a request whose HeaderRequest id was held.
type Holder struct {
	mu   sync.Mutex
	gate map[string]chan struct{}
}

// Hold makes the request with this id wait; closing the channel releases it.
func (h *Holder) Hold(id string) chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gate == nil {
		h.gate = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	h.gate[id] = ch
	return ch
}

// Behave is a Server's Behave: a held request waits for its release or its
// client, then answers normally.
func (h *Holder) Behave(r *http.Request) Behavior {
	h.mu.Lock()
	ch := h.gate[r.Header.Get(HeaderRequest)]
	h.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-r.Context().Done():
		}
	}
	return Behavior{}
}
