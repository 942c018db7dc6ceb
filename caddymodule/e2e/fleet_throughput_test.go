package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/envgate"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// Keyed requests per second with the fleet on and off: 20 clients, unique
// keys, a fast upstream, one Caddy.
func TestFleetBenchThroughput(t *testing.T) {
	envgate.FleetBench(t)
	// TokenGap 0 would be the workload default (20ms): a microsecond.
	w := llmsim.Workload{MedianTTFT: time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 5, TokenGap: time.Microsecond, PingEvery: time.Second}
	sim := llmsim.Start("A", w)
	defer sim.Close()
	redis := redisproc.Start(t, redisproc.Options{})
	off := startCaddy(t, "", fmt.Sprintf("\tllm_hedge {\n\t\troute fleet\n\t\tupstream %s {\n\t\t\tname A\n\t\t}\n\t\tmax_attempts 1\n\t}", sim.URL))
	on := startCaddy(t, "", fleetSite(sim, redis.URL()))
	run := func(c *caddyProc, prefix string) float64 {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var count atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for g := 0; g < 20; g++ {
			g := g
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					if _, err := eventTimes(ctx, client, c.url(0), fmt.Sprintf("%s-%d-%d", prefix, g, i), nil); err == nil {
						count.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		return float64(count.Load()) / time.Since(start).Seconds()
	}
	run(off, "warm-off")
	run(on, "warm-on")
	offRate := run(off, "off")
	onRate := run(on, "on")
	t.Logf("keyed requests/s, 20 clients, one Caddy: fleet off %.0f, fleet on %.0f (%.0f%%)", offRate, onRate, 100*onRate/offRate)
}
