package core

import (
	"strings"
	"testing"
)

// An upstream that ends its body cleanly inside an SSE line, after commit:
// the client's answer is cut, never complete.
func TestStreamEndedMidLineIsCut(t *testing.T) {
	for name, end := range map[string]struct {
		last    string
		aborted bool
	}{
		"mid-line":                        {"data: {\"choices\":[{\"in", true},
		"at a line end":                   {"data: [DONE]\n", false},
		"at event end":                    {"data: [DONE]\n\n", false},
		"after a lone CR":                 {"data: [DONE]\r", false},
		"[DONE] without a line end":       {"data: [DONE]", false},
		"message_stop without a line end": {"event: message_stop\ndata: {\"type\":\"message_stop\"}", false},
	} {
		t.Run(name, func(t *testing.T) {
			hs := newHarness(t, testConfig())
			out := hs.serve(chatRequest(""))
			a := hs.tr.next(t)
			a.respond(200, "text/event-stream")
			a.write(tokenChunk("one"))
			a.write(end.last)
			a.end()
			res := <-out
			if got := res.err == ErrStreamAborted; got != end.aborted {
				t.Fatalf("Handle = %v after %q, want aborted %v", res.err, end.last, end.aborted)
			}
			rep := <-hs.reports
			if end.aborted && rep.Outcome != OutcomeStreamFailed {
				t.Fatalf("outcome %q, want %q", rep.Outcome, OutcomeStreamFailed)
			}
		})
	}
}

// A non-streaming JSON answer larger than max_prefix is streamed; if the
// upstream ends it cleanly with the document still open, it is cut.
func TestLargeJSONEndedOpenIsCut(t *testing.T) {
	big := `{"choices":[{"message":{"content":"` + strings.Repeat("x", 4096) + `"}}]}`
	for name, tc := range map[string]struct {
		body    string
		aborted bool
	}{
		"whole":            {big, false},
		"cut in a string":  {big[:2000], true},
		"cut after string": {big[:len(big)-3], true},
		"escaped quote":    {`{"a":"\"` + strings.Repeat("y", 3000) + `\""}`, false},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			cfg.MaxPrefix = 1024
			hs := newHarness(t, cfg)
			r := chatRequest(`{"model":"m"}`)
			out := hs.serve(r)
			a := hs.tr.next(t)
			a.respond(200, "application/json")
			a.write(tc.body)
			a.end()
			res := <-out
			if got := res.err == ErrStreamAborted; got != tc.aborted {
				t.Fatalf("Handle = %v, want aborted %v", res.err, tc.aborted)
			}
			if bodyOf(res) != tc.body {
				t.Fatalf("client got %d bytes, want the %d the upstream sent", len(bodyOf(res)), len(tc.body))
			}
		})
	}
}

// Every attempt's stream ends cleanly inside a line before any output: no
// attempt answered, so the client gets an error, not the broken bytes as a
// complete empty answer.
func TestEveryStreamEndedMidLineIsAnError(t *testing.T) {
	cfg := testConfig()
	cfg.Budget.Ratio = -1
	hs := newHarness(t, cfg)
	out := hs.serve(chatRequest(""))
	for i := 0; i < 2; i++ {
		a := hs.tr.next(t)
		a.respond(200, "text/event-stream")
		a.write(roleChunk)
		a.write("data: {\"choices\":[{\"ind")
		a.end()
	}
	res := <-out
	if res.rec.Code != 502 {
		t.Fatalf("status %d with body %q, want 502", res.rec.Code, bodyOf(res))
	}
}
