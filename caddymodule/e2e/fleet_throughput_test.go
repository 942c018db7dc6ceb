package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/envgate"
	"github.com/llmhedge/llmhedge/internal/testkit/lightload"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// Keyed requests per second with the fleet on and off: 20 clients, unique
// keys, one Caddy, on two upstreams: a 20-event answer streamed 1 ms apart
// (a fast model's pace), and 5 tokens at once (no model answers that fast:
// the fleet's cost undiluted).
func TestFleetBenchThroughput(t *testing.T) {
	envgate.FleetBench(t)
	redis := redisproc.Start(t, redisproc.Options{})
	for _, w := range []struct {
		name string
		w    llmsim.Workload
	}{
		{"20 events 1 ms apart", llmsim.Workload{MedianTTFT: time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 20, TokenGap: time.Millisecond, PingEvery: time.Second}},
		// TokenGap 0 would be the workload default (20ms): a microsecond.
		{"5 tokens at once", llmsim.Workload{MedianTTFT: time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 5, TokenGap: time.Microsecond, PingEvery: time.Second}},
	} {
		fleetThroughput(t, redis, w.name, w.w)
	}
}

func fleetThroughput(t *testing.T, redis *redisproc.Server, name string, w llmsim.Workload) {
	sim := llmsim.Start("A", w)
	defer sim.Close()
	off := startCaddy(t, "", fmt.Sprintf("\tllm_hedge {\n\t\troute fleet\n\t\tupstream %s {\n\t\t\tname A\n\t\t}\n\t\tmax_attempts 1\n\t}", sim.URL))
	on := startCaddy(t, "", fleetSite(sim, redis.URL()))
	cpu := func(pid int) time.Duration {
		d, err := lightload.ProcessCPU(pid)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	var caddyCPU, redisCPU [2]time.Duration // off, on
	var served [2]int64
	run := func(c *caddyProc, prefix string) float64 {
		side := 0
		if c == on {
			side = 1
		}
		caddyBefore, redisBefore := cpu(c.cmd.Process.Pid), cpu(redis.Pid())
		defer func() {
			caddyCPU[side] += cpu(c.cmd.Process.Pid) - caddyBefore
			redisCPU[side] += cpu(redis.Pid()) - redisBefore
		}()
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
		served[side] += count.Load()
		return float64(count.Load()) / time.Since(start).Seconds()
	}
	run(off, "warm-off")
	run(on, "warm-on")
	caddyCPU, redisCPU, served = [2]time.Duration{}, [2]time.Duration{}, [2]int64{}
	// Alternate the two so that noise from other work on the machine
	// spreads over both; the worst round is the figure.
	worst := 0.0
	var rounds []string
	for round := 0; round < 3; round++ {
		offRate := run(off, fmt.Sprintf("off%d", round))
		onRate := run(on, fmt.Sprintf("on%d", round))
		ratio := onRate / offRate
		if round == 0 || ratio < worst {
			worst = ratio
		}
		rounds = append(rounds, fmt.Sprintf("off %.0f on %.0f (%.2f)", offRate, onRate, ratio))
	}
	t.Logf("%s: keyed requests/s, 20 clients, one Caddy, 3 alternating rounds of 5s: %s; worst %.2f", name, strings.Join(rounds, ", "), worst)
	per := func(d time.Duration, n int64) time.Duration { return d / time.Duration(max(n, 1)) }
	t.Logf("%s: CPU per request: Caddy %v fleet off, %v fleet on; Redis %v fleet on", name,
		per(caddyCPU[0], served[0]), per(caddyCPU[1], served[1]), per(redisCPU[1], served[1]))
}
