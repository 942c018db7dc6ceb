package core

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The primary sends early headers, a role-only chunk and pings: that is not
// output, so the hedge starts after the delay and wins; the primary is
// cancelled and none of its bytes reach the client.
func TestRoleOnlyChunkAndPingsNeverWin(t *testing.T) {
	hs := newHarness(t, testConfig())
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(roleChunk)
	a.write(ping)
	a.write(ping)
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(100 * time.Millisecond)
	b := hs.tr.next(t)
	if b.attempt() != 1 || b.req.URL.Host != "b.test" {
		t.Fatalf("hedge went to %s attempt %d", b.req.URL, b.attempt())
	}
	b.respond(200, "text/event-stream")
	b.write(roleChunk + tokenChunk("B1"))
	a.waitCancelled()
	if a.write(tokenChunk("A1")) {
		t.Fatal("the loser's body still accepts bytes after the winner committed")
	}
	b.write(tokenChunk("B2") + "data: [DONE]\n\n")
	b.end()
	res := <-out
	want := roleChunk + tokenChunk("B1") + tokenChunk("B2") + "data: [DONE]\n\n"
	if got := bodyOf(res); got != want {
		t.Fatalf("body\n got %q\nwant %q", got, want)
	}
	rep := <-hs.reports
	if rep.Winner != 1 || rep.Outcome != OutcomeOK || rep.HedgesStarted != 1 || rep.Attempts[0].Result != ResultLost {
		t.Fatalf("report %+v", rep)
	}
}

// A primary whose stream ends with [DONE] (or an error event) before any
// output fails, and the next attempt starts at once, without the delay.
func TestEarlyFailureTriggersNextAttemptAtOnce(t *testing.T) {
	for name, failure := range map[string]string{
		"done":          roleChunk + "data: [DONE]\n\n",
		"error event":   "event: error\ndata: {\"message\":\"overloaded\"}\n\n",
		"error payload": roleChunk + "data: {\"error\":{\"message\":\"boom\"}}\n\n",
	} {
		t.Run(name, func(t *testing.T) {
			hs := newHarness(t, testConfig())
			out := hs.serve(chatRequest(""))
			a := hs.tr.next(t)
			a.respond(200, "text/event-stream")
			a.write(failure)
			b := hs.tr.next(t) // no clock advance: started at once
			if b.attempt() != 1 {
				t.Fatalf("attempt %d", b.attempt())
			}
			b.respond(200, "text/event-stream")
			b.write(tokenChunk("ok"))
			b.end()
			res := <-out
			if got := bodyOf(res); got != tokenChunk("ok") {
				t.Fatalf("body %q", got)
			}
			rep := <-hs.reports
			if rep.Attempts[0].Result != ResultFailed || rep.Attempts[1].Role != RoleRetry {
				t.Fatalf("report %+v", rep)
			}
		})
	}
}

// Fatal client errors go to the client at once and are not hedged.
func TestFatalErrorIsNotHedged(t *testing.T) {
	hs := newHarness(t, testConfig())
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(400, "application/json")
	a.write(`{"error":{"message":"bad model"}}`)
	a.end()
	res := <-out
	if res.rec.Code != 400 || bodyOf(res) != `{"error":{"message":"bad model"}}` {
		t.Fatalf("got %d %q", res.rec.Code, bodyOf(res))
	}
	hs.clock.Advance(time.Second)
	if n := hs.tr.count(); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
	if rep := <-hs.reports; rep.Outcome != OutcomeFatal {
		t.Fatalf("outcome %s", rep.Outcome)
	}
}

// When every attempt fails, the client gets the most useful error: a 429
// (with its Retry-After) beats a 500.
func TestAllFailedReturnsMostUsefulError(t *testing.T) {
	hs := newHarness(t, testConfig())
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(429, "application/json", "Retry-After", "7")
	a.write(`{"error":{"message":"slow down"}}`)
	a.end()
	b := hs.tr.next(t)
	b.respond(500, "application/json")
	b.write(`{"error":{"message":"oops"}}`)
	b.end()
	res := <-out
	if res.rec.Code != 429 || res.rec.Header().Get("Retry-After") != "7" || !strings.Contains(bodyOf(res), "slow down") {
		t.Fatalf("got %d %v %q", res.rec.Code, res.rec.Header(), bodyOf(res))
	}
}

// Connection failures on every upstream give 502 with an OpenAI-shaped error.
func TestConnectFailureIs502JSON(t *testing.T) {
	hs := newHarness(t, testConfig())
	out := hs.serve(chatRequest(""))
	hs.tr.next(t).fail(errors.New("dial tcp: connection refused"))
	hs.tr.next(t).fail(errors.New("dial tcp: connection refused"))
	res := <-out
	want := `{"error":{"message":"upstream \"A\" could not be reached","type":"upstream_error","code":"upstream_unreachable"}}` + "\n"
	if res.rec.Code != 502 || bodyOf(res) != want {
		t.Fatalf("got %d %q, want 502 %q", res.rec.Code, bodyOf(res), want)
	}
}

// The shared deadline answers 504 and cancels every attempt.
func TestDeadlineGives504(t *testing.T) {
	cfg := testConfig()
	cfg.Timeout = Duration(time.Second)
	hs := newHarness(t, cfg)
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	hs.clock.waitArmed(t, 2) // deadline + hedge timer
	hs.clock.Advance(100 * time.Millisecond)
	b := hs.tr.next(t)
	hs.clock.waitArmed(t, 0)
	hs.clock.Advance(time.Second)
	a.waitCancelled()
	b.waitCancelled()
	res := <-out
	if res.rec.Code != 504 {
		t.Fatalf("got %d", res.rec.Code)
	}
	if rep := <-hs.reports; rep.Outcome != OutcomeTimeout {
		t.Fatalf("outcome %s", rep.Outcome)
	}
}

// The client going away cancels every attempt and the handler returns.
func TestClientDisconnectCancelsAllAttempts(t *testing.T) {
	hs := newHarness(t, testConfig())
	ctx, cancel := context.WithCancel(context.Background())
	out := hs.serve(chatRequest("").WithContext(ctx))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(roleChunk)
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(100 * time.Millisecond)
	b := hs.tr.next(t)
	cancel()
	a.waitCancelled()
	b.waitCancelled()
	<-out
	if rep := <-hs.reports; rep.Outcome != OutcomeClientGone {
		t.Fatalf("outcome %s", rep.Outcome)
	}
}

// A failure after commit is reported as ErrStreamAborted, never papered over.
func TestFailureAfterCommitAborts(t *testing.T) {
	hs := newHarness(t, testConfig())
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("one"))
	a.reset()
	res := <-out
	if !errors.Is(res.err, ErrStreamAborted) || bodyOf(res) != tokenChunk("one") {
		t.Fatalf("err %v body %q", res.err, bodyOf(res))
	}
	if n := hs.tr.count(); n != 1 {
		t.Fatalf("%d attempts after commit, want 1", n)
	}
}

// With stream_error_event the failure ends the stream with an SSE error event.
func TestFailureAfterCommitErrorEvent(t *testing.T) {
	cfg := testConfig()
	cfg.StreamErrorEvent = true
	hs := newHarness(t, cfg)
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("one"))
	a.reset()
	res := <-out
	if res.err != nil || !strings.HasSuffix(bodyOf(res), "\n\n") || !strings.Contains(bodyOf(res), "event: error\n") {
		t.Fatalf("err %v body %q", res.err, bodyOf(res))
	}
}

// Non-streaming: the first complete 2xx JSON wins; invalid JSON is a failure.
func TestNonStreamingFirstCompleteValidJSONWins(t *testing.T) {
	hs := newHarness(t, testConfig())
	out := hs.serve(chatRequest(`{"model":"m"}`))
	a := hs.tr.next(t)
	a.respond(200, "application/json")
	a.write(`{"truncated":`)
	a.end()
	b := hs.tr.next(t)
	b.respond(200, "application/json", "Content-Length", "11")
	b.write(`{"ok":true}`)
	b.end()
	res := <-out
	if res.rec.Code != 200 || bodyOf(res) != `{"ok":true}` || res.rec.Header().Get("Content-Length") != "11" {
		t.Fatalf("got %d %q %v", res.rec.Code, bodyOf(res), res.rec.Header())
	}
}

// Every attempt carries the same idempotency key and its number; each
// upstream's headers and model are applied, and the path is appended.
func TestAttemptRequestsShareKeyAndApplyUpstreamRewrites(t *testing.T) {
	cfg := testConfig()
	cfg.Upstreams[0].SetHeaders = map[string]string{"Authorization": "Bearer key-a"}
	cfg.Upstreams[1].SetHeaders = map[string]string{"Authorization": "Bearer key-b"}
	cfg.Upstreams[1].DeleteHeaders = []string{"X-Drop"}
	cfg.Upstreams[1].Model = "cheap-model"
	hs := newHarness(t, cfg)
	r := chatRequest(`{"model":"gpt-x", "n": 1.50, "stream":true}`)
	r.Header.Set("X-Drop", "1")
	r.Header.Set("Authorization", "Bearer client")
	r.Header.Set("X-LLM-Hedge", "on")
	out := hs.serve(r)
	a := hs.tr.next(t)
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(100 * time.Millisecond)
	b := hs.tr.next(t)
	ka, kb := a.req.Header.Get("Idempotency-Key"), b.req.Header.Get("Idempotency-Key")
	if ka == "" || ka != kb {
		t.Fatalf("keys %q %q", ka, kb)
	}
	if a.req.URL.String() != "http://a.test/base/v1/chat/completions?x=1" || b.req.URL.String() != "http://b.test/v1/chat/completions?x=1" {
		t.Fatalf("urls %s %s", a.req.URL, b.req.URL)
	}
	if a.req.Header.Get("Authorization") != "Bearer key-a" || b.req.Header.Get("Authorization") != "Bearer key-b" {
		t.Fatal("per-upstream Authorization not applied")
	}
	if a.req.Header.Get("X-Drop") != "1" || b.req.Header.Get("X-Drop") != "" || b.req.Header.Get("X-LLM-Hedge") != "" {
		t.Fatal("header delete not applied")
	}
	bodyA, _ := io.ReadAll(a.req.Body)
	bodyB, _ := io.ReadAll(b.req.Body)
	if string(bodyA) != `{"model":"gpt-x", "n": 1.50, "stream":true}` || string(bodyB) != `{"model":"cheap-model", "n": 1.50, "stream":true}` {
		t.Fatalf("bodies %s | %s", bodyA, bodyB)
	}
	if b.req.ContentLength != int64(len(bodyB)) {
		t.Fatalf("content length %d", b.req.ContentLength)
	}
	a.fail(errors.New("x"))
	b.respond(200, "text/event-stream")
	b.write(tokenChunk("x"))
	b.end()
	<-out
}

// A body over max_body is forwarded once, unhedged, byte for byte.
func TestOversizedBodyForwardedOnceWithoutLoss(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBody = 1024
	hs := newHarness(t, cfg)
	big := `{"model":"m","pad":"` + strings.Repeat("x", 10000) + `"}`
	out := hs.serve(chatRequest(big))
	a := hs.tr.next(t)
	got, _ := io.ReadAll(a.req.Body)
	if string(got) != big {
		t.Fatalf("upstream got %d bytes, want %d", len(got), len(big))
	}
	a.respond(200, "text/event-stream")
	a.write(roleChunk)
	a.end()
	res := <-out
	if bodyOf(res) != roleChunk || hs.tr.count() != 1 {
		t.Fatalf("body %q attempts %d", bodyOf(res), hs.tr.count())
	}
	if rep := <-hs.reports; rep.Hedged || rep.Attempts[0].Role != RoleSingle {
		t.Fatalf("report %+v", rep)
	}
}

// Malformed JSON is rejected before any upstream is contacted.
func TestMalformedJSONRejected(t *testing.T) {
	hs := newHarness(t, testConfig())
	res := <-hs.serve(chatRequest(`{"model":`))
	if res.rec.Code != 400 || !strings.Contains(bodyOf(res), `"code":"invalid_json"`) || hs.tr.count() != 0 {
		t.Fatalf("got %d %q", res.rec.Code, bodyOf(res))
	}
}

// X-LLM-Hedge: off forwards the request once, as a plain proxy.
func TestOptOutIsSingleAttempt(t *testing.T) {
	hs := newHarness(t, testConfig())
	r := chatRequest("")
	r.Header.Set("X-LLM-Hedge", "off")
	out := hs.serve(r)
	a := hs.tr.next(t)
	if a.req.Header.Get("X-LLM-Hedge") != "" {
		t.Fatal("opt-out header forwarded")
	}
	a.respond(503, "application/json")
	a.write(`{"error":{"message":"busy"}}`)
	a.end()
	res := <-out
	if res.rec.Code != 503 || hs.tr.count() != 1 {
		t.Fatalf("got %d, %d attempts", res.rec.Code, hs.tr.count())
	}
}

// A request that may change state is not hedged without a client key.
func TestStatefulRequestNeedsIdempotencyKey(t *testing.T) {
	hs := newHarness(t, testConfig())
	out := hs.serve(chatRequest(`{"model":"m","store":true,"stream":true}`))
	a := hs.tr.next(t)
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(time.Second)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("x"))
	a.end()
	<-out
	rep := <-hs.reports
	if hs.tr.count() != 1 || len(rep.Denials) != 1 || rep.Denials[0] != DenyNotIdempotent {
		t.Fatalf("attempts %d denials %v", hs.tr.count(), rep.Denials)
	}
}

// The default options (real clock, no observer) work: this is the path the
// Traefik plugin takes under Yaegi, which the fake-clock tests do not cover.
func TestDefaultOptionsRealClock(t *testing.T) {
	tr := newScriptTransport()
	cfg := testConfig()
	cfg.Delay.Fixed = Duration(time.Millisecond)
	h, err := New(cfg, Options{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.Handle(rec, chatRequest(""))
		out <- rec.Body.String()
	}()
	a := tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(roleChunk)
	b := tr.next(t) // the real 1ms timer fired
	b.respond(200, "text/event-stream")
	b.write(tokenChunk("b"))
	b.end()
	a.waitCancelled()
	if got := <-out; got != tokenChunk("b") {
		t.Fatalf("got %q", got)
	}
}

// The state check cannot be dodged by escaping a key.
func TestMayChangeStateEscapedKey(t *testing.T) {
	if !mayChangeState([]byte(`{"st\u006fre":true}`), "/v1/chat/completions") {
		t.Fatal("escaped store key not seen")
	}
	if mayChangeState([]byte(`{"model":"m","messages":[]}`), "/v1/chat/completions") {
		t.Fatal("plain chat request judged stateful")
	}
	if !mayChangeState([]byte(`{"model":"m"}`), "/v1/responses") || mayChangeState([]byte(`{"store":false}`), "/v1/responses") {
		t.Fatal("responses default store")
	}
}

// A client that closes right after the end marker got the whole answer: the
// outcome is ok, not client_gone.
func TestClientClosingAtEndMarkerIsOK(t *testing.T) {
	hs := newHarness(t, testConfig())
	ctx, cancel := context.WithCancel(context.Background())
	out := hs.serve(chatRequest("").WithContext(ctx))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("x"))
	a.write("data: [DONE]\n\n")
	cancel() // the upstream's EOF never arrives before the client leaves
	<-out
	if rep := <-hs.reports; rep.Outcome != OutcomeOK {
		t.Fatalf("outcome %s", rep.Outcome)
	}
	if !streamFinished([]byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")) || streamFinished([]byte(tokenChunk("x"))) {
		t.Fatal("streamFinished")
	}
}
