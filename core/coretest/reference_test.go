package coretest

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/internal/stats"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/refload"
)

// TestReferenceWorkload runs the reference workload through the core
// (no hedge, fixed delay at the workload's p95, adaptive) and prints the
// table against the ideal hedge computed from the same draws. Functional
// checks always apply (no wrong or failed answer); the speed ratios of the
// core issue are checked only with LLMHEDGE_BENCH=1, on a quiet machine.
func TestReferenceWorkload(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 3 x 600 requests of the reference workload, over a minute under -race")
	}
	n, conc := 600, 30
	bench := os.Getenv("LLMHEDGE_BENCH") == "1"
	if bench {
		n, conc = 2000, 20
	}
	w := llmsim.Reference(1, 0.05)
	p95 := w.TrueQuantile(0.95)
	var table []string
	row := func(name string, ttft, total []time.Duration, extra, ratio float64) {
		s, tt := stats.Summarize(ttft), stats.Summarize(total)
		table = append(table, fmt.Sprintf("%-22s ttft p50 %6.1f p95 %6.1f p99 %6.1f max %6.1f | total p99 %6.1f max %6.1f | extra %5.1f%% | p99/ideal %.3f",
			name, ms(s.P50), ms(s.P95), ms(s.P99), ms(s.Max), ms(tt.P99), ms(tt.Max), 100*extra, ratio))
	}

	variants := []struct {
		name string
		cfg  config.Config
	}{
		{"no hedge (measured)", config.Config{MaxAttempts: 1}},
		{"core fixed p95", config.Config{Delay: config.DelayConfig{Fixed: config.Duration(p95)}}},
		{"core adaptive", config.Config{Delay: config.DelayConfig{Mode: config.DelayAdaptive, Fixed: config.Duration(2 * p95), Min: config.Duration(time.Millisecond), MinSamples: 50}}},
	}
	peers := refload.ComputePeers(w, "A", "B", ids(n), p95)
	idealP99 := stats.Summarize(peers.Ideal).P99
	idealMax := stats.Summarize(peers.Ideal).Max
	row("ideal hedge (computed)", peers.Ideal, nil, peers.IdealExtra, 1)
	row("no hedge (computed)", peers.NoHedge, nil, 0, ratio(stats.Summarize(peers.NoHedge).P99, idealP99))
	row("sequential (computed)", peers.Sequential, nil, peers.IdealExtra, ratio(stats.Summarize(peers.Sequential).P99, idealP99))
	row("race-all (computed)", peers.RaceAll, nil, 1, ratio(stats.Summarize(peers.RaceAll).P99, idealP99))
	for _, v := range variants {
		r := newRig(t, w, v.cfg)
		res := refload.Run(context.Background(), refload.Options{URL: r.front.URL + "/v1/chat/completions", N: n, Concurrency: conc, Upstreams: []string{"A", "B"}})
		if res.Wrong != 0 || res.Failed != 0 {
			t.Fatalf("%s: %d wrong, %d failed answers: %v", v.name, res.Wrong, res.Failed, res.Errors)
		}
		extra := float64(r.served()-int64(n)) / float64(n)
		s := stats.Summarize(res.TTFT)
		row(v.name, res.TTFT, res.Total, extra, ratio(s.P99, idealP99))
		lat := cancelLatencies(r)
		denials := map[string]int{}
		for _, rep := range r.takeReports() {
			for _, d := range rep.Denials {
				denials[d]++
			}
		}
		table = append(table, fmt.Sprintf("%-22s loser cancel latency (commit -> upstream saw it): n=%d median %.2fms p99 %.2fms; delay now %v (true p95 %v); denials %v",
			"", len(lat), ms(refload.Median(lat)), ms(stats.Quantile(lat, 0.99)), r.hedger.CurrentDelay(), p95, denials))
		if bench && v.name == "core fixed p95" {
			if s.P99 > idealP99*105/100 {
				t.Errorf("fixed: s.P99 = %v, want <= idealP99*105/100 (%v)", s.P99, idealP99*105/100)
			} else if s.Max > idealMax*105/100 {
				t.Errorf("fixed: s.Max = %v, want <= idealMax*105/100 (%v)", s.Max, idealMax*105/100)
			}
			if extra > peers.IdealExtra+0.01 {
				t.Errorf("fixed: extra %.2f%% > ideal %.2f%% + 1", 100*extra, 100*peers.IdealExtra)
			}
			if m := refload.Median(lat); m > 5*time.Millisecond {
				t.Errorf("median loser-cancel latency %v > 5ms", m)
			}
		}
		if bench && v.name == "core adaptive" {
			d := r.hedger.CurrentDelay()
			if d < p95*75/100 || d > p95*125/100 || extra > 0.08 {
				t.Errorf("adaptive: delay %v vs true p95 %v (±25%%), extra %.2f%% (<= 8%%)", d, p95, 100*extra)
			}
		}
	}
	t.Logf("reference workload, scale 0.05, %d requests at %d concurrent, delay %v:\n%s", n, conc, p95, strings.Join(table, "\n"))
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("req-%d", i)
	}
	return out
}

// cancelLatencies matches each upstream cancellation to its request's commit.
func cancelLatencies(r *rig) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Duration
	for _, s := range []*llmsim.Running{r.a, r.b} {
		for _, c := range s.Cancellations() {
			if at, ok := r.commits[c.RequestID]; ok && c.At.After(at) {
				out = append(out, c.At.Sub(at))
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
