package e2e

import (
	"io"
	"net/http"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestIdempotencyJoinAndReplay: two requests with one Idempotency-Key
// arriving together make one race (the second joins it) and get the same
// bytes; a third after the end is replayed from the gateway's store.
func TestIdempotencyJoinAndReplay(t *testing.T) {
	a, b := startSims(t)
	c := startCaddy(t, "", hedgeSite(a, b, ""))
	post := func() (*http.Response, string) {
		// A never sends a token: the hedge (B) wins however slow the
		// machine, and the race lasts at least the 50ms delay.
		req := rawChatRequest(c.url(0), "idem-1", "A=stall")
		req.Header.Set("Idempotency-Key", "idem-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return nil, ""
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Error(err)
		}
		return resp, string(llmsim.StripPings(body))
	}
	bodies := make(chan string, 2)
	for i := 0; i < 2; i++ {
		go func() { _, body := post(); bodies <- body }()
	}
	first, second := <-bodies, <-bodies
	want := string(llmsim.ExpectedStream("B", "model-b", "idem-1", simTokens))
	if first != want {
		t.Fatalf("first = %v, want %v", first, want)
	} else if second != want {
		t.Fatalf("second = %v, want %v", second, want)
	}
	resp, third := post()
	if third != want {
		t.Fatalf("third request: third = %v, want %v", third, want)
	} else if resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("third request: resp.Header.Get(\"Idempotent-Replayed\") = %q, want \"true\"", resp.Header.Get("Idempotent-Replayed"))
	}
	if a.Attempts("idem-1") != 1 {
		t.Fatalf("a.Attempts(\"idem-1\") = %v, want 1", a.Attempts("idem-1"))
	} else if b.Attempts("idem-1") != 1 {
		t.Fatalf("b.Attempts(\"idem-1\") = %v, want 1", b.Attempts("idem-1"))
	}
}
