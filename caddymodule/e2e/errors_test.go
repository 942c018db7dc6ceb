package e2e

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestRetryableUpstreamFailures: a primary that fails before its first
// token (5xx, 429 with Retry-After, a reset, an error event, [DONE] without
// output) is retried on B at once, and the client gets B's whole answer.
func TestRetryableUpstreamFailures(t *testing.T) {
	a, b := startSims(t)
	// Short cool-downs and a lenient breaker: each case starts on A again.
	c := startCaddy(t, "", hedgeSite(a, b, "\t\tbudget {\n\t\t\tcool_down 1ms\n\t\t\tmax_cool_down 1ms\n\t\t\tbreaker_failures 100\n\t\t}"))
	ctx := testContext(t)
	for _, tc := range []struct{ id, behavior string }{
		{"fail-500", "A=status:500"},
		{"fail-503", "A=status:503"},
		{"fail-429", "A=status:429,retry_after:1"},
		{"fail-reset", "A=reset_after:0"},
		{"fail-error-event", "A=error_event"},
		{"fail-done-early", "A=done_early"},
	} {
		t.Run(tc.behavior, func(t *testing.T) {
			got := streamChat(ctx, sdkClient(c.url(0), tc.id, tc.behavior))
			if err := got.fromOnly("B", tc.id); err != nil {
				t.Fatal(err)
			}
			if a.Attempts(tc.id) != 1 {
				t.Fatalf("a.Attempts(tc.id) = %v, want 1", a.Attempts(tc.id))
			} else if b.Attempts(tc.id) != 1 {
				t.Fatalf("b.Attempts(tc.id) = %v, want 1", b.Attempts(tc.id))
			}
		})
	}
	lines := c.waitLog("llm_hedge request", 6, nil)
	for _, line := range lines {
		if line["winner_upstream"] != "B" {
			t.Errorf("log line %v: want B as winner", line)
		}
	}
}

// TestEveryAttemptFails: when both upstreams fail, the client gets the most
// useful upstream error: its status and its JSON body.
func TestEveryAttemptFails(t *testing.T) {
	a, b := startSims(t)
	c := startCaddy(t, "", hedgeSite(a, b, ""))
	ctx := testContext(t)

	got := streamChat(ctx, sdkClient(c.url(0), "both-429", "A=status:500;B=status:429"))
	if status := apiStatus(got.err); status != http.StatusTooManyRequests {
		t.Fatalf("error %v (status %d), want the 429", got.err, status)
	}
	var apiErr *openai.Error
	if !errors.As(got.err, &apiErr) {
		t.Fatalf("error %v (%T), want an *openai.Error", got.err, got.err)
	} else if !strings.Contains(apiErr.Message, "simulated 429 from upstream B") {
		t.Fatalf("error message %q does not carry the upstream's \"simulated 429 from upstream B\"", apiErr.Message)
	}
}

// TestRetryAfterCoolsUpstreamDown: a 429 with Retry-After cools A down, so
// the next request starts on B without trying A.
func TestRetryAfterCoolsUpstreamDown(t *testing.T) {
	a, b := startSims(t)
	c := startCaddy(t, "", hedgeSite(a, b, ""))
	ctx := testContext(t)
	if err := streamChat(ctx, sdkClient(c.url(0), "cool-1", "A=status:429,retry_after:30")).fromOnly("B", "cool-1"); err != nil {
		t.Fatal(err)
	}
	if err := streamChat(ctx, sdkClient(c.url(0), "cool-2", "")).fromOnly("B", "cool-2"); err != nil {
		t.Fatal(err)
	}
	if n := a.Attempts("cool-2"); n != 0 {
		t.Fatalf("A got %d attempts while cooling down after its 429", n)
	}
}

// TestBrokenStreamAfterCommit: when the winner breaks after its first
// tokens went out, the client must see a broken stream, not a clean end,
// and never bytes from another upstream.
func TestBrokenStreamAfterCommit(t *testing.T) {
	a, b := startSims(t)
	c := startCaddy(t, "", hedgeSite(a, b, ""))

	// Through the SDK: the stream ends with an error.
	got := streamChat(testContext(t), sdkClient(c.url(0), "broken-1", "A=reset_after:2;B=stall"))
	if got.err == nil {
		t.Fatalf("the SDK saw a clean end of a broken stream (text %q)", got.text)
	}
	if got.text != llmsim.TokenText("broken-1", 0)+llmsim.TokenText("broken-1", 1) {
		t.Fatalf("got.text = %q, want %q", got.text, llmsim.TokenText("broken-1", 0)+llmsim.TokenText("broken-1", 1))
	} else if len(got.ids) != 1 {
		t.Fatalf("len(got.ids) = %v, want 1", len(got.ids))
	} else if !got.ids["chatcmpl-A-broken-1"] {
		t.Fatalf("text %q from %v: want A's first two tokens only", got.text, got.ids)
	}

	// On the wire: the chunked body ends without its terminator.
	resp, err := http.DefaultClient.Do(rawChatRequest(c.url(0), "broken-2", "A=reset_after:2;B=stall"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != io.ErrUnexpectedEOF {
		t.Fatalf("read error %v after %q, want io.ErrUnexpectedEOF (a cut chunked stream)", err, body)
	}
	line := c.waitLog("llm_hedge request", 2, nil)[1]
	if line["outcome"] != "stream_failed" {
		t.Fatalf("outcome %v, want stream_failed", line["outcome"])
	}
}

// TestStreamErrorEvent: with stream_error_event the same failure ends the
// stream with an SSE error event, which the SDK reports as an error.
func TestStreamErrorEvent(t *testing.T) {
	a, b := startSims(t)
	c := startCaddy(t, "", hedgeSite(a, b, "\t\tstream_error_event"))
	got := streamChat(testContext(t), sdkClient(c.url(0), "event-1", "A=reset_after:2;B=stall"))
	if got.err == nil {
		t.Fatalf("got.err = nil, want an error")
	} else if !strings.Contains(got.err.Error(), "broke off its answer") {
		t.Fatalf("got.err.Error() = %q, want it to contain \"broke off its answer\"", got.err.Error())
	}
}
