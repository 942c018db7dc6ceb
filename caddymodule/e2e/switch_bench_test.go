package e2e

import (
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/caddybin"
	"github.com/llmhedge/llmhedge/internal/testkit/envgate"
	"github.com/llmhedge/llmhedge/internal/testkit/loadloop"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// hedgeStarts returns when each hedge attempt of c's logged requests
// started: the request's start (the log line's ts minus its total_ms) plus
// the attempt's started_ms.
func (c *caddyProc) hedgeStarts() []time.Time {
	var out []time.Time
	for _, line := range c.logEntries("llm_hedge request") {
		ts, _ := line["ts"].(float64)
		total, _ := line["total_ms"].(float64)
		attempts, _ := line["attempt_list"].([]any)
		start := ts - total/1000
		for _, a := range attempts {
			at, _ := a.(map[string]any)
			if at["role"] != "hedge" {
				continue
			}
			started, _ := at["started_ms"].(float64)
			sec := start + started/1000
			whole := math.Floor(sec)
			out = append(out, time.Unix(int64(whole), int64((sec-whole)*1e9)))
		}
	}
	return out
}

// TestFleetBenchPauseStopsHedges: three Caddy replicas share one Redis,
// every request wants a hedge (the primary answers after 300ms, the delay
// is 50ms, no budget), requests round-robin. llmhedge-ctl pause: the time
// from the command to the last hedge any replica starts (goal ≤ 1s), and
// no hedge from 1s after the pause until resume.
//
//	LLMHEDGE_FLEET_BENCH=1 go test -run TestFleetBenchPauseStopsHedges -v ./caddymodule/e2e
func TestFleetBenchPauseStopsHedges(t *testing.T) {
	envgate.FleetBench(t)
	const replicas, workers = 3, 6
	redisSrv := redisproc.Start(t, redisproc.Options{})
	bin := caddybin.GoBuild(t, "./cmd/llmhedge-ctl")
	a, b := startSims(t)
	site := hedgeSite(a, b, "\t\tfleet "+redisSrv.URL()+"\n\t\tbudget {\n\t\t\tratio off\n\t\t}")
	var rig []*caddyProc
	for i := 0; i < replicas; i++ {
		rig = append(rig, startCaddy(t, "", site))
	}
	ctx := testContext(t)
	var sent atomic.Int64
	stop := make(chan struct{})
	wait := loadloop.Workers(workers, stop, func(w, i int) {
		n := sent.Add(1)
		id := fmt.Sprintf("pause-%d-%d", w, i)
		streamChat(ctx, sdkClient(rig[int(n)%replicas].url(0), id, "A=ttft:300ms"))
	})
	phase := func(d time.Duration) { <-time.After(d) }

	phase(2 * time.Second) // hedging on
	paused := time.Now()
	ctl(t, bin, redisSrv.URL(), "pause")
	phase(3 * time.Second) // paused
	resumed := time.Now()
	ctl(t, bin, redisSrv.URL(), "resume")
	phase(2 * time.Second) // hedging on again
	close(stop)
	wait()

	var before, during, late, after int
	var last time.Time
	for _, c := range rig {
		for _, s := range c.hedgeStarts() {
			switch {
			case s.Before(paused):
				before++
			case s.Before(resumed):
				during++
				if s.After(last) {
					last = s
				}
				if s.After(paused.Add(time.Second)) {
					late++
				}
			default:
				after++
			}
		}
	}
	lag := time.Duration(0)
	lastSaid := ""
	if !last.IsZero() {
		lag = last.Sub(paused)
		lastSaid = fmt.Sprintf(" (the last %v after the command)", lag.Round(time.Millisecond))
	}
	t.Logf("%d requests; hedges started: %d before llmhedge-ctl pause, %d after it%s, %d after resume",
		sent.Load(), before, during, lastSaid, after)
	if before == 0 || after == 0 {
		t.Errorf("hedges before the pause %d, after resume %d: want some in both (every request wants one)", before, after)
	}
	if late > 0 {
		t.Errorf("%d hedges started more than 1s after llmhedge-ctl pause, want 0 (the last %v after it)", late, lag)
	}
}
