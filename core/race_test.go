package core

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/stream"
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
	if b.attempt() != 1 {
		t.Fatalf("b.attempt() = %v, want 1", b.attempt())
	} else if b.req.URL.Host != "b.test" {
		t.Fatalf("b.req.URL.Host = %q, want \"b.test\"", b.req.URL.Host)
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
	if rep.Winner != 1 {
		t.Fatalf("rep.Winner = %v, want 1", rep.Winner)
	} else if rep.Outcome != OutcomeOK {
		t.Fatalf("rep.Outcome = %v, want %v", rep.Outcome, OutcomeOK)
	} else if rep.HedgesStarted != 1 {
		t.Fatalf("rep.HedgesStarted = %v, want 1", rep.HedgesStarted)
	} else if rep.Attempts[0].Result != ResultLost {
		t.Fatalf("rep.Attempts[0].Result = %v, want %v", rep.Attempts[0].Result, ResultLost)
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
			if rep.Attempts[0].Result != ResultFailed {
				t.Fatalf("rep.Attempts[0].Result = %v, want %v", rep.Attempts[0].Result, ResultFailed)
			} else if rep.Attempts[1].Role != RoleRetry {
				t.Fatalf("rep.Attempts[1].Role = %v, want %v", rep.Attempts[1].Role, RoleRetry)
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
	if res.rec.Code != 400 {
		t.Fatalf("res.rec.Code = %v, want 400", res.rec.Code)
	} else if bodyOf(res) != `{"error":{"message":"bad model"}}` {
		t.Fatalf("bodyOf(res) = %q, want `{\"error\":{\"message\":\"bad model\"}}`", bodyOf(res))
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
	if res.rec.Code != 429 {
		t.Fatalf("res.rec.Code = %v, want 429", res.rec.Code)
	} else if res.rec.Header().Get("Retry-After") != "7" {
		t.Fatalf("res.rec.Header().Get(\"Retry-After\") = %q, want \"7\"", res.rec.Header().Get("Retry-After"))
	} else if !strings.Contains(bodyOf(res), "slow down") {
		t.Fatalf("bodyOf(res) = %q, want it to contain \"slow down\"", bodyOf(res))
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
	if res.rec.Code != 502 {
		t.Fatalf("res.rec.Code = %v, want 502", res.rec.Code)
	} else if bodyOf(res) != want {
		t.Fatalf("bodyOf(res) = %v, want %v", bodyOf(res), want)
	}
}

// The shared deadline answers 504 and cancels every attempt.
func TestDeadlineGives504(t *testing.T) {
	cfg := testConfig()
	cfg.Timeout = config.Duration(time.Second)
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
	if !errors.Is(res.err, ErrStreamAborted) {
		t.Fatalf("res.err = %v, want ErrStreamAborted", res.err)
	} else if bodyOf(res) != tokenChunk("one") {
		t.Fatalf("bodyOf(res) = %v, want %v", bodyOf(res), tokenChunk("one"))
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
	if res.err != nil {
		t.Fatalf("res.err = %v, want nil", res.err)
	} else if !strings.HasSuffix(bodyOf(res), "\n\n") {
		t.Fatalf("bodyOf(res) = %q, want it to end with \"\\n\\n\"", bodyOf(res))
	} else if !strings.Contains(bodyOf(res), "event: error\n") {
		t.Fatalf("bodyOf(res) = %q, want it to contain \"event: error\\n\"", bodyOf(res))
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
	if res.rec.Code != 200 {
		t.Fatalf("res.rec.Code = %v, want 200", res.rec.Code)
	} else if bodyOf(res) != `{"ok":true}` {
		t.Fatalf("bodyOf(res) = %q, want `{\"ok\":true}`", bodyOf(res))
	} else if res.rec.Header().Get("Content-Length") != "11" {
		t.Fatalf("res.rec.Header().Get(\"Content-Length\") = %q, want \"11\"", res.rec.Header().Get("Content-Length"))
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
	if ka == "" {
		t.Fatalf("ka = \"\", want a non-empty value")
	} else if ka != kb {
		t.Fatalf("ka = %v, want %v", ka, kb)
	}
	if a.req.URL.String() != "http://a.test/base/v1/chat/completions?x=1" {
		t.Fatalf("a.req.URL.String() = %q, want \"http://a.test/base/v1/chat/completions?x=1\"", a.req.URL.String())
	} else if b.req.URL.String() != "http://b.test/v1/chat/completions?x=1" {
		t.Fatalf("b.req.URL.String() = %q, want \"http://b.test/v1/chat/completions?x=1\"", b.req.URL.String())
	}
	if a.req.Header.Get("Authorization") != "Bearer key-a" {
		t.Fatalf("per-upstream Authorization not applied: a.req.Header.Get(\"Authorization\") = %q, want \"Bearer key-a\"", a.req.Header.Get("Authorization"))
	} else if b.req.Header.Get("Authorization") != "Bearer key-b" {
		t.Fatalf("per-upstream Authorization not applied: b.req.Header.Get(\"Authorization\") = %q, want \"Bearer key-b\"", b.req.Header.Get("Authorization"))
	}
	if a.req.Header.Get("X-Drop") != "1" {
		t.Fatalf("header delete not applied: a.req.Header.Get(\"X-Drop\") = %q, want \"1\"", a.req.Header.Get("X-Drop"))
	} else if b.req.Header.Get("X-Drop") != "" {
		t.Fatalf("header delete not applied: b.req.Header.Get(\"X-Drop\") = %q, want \"\"", b.req.Header.Get("X-Drop"))
	} else if b.req.Header.Get("X-LLM-Hedge") != "" {
		t.Fatalf("header delete not applied: b.req.Header.Get(\"X-LLM-Hedge\") = %q, want \"\"", b.req.Header.Get("X-LLM-Hedge"))
	}
	bodyA, _ := io.ReadAll(a.req.Body)
	bodyB, _ := io.ReadAll(b.req.Body)
	if string(bodyA) != `{"model":"gpt-x", "n": 1.50, "stream":true}` {
		t.Fatalf("string(bodyA) = %q, want `{\"model\":\"gpt-x\", \"n\": 1.50, \"stream\":true}`", string(bodyA))
	} else if string(bodyB) != `{"model":"cheap-model", "n": 1.50, "stream":true}` {
		t.Fatalf("string(bodyB) = %q, want `{\"model\":\"cheap-model\", \"n\": 1.50, \"stream\":true}`", string(bodyB))
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
	if bodyOf(res) != roleChunk {
		t.Fatalf("bodyOf(res) = %v, want %v", bodyOf(res), roleChunk)
	} else if hs.tr.count() != 1 {
		t.Fatalf("hs.tr.count() = %v, want 1", hs.tr.count())
	}
	if rep := <-hs.reports; rep.Hedged {
		t.Fatalf("rep.Hedged = true, want false")
	} else if rep.Attempts[0].Role != RoleSingle {
		t.Fatalf("rep.Attempts[0].Role = %v, want %v", rep.Attempts[0].Role, RoleSingle)
	}
}

// Malformed JSON is rejected before any upstream is contacted, with or
// without a "stream" key (with one and early headers on, as by default,
// the decoding that reads it is the validity check).
func TestMalformedJSONRejected(t *testing.T) {
	for _, body := range []string{`{"model":`, `{"model":"m","stream":true`, `{"stream":true} x`} {
		hs := newHarness(t, testConfig())
		res := <-hs.serve(chatRequest(body))
		if res.rec.Code != 400 {
			t.Fatalf("%s: res.rec.Code = %v, want 400", body, res.rec.Code)
		} else if !strings.Contains(bodyOf(res), `"code":"invalid_json"`) {
			t.Fatalf("%s: bodyOf(res) = %q, want it to contain `\"code\":\"invalid_json\"`", body, bodyOf(res))
		} else if hs.tr.count() != 0 {
			t.Fatalf("%s: hs.tr.count() = %v, want 0", body, hs.tr.count())
		}
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
	if res.rec.Code != 503 {
		t.Fatalf("res.rec.Code = %v, want 503", res.rec.Code)
	} else if hs.tr.count() != 1 {
		t.Fatalf("hs.tr.count() = %v, want 1", hs.tr.count())
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
	if hs.tr.count() != 1 {
		t.Fatalf("hs.tr.count() = %v, want 1", hs.tr.count())
	} else if len(rep.Denials) != 1 {
		t.Fatalf("len(rep.Denials) = %v, want 1", len(rep.Denials))
	} else if rep.Denials[0] != DenyNotIdempotent {
		t.Fatalf("rep.Denials[0] = %v, want %v", rep.Denials[0], DenyNotIdempotent)
	}
}

// The default options (real clock, no observer) work: this is the path the
// Traefik plugin takes under Yaegi, which the fake-clock tests do not cover.
func TestDefaultOptionsRealClock(t *testing.T) {
	tr := newScriptTransport()
	cfg := testConfig()
	cfg.Delay.Fixed = config.Duration(time.Millisecond)
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
	// Every acting tool, its name escaped (yaegi test runs this too: a
	// tagless switch's case list once let all but "mcp" through there).
	for _, tool := range []string{`m\u0063p`, `code_interpr\u0065ter`, `local_sh\u0065ll`, `sh\u0065ll`, `apply_p\u0061tch`, `c\u006fmputer_use_preview`} {
		if body := `{"model":"m","tools":[{"type":"` + tool + `"}]}`; !mayChangeState([]byte(body), "/v1/chat/completions") {
			t.Errorf("mayChangeState(%s) = false, want true: the tool acts", body)
		}
	}
	if !mayChangeState([]byte(`{"model":"m"}`), "/v1/responses") {
		t.Fatal(`mayChangeState({"model":"m"}, /v1/responses) = false, want true: the Responses API stores by default`)
	} else if mayChangeState([]byte(`{"store":false}`), "/v1/responses") {
		t.Fatal(`mayChangeState({"store":false}, /v1/responses) = true, want false`)
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
	if !stream.Finished([]byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")) {
		t.Fatal("Finished(message_stop) = false, want true")
	} else if stream.Finished([]byte(tokenChunk("x"))) {
		t.Fatal("Finished(a token chunk) = true, want false")
	}
}
