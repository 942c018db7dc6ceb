package core

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// answerStatus answers a call at once with status, a JSON error body and
// the given header pairs.
func answerStatus(c *call, status int, header ...string) {
	h := http.Header{"Content-Type": {"application/json"}}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	c.outcome <- roundTrip{resp: &http.Response{StatusCode: status, Header: h,
		Body: nopBody(`{"error":{"message":"upstream says ` + http.StatusText(status) + `"}}`)}}
}

// When every upstream failed, the answer tells the client's SDK not to
// retry (its retries would run the same race twice more), with the
// soonest Retry-After any upstream gave.
func TestExhaustedRaceSaysDoNotRetry(t *testing.T) {
	cases := []struct {
		name           string
		a, b           int
		aHdr, bHdr     []string
		wantStatus     int
		wantRetry      string
		wantRetryAfter string
	}{
		{"both 500", 500, 500, nil, nil, 500, "false", ""},
		{"429 keeps its own Retry-After", 429, 503, []string{"Retry-After", "7"}, []string{"Retry-After", "3"}, 429, "false", "7"},
		{"soonest Retry-After of the others", 500, 503, nil, []string{"Retry-After", "5"}, 500, "false", "5"},
		{"upstream's x-should-retry true is overridden", 500, 502, []string{"X-Should-Retry", "true"}, nil, 500, "false", ""},
		{"fatal 400 is left alone", 400, 0, nil, nil, 400, "", ""},
		{"409 is not the gateway's to retry", 409, 0, nil, nil, 409, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.ReportHeader = "Server-Timing"
			hs := newHarness(t, cfg)
			res := hs.serve(chatRequest(`{"model":"m","messages":[]}`))
			answerStatus(hs.tr.next(t), tc.a, tc.aHdr...)
			if tc.b != 0 {
				answerStatus(hs.tr.next(t), tc.b, tc.bHdr...) // the retry after the only attempt failed
			}
			s := <-res
			<-hs.reports
			if s.rec.Code != tc.wantStatus {
				t.Fatalf("status = %d, want %d", s.rec.Code, tc.wantStatus)
			}
			if got := s.rec.Header().Get("X-Should-Retry"); got != tc.wantRetry {
				t.Errorf("X-Should-Retry = %q, want %q", got, tc.wantRetry)
			}
			if got := s.rec.Header().Get("Retry-After"); got != tc.wantRetryAfter {
				t.Errorf("Retry-After = %q, want %q", got, tc.wantRetryAfter)
			}
			if got := s.rec.Header().Get("Server-Timing"); !strings.Contains(got, "winner=none outcome=") {
				t.Errorf("Server-Timing = %q, want a report of the failed race", got)
			}
		})
	}
}

// A hedge the budget denies still leaves the client nothing to gain from
// a retry: the generated 502 says so too.
func TestDeniedRetrySaysDoNotRetry(t *testing.T) {
	cfg := testConfig()
	cfg.MaxAttempts = 1
	hs := newHarness(t, cfg)
	res := hs.serve(chatRequest(`{"model":"m","messages":[]}`))
	hs.tr.next(t).fail(errConnRefused{})
	s := <-res
	rep := <-hs.reports
	if s.rec.Code != 502 || s.rec.Header().Get("X-Should-Retry") != "false" {
		t.Fatalf("status %d, X-Should-Retry %q; want 502, false", s.rec.Code, s.rec.Header().Get("X-Should-Retry"))
	}
	if len(rep.Denials) != 1 || rep.Denials[0] != DenyMaxAttempts {
		t.Fatalf("Denials = %v, want [max_attempts]", rep.Denials)
	}
}

type errConnRefused struct{}

func (errConnRefused) Error() string { return "connection refused" }

// The route's own deadline: 504, not to be retried.
func TestTimeoutSaysDoNotRetry(t *testing.T) {
	cfg := testConfig()
	cfg.MaxAttempts = 1
	cfg.Timeout = config.Duration(2 * time.Second)
	cfg.EarlyHeaders = -1
	cfg.ReportHeader = "Server-Timing"
	hs := newHarness(t, cfg)
	res := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	hs.clock.waitArmed(t, 1)
	a.respond(200, "text/event-stream")
	a.write(roleChunk)
	hs.clock.Advance(2 * time.Second)
	s := <-res
	<-hs.reports
	if s.rec.Code != 504 || s.rec.Header().Get("X-Should-Retry") != "false" {
		t.Fatalf("status %d, X-Should-Retry %q; want 504, false", s.rec.Code, s.rec.Header().Get("X-Should-Retry"))
	}
	if got := s.rec.Header().Get("Server-Timing"); got != `llmhedge;desc="attempts=1 winner=none outcome=timeout delay_ms=100"` {
		t.Errorf("Server-Timing = %q", got)
	}
}

// A request refused before any upstream was tried reports that it made
// no attempts.
func TestRejectedRequestReport(t *testing.T) {
	cfg := testConfig()
	cfg.ReportHeader = "Server-Timing"
	hs := newHarness(t, cfg)
	s := <-hs.serve(chatRequest(`{"model":`))
	<-hs.reports
	if s.rec.Code != 400 || s.rec.Header().Get("Server-Timing") != `llmhedge;desc="rejected attempts=0"` {
		t.Fatalf("status %d, Server-Timing %q", s.rec.Code, s.rec.Header().Get("Server-Timing"))
	}
}

// hedge_stored_responses: a default Responses API call (no "store") is
// hedged; background jobs, conversations and acting tools are not.
func TestHedgeStoredResponses(t *testing.T) {
	cases := []struct {
		name   string
		option bool
		body   string
		hedged bool
	}{
		{"default call, option off", false, `{"model":"m","input":"hi","stream":true}`, false},
		{"default call", true, `{"model":"m","input":"hi","stream":true}`, true},
		{"store true", true, `{"model":"m","input":"hi","store":true}`, true},
		{"previous_response_id", true, `{"model":"m","input":"hi","previous_response_id":"resp_1"}`, true},
		{"background", true, `{"model":"m","input":"hi","background":true}`, false},
		{"conversation", true, `{"model":"m","input":"hi","conversation":"conv_1"}`, false},
		{"acting tool", true, `{"model":"m","input":"hi","tools":[{"type":"code_interpreter"}]}`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.HedgeStoredResponses = tc.option
			cfg.EarlyHeaders = -1
			hs := newHarness(t, cfg)
			r := chatRequest(tc.body)
			r.URL.Path = "/v1/responses"
			res := hs.serve(r)
			a := hs.tr.next(t)
			a.respond(200, "text/event-stream")
			hs.clock.waitArmed(t, 1)
			hs.clock.Advance(100 * time.Millisecond)
			delta := "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n"
			if tc.hedged {
				b := hs.tr.next(t)
				b.respond(200, "text/event-stream")
				b.write(delta)
				b.end()
			} else {
				a.write(delta)
				a.end()
			}
			<-res
			rep := <-hs.reports
			if tc.hedged && rep.Winner != 1 {
				t.Fatalf("Winner = %d, want 1 (the hedge)", rep.Winner)
			}
			if !tc.hedged && (len(rep.Attempts) != 1 || len(rep.Denials) != 1 || rep.Denials[0] != DenyNotIdempotent) {
				t.Fatalf("%d attempts, denials %v; want one attempt, [not_idempotent]", len(rep.Attempts), rep.Denials)
			}
		})
	}
}

// With the default max_attempts (3) a request whose upstreams all fail is
// tried three times, the third on the first upstream again; after a 429
// it is retried only on an upstream not tried yet.
func TestDefaultRaceRetriesThriceButNotARateLimit(t *testing.T) {
	for _, status := range []int{500, 429} {
		cfg := testConfig()
		cfg.MaxAttempts = 0 // the default
		hs := newHarness(t, cfg)
		res := hs.serve(chatRequest(`{"model":"m","messages":[]}`))
		var hosts []string
		want := map[int]string{500: "a.test b.test a.test", 429: "a.test b.test"}[status]
		for i := 0; i < len(strings.Fields(want)); i++ {
			c := hs.tr.next(t)
			hosts = append(hosts, c.req.URL.Host)
			answerStatus(c, status)
		}
		s := <-res
		<-hs.reports
		if got := strings.Join(hosts, " "); got != want || s.rec.Code != status || hs.tr.count() != len(hosts) {
			t.Errorf("every upstream answering %d: attempts to %s (%d in all), status %d; want %s, %d",
				status, got, hs.tr.count(), s.rec.Code, want, status)
		}
	}
}
