package core

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// earlyConfig: two upstreams, a 100ms hedge delay, early headers after 1s.
func earlyConfig() config.Config {
	cfg := testConfig()
	cfg.EarlyHeaders = config.Duration(time.Second)
	cfg.ReportHeader = "Server-Timing"
	return cfg
}

// stallBoth starts a stream request, lets A and then (after the delay) B
// answer 200 with a role chunk and stall, and returns both calls.
func stallBoth(t *testing.T, hs *harness, pw http.ResponseWriter, r *http.Request) (a, b *call, done chan error) {
	t.Helper()
	done = hs.serveVia(pw, r)
	a = hs.tr.next(t)
	hs.clock.waitArmed(t, 2) // the hedge timer and the grace timer
	a.respond(200, "text/event-stream", "X-Request-Id", "req-A")
	a.write(roleChunk)
	hs.clock.Advance(100 * time.Millisecond)
	b = hs.tr.next(t)
	b.respond(200, "text/event-stream", "X-Request-Id", "req-B")
	b.write(roleChunk)
	return a, b, done
}

// A streaming race still undecided after the grace time answers 200,
// text/event-stream and a keep-alive comment, then one per interval; the
// winner's events follow unchanged.
func TestEarlyHeadersKeepAliveThenWinner(t *testing.T) {
	hs := newHarness(t, earlyConfig())
	pw := newPipeWriter()
	_, b, done := stallBoth(t, hs, pw, chatRequest(""))
	hs.clock.Advance(900 * time.Millisecond)
	if got := <-pw.writes; got != ": keep-alive\n\n" {
		t.Fatalf("first write after the grace time = %q, want a keep-alive comment", got)
	}
	if pw.status != 200 || pw.h.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("early headers: status %d, Content-Type %q, want 200 text/event-stream", pw.status, pw.h.Get("Content-Type"))
	}
	if got := pw.h.Get("Server-Timing"); got != `llmhedge;desc="early_headers attempts=2 delay_ms=100"` {
		t.Errorf("early Server-Timing = %q", got)
	}
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(time.Second)
	if got := <-pw.writes; got != ": keep-alive\n\n" {
		t.Fatalf("second write = %q, want a keep-alive comment", got)
	}
	b.write(tokenChunk("hello"))
	if got := <-pw.writes; got != roleChunk+tokenChunk("hello") {
		t.Fatalf("winner's prefix = %q, want its role chunk and token", got)
	}
	b.write("data: [DONE]\n\n")
	b.end()
	if err := <-done; err != nil {
		t.Fatalf("Handle = %v", err)
	}
	rep := <-hs.reports
	if !rep.EarlyHeaders || rep.Winner != 1 || rep.Outcome != OutcomeOK {
		t.Fatalf("report: EarlyHeaders %v, Winner %d, Outcome %s; want true, 1, ok", rep.EarlyHeaders, rep.Winner, rep.Outcome)
	}
	if _, ok := pw.h[http.TrailerPrefix+"X-Request-Id"]; ok {
		t.Errorf("winner header offered as a trailer to a client that did not send TE: trailers")
	}
}

// A client that accepts trailers gets the winner's headers and the race
// report as trailers.
func TestEarlyHeadersWinnerHeadersAsTrailers(t *testing.T) {
	hs := newHarness(t, earlyConfig())
	pw := newPipeWriter()
	r := chatRequest("")
	r.Header.Set("TE", "trailers")
	_, b, done := stallBoth(t, hs, pw, r)
	hs.clock.Advance(900 * time.Millisecond)
	<-pw.writes
	b.write(tokenChunk("x"))
	<-pw.writes
	b.end()
	<-done
	if got := pw.h[http.TrailerPrefix+"X-Request-Id"]; len(got) != 1 || got[0] != "req-B" {
		t.Errorf("trailer X-Request-Id = %q, want [req-B]", got)
	}
	if got := pw.h.Get(http.TrailerPrefix + "Server-Timing"); !strings.Contains(got, "winner=1 upstream=B") {
		t.Errorf("trailer Server-Timing = %q, want the race report", got)
	}
	<-hs.reports
}

// Every attempt failing after early headers ends the stream with an error
// event in the API's own format, never a clean empty end.
func TestEarlyHeadersFailureIsAnErrorEvent(t *testing.T) {
	cases := []struct {
		name, path, want string
	}{
		{"openai", "/v1/chat/completions", `data: {"error":{"message":"overloaded","type":"server_error","code":"x"}}` + "\n\n"},
		{"anthropic", "/v1/messages", "event: error\ndata: " + `{"error":{"message":"overloaded","type":"server_error","code":"x"}}` + "\n\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hs := newHarness(t, earlyConfig())
			pw := newPipeWriter()
			r := chatRequest("")
			r.URL.Path = tc.path
			a, b, done := stallBoth(t, hs, pw, r)
			hs.clock.Advance(900 * time.Millisecond)
			<-pw.writes
			a.reset()
			b.reset()
			// The resets are retryable: with max_attempts 2 nothing is left.
			got := <-pw.writes
			if !strings.HasPrefix(got, "data: {\"error\":") && !strings.HasPrefix(got, "event: error\n") {
				t.Fatalf("after every attempt failed: %q, want an error event", got)
			}
			<-done
			rep := <-hs.reports
			if rep.Outcome != OutcomeUpstreamError || rep.Status != 200 {
				t.Fatalf("report: Outcome %s, Status %d; want upstream_error, 200", rep.Outcome, rep.Status)
			}
		})
	}
	// The upstream's own JSON error is passed on as the event's data.
	for _, tc := range cases {
		t.Run(tc.name+"-upstream-body", func(t *testing.T) {
			cfg := earlyConfig()
			cfg.MaxAttempts = 1
			hs := newHarness(t, cfg)
			pw := newPipeWriter()
			r := chatRequest("")
			r.URL.Path = tc.path
			done := hs.serveVia(pw, r)
			a := hs.tr.next(t)
			hs.clock.waitArmed(t, 1) // the grace timer (no hedge timer: max_attempts 1)
			hs.clock.Advance(time.Second)
			<-pw.writes
			a.outcome <- roundTrip{resp: &http.Response{StatusCode: 503, Header: http.Header{"Content-Type": {"application/json"}},
				Body: nopBody(`{"error": {"message": "overloaded", "type": "server_error", "code": "x"}}`)}}
			if got := <-pw.writes; got != tc.want {
				t.Fatalf("error event = %q, want %q", got, tc.want)
			}
			<-done
			<-hs.reports
		})
	}
}

// The deadline passing after early headers is an error event too.
func TestEarlyHeadersDeadlineIsAnErrorEvent(t *testing.T) {
	cfg := earlyConfig()
	cfg.MaxAttempts = 1
	cfg.Timeout = config.Duration(5 * time.Second)
	hs := newHarness(t, cfg)
	pw := newPipeWriter()
	done := hs.serveVia(pw, chatRequest(""))
	a := hs.tr.next(t)
	hs.clock.waitArmed(t, 2) // the deadline and the grace timer
	a.respond(200, "text/event-stream")
	a.write(roleChunk)
	hs.clock.Advance(time.Second)
	<-pw.writes
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(4 * time.Second)
	got := <-pw.writes
	for got == ": keep-alive\n\n" {
		got = <-pw.writes
	}
	want := `data: {"error":{"message":"no upstream answered before the deadline","type":"upstream_error","code":"upstream_timeout"}}` + "\n\n"
	if got != want {
		t.Fatalf("after the deadline: %q, want %q", got, want)
	}
	<-done
	if rep := <-hs.reports; rep.Outcome != OutcomeTimeout {
		t.Fatalf("Outcome = %s, want timeout", rep.Outcome)
	}
}

// A fast failure keeps its real status: nothing is sent before the grace
// time, and a 401 that arrives first is the answer.
func TestEarlyHeadersKeepFastFailures(t *testing.T) {
	hs := newHarness(t, earlyConfig())
	res := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.outcome <- roundTrip{resp: &http.Response{StatusCode: 401, Header: http.Header{"Content-Type": {"application/json"}},
		Body: nopBody(`{"error":{"message":"bad key"}}`)}}
	s := <-res
	if s.rec.Code != 401 {
		t.Fatalf("status = %d, want the upstream's 401", s.rec.Code)
	}
	if rep := <-hs.reports; rep.EarlyHeaders {
		t.Fatalf("report EarlyHeaders = true for a fast failure")
	}
}

// Early headers are sent only for stream requests of SSE APIs, and not
// when the option is off.
func TestEarlyHeadersOnlyForSSEStreams(t *testing.T) {
	cases := []struct {
		name  string
		path  string
		body  string
		early config.Duration
	}{
		{"not a stream", "/v1/chat/completions", `{"model":"m","messages":[]}`, config.Duration(time.Second)},
		{"nested stream key", "/v1/chat/completions", `{"model":"m","metadata":{"stream":true}}`, config.Duration(time.Second)},
		{"ollama", "/api/chat", `{"model":"m","stream":true}`, config.Duration(time.Second)},
		{"off", "/v1/chat/completions", `{"model":"m","stream":true}`, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := earlyConfig()
			cfg.EarlyHeaders = tc.early
			cfg.MaxAttempts = 1
			hs := newHarness(t, cfg)
			r := chatRequest(tc.body)
			r.URL.Path = tc.path
			res := hs.serve(r)
			a := hs.tr.next(t)
			hs.clock.Advance(3 * time.Second) // past any grace time
			a.respond(200, "text/event-stream")
			a.write(tokenChunk("x"))
			a.end()
			s := <-res
			if got := bodyOf(s); got != tokenChunk("x") {
				t.Fatalf("body = %q, want the winner's only", got)
			}
			if rep := <-hs.reports; rep.EarlyHeaders {
				t.Fatalf("report EarlyHeaders = true")
			}
			hs.clock.mu.Lock()
			armed := len(hs.clock.timers)
			hs.clock.mu.Unlock()
			if armed != 0 {
				t.Fatalf("%d timers armed, want none (no grace timer, no hedge timer with max_attempts 1)", armed)
			}
		})
	}
}

// An upstream that answers a stream request with JSON after early headers
// cannot follow the SSE preamble: the client gets an error event.
func TestEarlyHeadersNonSSEWinner(t *testing.T) {
	cfg := earlyConfig()
	cfg.MaxAttempts = 1
	hs := newHarness(t, cfg)
	pw := newPipeWriter()
	done := hs.serveVia(pw, chatRequest(""))
	a := hs.tr.next(t)
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(time.Second)
	<-pw.writes
	a.respond(200, "application/json")
	a.write(`{"choices":[]}`)
	a.end()
	if got := <-pw.writes; !strings.Contains(got, `"code":"upstream_bad_response"`) {
		t.Fatalf("after a JSON winner: %q, want an upstream_bad_response error event", got)
	}
	<-done
	<-hs.reports
}

func TestAcceptsTrailers(t *testing.T) {
	for v, want := range map[string]bool{"trailers": true, "gzip, Trailers": true, "trailers;q=1": true, "gzip": false, "": false} {
		r := httptest.NewRequest("POST", "/", nil)
		if v != "" {
			r.Header.Set("TE", v)
		}
		if got := acceptsTrailers(r); got != want {
			t.Errorf("acceptsTrailers(TE: %q) = %v, want %v", v, got, want)
		}
	}
}

// nopBody is a response body that holds s.
func nopBody(s string) io.ReadCloser { return io.NopCloser(strings.NewReader(s)) }

// An idempotency leader's early headers and keep-alives reach a follower
// as they reached the leader's client, then the winner's bytes; the
// stored answer replays all of it with its own report.
func TestEarlyHeadersThroughIdempotencyFollower(t *testing.T) {
	hs := newHarness(t, earlyConfig())
	pw := newPipeWriter()
	_, b, done := stallBoth(t, hs, pw, keyed("", "k-early"))
	hs.clock.Advance(900 * time.Millisecond)
	<-pw.writes
	fw := newPipeWriter()
	followed := hs.serveVia(fw, keyed("", "k-early"))
	if got := <-fw.writes; got != ": keep-alive\n\n" {
		t.Fatalf("follower's first bytes = %q, want the leader's keep-alive", got)
	}
	b.write(tokenChunk("x"))
	b.write("data: [DONE]\n\n")
	b.end()
	<-done
	<-followed
	if fw.status != 200 || fw.h.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("follower: status %d, Content-Type %q; want the early 200 text/event-stream", fw.status, fw.h.Get("Content-Type"))
	}
	<-hs.reports
	<-hs.reports
	replay := <-hs.serve(keyed("", "k-early"))
	<-hs.reports
	want := ": keep-alive\n\n" + roleChunk + tokenChunk("x") + "data: [DONE]\n\n"
	if got := bodyOf(replay); got != want {
		t.Fatalf("replay body = %q, want %q", got, want)
	}
	if got := replay.rec.Header().Get("Server-Timing"); got != `llmhedge;desc="replayed attempts=0"` {
		t.Errorf("replay Server-Timing = %q", got)
	}
}
