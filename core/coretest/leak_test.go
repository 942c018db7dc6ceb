package coretest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	"go.uber.org/goleak"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// fault is one injected failure and what the client must see because of it.
type fault struct {
	behavior string // X-Sim-Behavior, "" for none
	cancelAt int    // cancel the client after reading this many bytes (0: never)
	want     string // "ok", "broken" (cut after commit), "error" (an error status)
}

var faults = []fault{
	{want: "ok"},
	{behavior: "A=status:500", want: "ok"},                         // retried on B at once
	{behavior: "A=status:429,retry_after:0", want: "ok"},           // retried on B
	{behavior: "A=reset_after:0", want: "ok"},                      // reset before output: B
	{behavior: "A=error_event", want: "ok"},                        // error event before output: B
	{behavior: "A=done_early", want: "ok"},                         // [DONE] before output: B
	{behavior: "A=stall", want: "ok"},                              // hedge wins
	{behavior: "A=stall;B=stall", cancelAt: -1, want: "cancelled"}, // client gives up
	{behavior: "*=status:503,retry_after:0", want: "error"},        // both fail: 503
	{behavior: "*=reset_after:3", want: "broken"},                  // cut after commit
	{cancelAt: 300, want: "cancelled"},                             // client leaves mid-stream
	{behavior: "*=status:400", want: "error"},                      // fatal, not hedged
}

// TestNoLeaksUnderFaults sends 2,000 requests with injected faults through
// the core and checks every outcome, then that no goroutine is left.
func TestNoLeaksUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 2,000 faulted requests, over a minute under -race")
	}
	ignore := goleak.IgnoreCurrent()
	w := llmsim.Reference(7, 0.02)
	cfg := config.Config{Delay: config.DelayConfig{Fixed: config.Duration(30 * time.Millisecond)}, Timeout: config.Duration(5 * time.Second),
		Budget: config.BudgetConfig{Ratio: -1, CoolDown: config.Duration(time.Millisecond), MaxCoolDown: config.Duration(time.Millisecond), BreakerFailures: 1 << 20, OverloadRate: 1}}
	r := newRig(t, w, cfg)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	const n, conc = 2000, 20
	rng := rand.New(rand.NewSource(1))
	plan := make([]fault, n)
	for i := range plan {
		plan[i] = faults[rng.Intn(len(faults))]
	}
	var mu sync.Mutex
	bad := []string{}
	seen := map[string]int{}
	next := make(chan int)
	var wg sync.WaitGroup
	for c := 0; c < conc; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f := plan[i]
				got := sendWithFault(client, r.front.URL, fmt.Sprintf("leak-%d", i), f)
				mu.Lock()
				seen[got]++
				// Upstream health is shared: another request's 429/503 may
				// cool an upstream down so that a retry has nowhere to go
				// and the client gets that clean error instead. Anything
				// else (a wrong, spliced or cut answer) is a failure.
				// Likewise a done_early upstream's complete answer without
				// output goes to the client when the retry has nowhere to go:
				// it outranks the errors.
				if got != f.want && !(f.want == "ok" && got == "error") &&
					!(f.behavior == "A=done_early" && got == "empty") {
					bad = append(bad, fmt.Sprintf("leak-%d %+v: got %s", i, f, got))
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d unexpected outcomes, e.g. %v", len(bad), bad[:min(5, len(bad))])
	}
	t.Logf("outcomes over %d requests: %v", n, seen)
	if seen["ok"] < n/2 {
		t.Fatalf("only %d of %d requests answered", seen["ok"], n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Each server is waited on by its own signal: a condition on both,
	// woken by A's alone, misses B's last handler ending after A's.
	errA := r.a.WaitFor(ctx, func() bool { return r.a.InFlight() == 0 })
	errB := r.b.WaitFor(ctx, func() bool { return r.b.InFlight() == 0 })
	if errA != nil || errB != nil {
		t.Fatalf("upstream handlers still running: A %d, B %d", r.a.InFlight(), r.b.InFlight())
	}
	// Close the client side and the servers, then nothing of ours may be
	// left: not a handler, attempt, timer goroutine or connection.
	client.CloseIdleConnections()
	r.close()
	goleak.VerifyNone(t, ignore)
}

// sendWithFault sends one streaming request and classifies what came back.
func sendWithFault(client *http.Client, base, id string, f fault) string {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := fmt.Sprintf(`{"model":"gpt-sim","stream":true,"messages":[{"role":"user","content":"%s"}]}`, id)
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set(llmsim.HeaderRequest, id)
	if f.behavior != "" {
		req.Header.Set(llmsim.HeaderBehavior, f.behavior)
	}
	if f.cancelAt < 0 {
		// Give up after a while without an answer, as a client would.
		time.AfterFunc(100*time.Millisecond, cancel)
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return "cancelled"
		}
		return "transport error: " + err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		io.Copy(io.Discard, resp.Body)
		return "error"
	}
	var got []byte
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		got = append(got, buf[:n]...)
		if f.cancelAt > 0 && len(got) >= f.cancelAt {
			cancel()
			return "cancelled"
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return "broken"
		}
	}
	// A race still undecided after the grace time sent its headers early:
	// keep-alive comments, then the winner's bytes or an error event.
	for bytes.HasPrefix(got, []byte(": keep-alive\n\n")) {
		got = got[len(": keep-alive\n\n"):]
	}
	if bytes.HasPrefix(got, []byte(`data: {"error":`)) {
		return "error"
	}
	clean := llmsim.StripPings(got)
	for _, up := range []string{"A", "B"} {
		full := string(llmsim.ExpectedStream(up, "gpt-sim", id, 20))
		if string(clean) == full {
			return "ok"
		}
		// done_early: the role chunk, then [DONE].
		if preamble, _, ok := strings.Cut(full, "\n\n"); ok && string(clean) == preamble+"\n\ndata: [DONE]\n\n" {
			return "empty"
		}
	}
	return fmt.Sprintf("wrong answer %.120q", clean)
}
