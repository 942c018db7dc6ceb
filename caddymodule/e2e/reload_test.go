package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3/option"

	"github.com/llmhedge/llmhedge/internal/testkit/loadloop"
)

// TestReloadUnderLoadLosesNoRequest: clients stream without pause while the
// config is reloaded through the admin API several times (the delay
// changes, so each reload provisions new handlers). Every request must get
// its whole answer from exactly one upstream, and the gateway must have
// handled each request exactly once.
//
// A graceful reload of Caddy itself has a small race, whatever the handler:
// a request that arrives on a connection the old server is closing gets EOF
// before any response (with reverse_proxy instead of llm_hedge, 2 of 104
// requests across 12 reloads here). Production clients retry connection
// errors: the OpenAI SDK does by default, so the clients here keep its
// retries, and send an Idempotency-Key so that a resent request is joined
// or replayed by the gateway instead of raced twice upstream.
func TestReloadUnderLoadLosesNoRequest(t *testing.T) {
	const workers, reloads = 8, 6
	a, b := startSims(t)
	// A third of the requests need a hedge, more than the default budget
	// allows: the budget is off so that none waits for a stalled A.
	site := func(delay string) string {
		return strings.Replace(hedgeSite(a, b, "\t\tbudget {\n\t\t\tratio off\n\t\t}"), "delay 50ms", "delay "+delay, 1)
	}
	c := startCaddy(t, "", site("50ms"))
	ctx := testContext(t)

	var (
		mu       sync.Mutex
		total    int
		failures []error
	)
	completed := make(chan struct{}, workers)
	stop := make(chan struct{})
	wait := loadloop.Workers(workers, stop, func(w, i int) {
		id := fmt.Sprintf("reload-%d-%d", w, i)
		// Every third request needs the hedge; the others may be
		// won by either upstream (a loaded machine can make A
		// slower than the delay), but always by exactly one.
		behavior, winners := "", []string{"A", "B"}
		if i%3 == 0 {
			behavior, winners = "A=stall", []string{"B"}
		}
		got := streamChat(ctx, sdkClient(c.url(0), id, behavior),
			option.WithHeader("Idempotency-Key", id), option.WithMaxRetries(2))
		mu.Lock()
		total++
		if err := got.fromOneOf(winners, id); err != nil {
			failures = append(failures, fmt.Errorf("%s: %v", id, err))
		}
		mu.Unlock()
		select {
		case completed <- struct{}{}:
		default:
		}
	})

	// Reload while requests are in flight: wait for a few completions
	// between reloads so that every reload overlaps live streams.
	for r := 0; r < reloads; r++ {
		for n := 0; n < workers; n++ {
			select {
			case <-completed:
			case <-ctx.Done():
				mu.Lock()
				t.Fatalf("reload %d: %v after %d requests (failures %v)\n%s", r, ctx.Err(), total, failures, c.logs())
			}
		}
		delay := []string{"40ms", "60ms"}[r%2]
		if err := c.load(site(delay)); err != nil {
			t.Fatalf("reload %d: %v", r, err)
		}
	}
	close(stop)
	wait()
	for _, err := range failures {
		t.Error(err)
	}
	if total < workers*reloads {
		t.Fatalf("only %d requests ran across %d reloads", total, reloads)
	}
	t.Logf("%d requests across %d reloads, %d failed", total, reloads, len(failures))

	// Every request reached the gateway and none failed there. (A request
	// hit by the reload race may be logged twice: client_gone, then ok or
	// replayed for the SDK's retry.)
	lines := c.waitLog("llm_hedge request", total, nil)
	for _, line := range lines {
		switch line["outcome"] {
		case "ok", "client_gone", "replayed", "joined":
		default:
			t.Errorf("log line %v", line)
		}
	}
}
