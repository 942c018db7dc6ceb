package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestHedgeWinsOnFirstToken: A answers 200 at once, sends a role-only chunk
// and pings, then stalls before its first token (the case header racing
// misses). The hedge to B must start after the delay, win, and A must be
// cancelled. Each upstream gets its own key and model, both the same
// idempotency key.
func TestHedgeWinsOnFirstToken(t *testing.T) {
	a, b := startSims(t)
	c := startCaddy(t, "", hedgeSite(a, b, ""))
	ctx := testContext(t)

	got := streamChat(ctx, sdkClient(c.url(0), "hedge-1", "A=stall"))
	if err := got.fromOnly("B", "hedge-1"); err != nil {
		t.Fatal(err)
	}
	if !got.models["model-b"] {
		t.Fatalf("models %v, want B's model-b only", got.models)
	} else if len(got.models) != 1 {
		t.Fatalf("len(got.models) = %v, want 1", len(got.models))
	}
	if err := a.WaitFor(ctx, func() bool { return a.Cancelled() == 1 }); err != nil {
		t.Fatalf("A's stalled attempt was not cancelled: %v", err)
	}
	ra, rb := a.Requests(), b.Requests()
	if len(ra) != 1 {
		t.Fatalf("len(ra) = %v, want 1", len(ra))
	} else if len(rb) != 1 {
		t.Fatalf("len(rb) = %v, want 1", len(rb))
	}
	if ra[0].Authorization != "Bearer sk-A-secret" {
		t.Errorf("ra[0].Authorization = %q, want \"Bearer sk-A-secret\"", ra[0].Authorization)
	} else if rb[0].Authorization != "Bearer sk-B-secret" {
		t.Errorf("rb[0].Authorization = %q, want \"Bearer sk-B-secret\"", rb[0].Authorization)
	}
	if ra[0].Model != "model-a" {
		t.Errorf("ra[0].Model = %q, want \"model-a\"", ra[0].Model)
	} else if rb[0].Model != "model-b" {
		t.Errorf("rb[0].Model = %q, want \"model-b\"", rb[0].Model)
	}
	if ra[0].IdempotencyKey == "" {
		t.Errorf("ra[0].IdempotencyKey = \"\", want a non-empty value")
	} else if ra[0].IdempotencyKey != rb[0].IdempotencyKey {
		t.Errorf("ra[0].IdempotencyKey = %q, want %q", ra[0].IdempotencyKey, rb[0].IdempotencyKey)
	}
	if ra[0].Attempt != "0" {
		t.Errorf("ra[0].Attempt = %q, want \"0\"", ra[0].Attempt)
	} else if rb[0].Attempt != "1" {
		t.Errorf("rb[0].Attempt = %q, want \"1\"", rb[0].Attempt)
	}

	// One structured line per request, at info, without credentials. (The
	// outcome may read client_gone: the SDK closes the stream at [DONE],
	// sometimes before core has read the upstream's end; reported in
	// /tmp/core-bugs.md.)
	line := c.waitLog("llm_hedge request", 1, nil)[0]
	if line["winner_upstream"] != "B" {
		t.Errorf("line[\"winner_upstream\"] = %q, want \"B\"", line["winner_upstream"])
	} else if line["winner_attempt"] != float64(1) {
		t.Errorf("line[\"winner_attempt\"] = %v, want %v", line["winner_attempt"], float64(1))
	} else if line["attempts"] != float64(2) {
		t.Errorf("line[\"attempts\"] = %v, want %v", line["attempts"], float64(2))
	} else if line["level"] != "info" {
		t.Errorf("line[\"level\"] = %q, want \"info\"", line["level"])
	} else if line["status"] != float64(200) {
		t.Errorf("line[\"status\"] = %v, want %v", line["status"], float64(200))
	}
	for _, secret := range []string{"sk-A-secret", "sk-B-secret", "sk-client-key"} {
		if strings.Contains(c.logs(), secret) {
			t.Errorf("caddy's log contains %q", secret)
		}
	}
}

// TestNoHedgeWhenFast: a primary that answers before the delay wins alone.
func TestNoHedgeWhenFast(t *testing.T) {
	a, b := startSims(t)
	c := startCaddy(t, "", hedgeSite(a, b, ""))
	got := streamChat(testContext(t), sdkClient(c.url(0), "fast-1", ""))
	if err := got.fromOnly("A", "fast-1"); err != nil {
		t.Fatal(err)
	}
	// wall clock: the delay's own duration is the thing under test (an
	// answer before it starts no hedge); A's 10ms against the 50ms delay
	// of an external Caddy process, which has no clock to inject.
	if b.Served() != 0 {
		t.Fatalf("B served %d requests; no hedge should start before the delay", b.Served())
	}
}

// TestSSEFlushedPerEvent: the client sees the first token while the
// upstream still holds the rest of the stream.
func TestSSEFlushedPerEvent(t *testing.T) {
	up := llmsim.StartGated(2, true)
	t.Cleanup(up.Close)
	c := startCaddy(t, "", fmt.Sprintf("\tllm_hedge %s {\n\t\tdelay 1s\n\t}", up.URL))
	ctx := testContext(t)

	// If the gateway buffered, the first token would only arrive after
	// release; this guard releases late so that the test fails instead of
	// hanging.
	guard := time.AfterFunc(10*time.Second, func() { close(up.Release) })
	defer guard.Stop()
	released := false

	client := sdkClient(c.url(0), "flush-1", "")
	stream := client.Chat.Completions.NewStreaming(ctx, chatParams())
	defer stream.Close()
	var text strings.Builder
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			text.WriteString(ch.Delta.Content)
			if ch.Delta.Content == llmsim.TokenText("flush-1", 0) && !released {
				if !guard.Stop() {
					t.Fatal("the first token arrived only after the upstream's stream was released: not flushed per event")
				}
				close(up.Release)
				released = true
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream error %v", err)
	}
	if want := llmsim.ExpectedChatText("flush-1", 2); text.String() != want {
		t.Fatalf("text %q, want %q", text.String(), want)
	}
	if !released {
		t.Fatal("the first token never arrived before the stream ended")
	}
}

// TestPlaceholdersAndReportHeader: {http.llm_hedge.*} reach the access log
// through log_append, and report_header reports the race to the client.
func TestPlaceholdersAndReportHeader(t *testing.T) {
	a, b := startSims(t)
	site := "\tlog\n" +
		"\tlog_append hedge_winner {http.llm_hedge.winner}\n" +
		"\tlog_append hedge_attempts {http.llm_hedge.attempts}\n" +
		"\tlog_append hedge_ttft_ms {http.llm_hedge.ttft_ms}\n" +
		hedgeSite(a, b, "\t\treport_header X-LLM-Hedge-Report")
	c := startCaddy(t, "", site)

	resp, err := http.DefaultClient.Do(rawChatRequest(c.url(0), "ph-1", "A=stall"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	report := resp.Header.Get("X-LLM-Hedge-Report")
	if !strings.Contains(report, "attempts=2") {
		t.Fatalf("report = %q, want it to contain \"attempts=2\"", report)
	} else if !strings.Contains(report, "upstream=B") {
		t.Fatalf("report = %q, want it to contain \"upstream=B\"", report)
	}
	access := c.waitLog("handled request", 1, nil)[0]
	if access["hedge_winner"] != "B" {
		t.Fatalf("access[\"hedge_winner\"] = %q, want \"B\"", access["hedge_winner"])
	} else if fmt.Sprint(access["hedge_attempts"]) != "2" {
		t.Fatalf("fmt.Sprint(access[\"hedge_attempts\"]) = %q, want \"2\"", fmt.Sprint(access["hedge_attempts"]))
	}
	// B starts after the 50ms delay: the client's TTFT cannot be less.
	if ttft, err := strconv.Atoi(fmt.Sprint(access["hedge_ttft_ms"])); err != nil || ttft < 50 {
		t.Fatalf("hedge_ttft_ms %v, want >= 50", access["hedge_ttft_ms"])
	}
}

// TestClientDisconnectCancelsAttempts: a client that goes away while both
// attempts wait for their first token cancels both upstream requests.
func TestClientDisconnectCancelsAttempts(t *testing.T) {
	a, b := startSims(t)
	c := startCaddy(t, "", hedgeSite(a, b, ""))
	ctx := testContext(t)
	clientCtx, cancel := context.WithCancel(ctx)
	done := make(chan streamed, 1)
	go func() { done <- streamChat(clientCtx, sdkClient(c.url(0), "gone-1", "*=stall")) }()

	// Both attempts are running (the hedge started after the delay)...
	both := func() bool { return a.Served() == 1 && b.Served() == 1 }
	if err := a.WaitFor(ctx, func() bool { return a.Served() == 1 }); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitFor(ctx, both); err != nil {
		t.Fatalf("the hedge to B never started: %v", err)
	}
	// ...then the client goes away: every attempt must be cancelled.
	cancel()
	if got := <-done; got.err == nil {
		t.Fatal("the client's stream ended without an error after its cancellation")
	}
	for _, up := range []*llmsim.Running{a, b} {
		if err := up.WaitFor(ctx, func() bool { return up.Cancelled() == 1 && up.InFlight() == 0 }); err != nil {
			t.Fatalf("upstream %s still has the attempt: cancelled %d, in flight %d", up.Name, up.Cancelled(), up.InFlight())
		}
	}
	line := c.waitLog("llm_hedge request", 1, nil)[0]
	if line["outcome"] != "client_gone" {
		t.Fatalf("outcome %v, want client_gone", line["outcome"])
	}
}
