package traefikplugin

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// These tests run compiled (go test) and interpreted (yaegi test), so the
// helpers use the standard library only and no `select`: waits are single
// receives on a channel fed by time.AfterFunc and context.AfterFunc, the
// shape that is safe under Yaegi.

// script says how a test upstream answers one request.
type script struct {
	status     int           // non-200: answer this status with a JSON error
	ttft       time.Duration // before the first token; < 0: never (stall)
	tokens     int           // content tokens; default 3
	abortAfter int           // > 0: break the connection after this many tokens
	gate       chan struct{} // when set, each token after the first waits for a receive
	nonStream  bool          // answer one JSON object
}

// testUpstream is an OpenAI-compatible SSE upstream for tests. Every answer
// names the upstream and echoes the request id, so a test can check that a
// whole answer came from one upstream and belongs to its own request.
type testUpstream struct {
	name   string
	plan   func(r *http.Request) script
	srv    *httptest.Server
	mu     sync.Mutex
	served int
	gone   int // requests whose client went away before the end
	heads  []http.Header
	bodies []string
	// changed gets a token (when it has room) on every change of served
	// or gone; tests wait on it instead of polling.
	changed chan struct{}
}

func startUpstream(t *testing.T, name string, plan func(r *http.Request) script) *testUpstream {
	u := &testUpstream{name: name, plan: plan, changed: make(chan struct{}, 64)}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(func() { u.srv.Close() }) // a closure: Yaegi mistypes compiled method values
	return u
}

// notifyLocked signals a change; u.mu is held, so senders never race for
// the last slot and never block.
func (u *testUpstream) notifyLocked() {
	if len(u.changed) < cap(u.changed) {
		u.changed <- struct{}{}
	}
}

// await waits until cond holds, re-checking it after every change of u, and
// fails the test after 10s.
func (u *testUpstream) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	var timedOut int32
	timer := time.AfterFunc(10*time.Second, func() {
		atomic.StoreInt32(&timedOut, 1)
		u.mu.Lock()
		u.notifyLocked()
		u.mu.Unlock()
	})
	defer timer.Stop()
	for !cond() {
		<-u.changed
		if atomic.LoadInt32(&timedOut) == 1 && !cond() {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (u *testUpstream) counts() (served, gone int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.served, u.gone
}

func (u *testUpstream) lastHeader() http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.heads) == 0 {
		return nil
	}
	return u.heads[len(u.heads)-1]
}

func (u *testUpstream) lastBody() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) == 0 {
		return ""
	}
	return u.bodies[len(u.bodies)-1]
}

// wait sleeps for d, or until ctx ends; it reports whether d passed. d < 0
// waits for ctx only.
func wait(ctx context.Context, d time.Duration) bool {
	wake := make(chan struct{}, 2)
	if d >= 0 {
		t := time.AfterFunc(d, func() { wake <- struct{}{} })
		defer t.Stop()
	}
	stop := context.AfterFunc(ctx, func() { wake <- struct{}{} })
	defer stop()
	<-wake
	return ctx.Err() == nil
}

func chunk(upstream, id, delta string) string {
	return `data: {"id":"chatcmpl-` + upstream + `-` + id + `","object":"chat.completion.chunk","choices":[{"index":0,"delta":` + delta + `}]}` + "\n\n"
}

// tokenText is the content of token i of request id.
func tokenText(id string, i int) string { return id + ":" + strconv.Itoa(i) + " " }

// expectedText is the whole content of an answer with n tokens.
func expectedText(id string, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString(tokenText(id, i))
	}
	return b.String()
}

func (u *testUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.served++
	u.heads = append(u.heads, r.Header.Clone())
	u.bodies = append(u.bodies, string(body))
	u.notifyLocked()
	u.mu.Unlock()
	sc := u.plan(r)
	if sc.tokens == 0 {
		sc.tokens = 3
	}
	id := r.Header.Get("X-Test-Request")
	ctx := r.Context()
	completed := false
	defer func() {
		if !completed {
			u.mu.Lock()
			u.gone++
			u.notifyLocked()
			u.mu.Unlock()
		}
	}()
	if sc.status != 0 && sc.status != http.StatusOK {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(sc.status)
		fmt.Fprintf(w, `{"error":{"message":"%s says %d","type":"test","code":"test"}}`, u.name, sc.status)
		completed = true
		return
	}
	if sc.nonStream {
		if !wait(ctx, sc.ttft) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-%s-%s","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":%q}}]}`,
			u.name, id, expectedText(id, sc.tokens))
		completed = true
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// Early headers, a role-only chunk and a ping: none of them is output.
	io.WriteString(w, chunk(u.name, id, `{"role":"assistant","content":""}`)+": ping\n\n")
	rc.Flush()
	if !wait(ctx, sc.ttft) {
		return
	}
	for i := 0; i < sc.tokens; i++ {
		if i > 0 && sc.gate != nil {
			<-sc.gate
		}
		if sc.abortAfter > 0 && i == sc.abortAfter {
			abortResponse(w) // closes the connection mid-stream
			return
		}
		if _, err := io.WriteString(w, chunk(u.name, id, `{"content":"`+tokenText(id, i)+`"}`)); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
	io.WriteString(w, "data: [DONE]\n\n")
	completed = true
}
