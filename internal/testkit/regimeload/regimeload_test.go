package regimeload

import (
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// inProcess serves each route with a core.Hedger behind an httptest server.
func inProcess(t *testing.T, routes []Route) map[string]string {
	bases := map[string]string{}
	for _, r := range routes {
		cfg := config.Config{
			Route:        r.Name,
			Primary:      r.Primary,
			Upstreams:    []config.UpstreamConfig{{Name: "A", URL: r.A, PreferMargin: config.Fraction(r.PreferA)}, {Name: "B", URL: r.B}},
			Delay:        config.DelayConfig{Mode: config.DelayAdaptive, Fixed: config.Duration(r.Delay)},
			ReportHeader: ReportHeader,
			Budget:       config.BudgetConfig{Burst: r.Burst},
		}
		h, err := core.New(cfg, core.Options{})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		bases[r.Name] = srv.URL + "/v1/"
	}
	return bases
}

// TestBenchInProcess runs the benchmark against the engine in process: a
// few hundred requests in CI, the full 4,000 per run with LLMHEDGE_BENCH=1.
func TestBenchInProcess(t *testing.T) {
	opts := Options{N: 300}
	if os.Getenv("LLMHEDGE_BENCH") == "1" {
		opts = Options{Check: true}
	}
	Bench(t, "in-process", inProcess, opts)
}

func TestParseReport(t *testing.T) {
	var r Request
	parseReport(&r, `llmhedge;dur=40;desc="attempts=2 winner=1 upstream=A delay_ms=53 primary=B primary_changes=3 explore=1"`)
	if r.First != "B" || r.Primary != "B" || r.Changes != 3 || !r.Explore {
		t.Fatalf("parsed first %q primary %q changes %d explore %v; want B, B, 3, true", r.First, r.Primary, r.Changes, r.Explore)
	}
}

// Reactions counts the non-exploring requests of a window still sent to A,
// and the requests after it until A is primary again.
func TestReactions(t *testing.T) {
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g := llmsim.Regime{Epoch: epoch, Period: 100 * time.Millisecond, Window: 40 * time.Millisecond, Offset: 50 * time.Millisecond, Factor: 8}
	run := &Run{Start: epoch, Wall: 150 * time.Millisecond}
	add := func(atMS int, first string, explore bool) {
		run.Requests = append(run.Requests, Request{Start: epoch.Add(time.Duration(atMS) * time.Millisecond), First: first, Explore: explore, TTFT: time.Millisecond})
	}
	add(10, "A", false)
	add(52, "A", false)
	add(55, "A", false)
	add(57, "B", false)
	add(60, "A", true) // exploring: not counted
	add(91, "B", false)
	add(95, "A", false)
	got := Reactions(run, g, 1)
	if len(got) != 1 || got[0].LeftAfter != 2 || got[0].LeftAfterMS != 5 || got[0].BackAfter != 1 || got[0].BackAfterMS != 5 {
		t.Fatalf("reactions %+v, want one: left after 2 requests, 5ms; back after 1 request, 5ms", got)
	}
}

// Overhead reads only the answers attempt 0 won, against their own draws.
func TestOverhead(t *testing.T) {
	wl := llmsim.Reference(18, 0.05)
	run := &Run{Requests: []Request{
		{ID: "r0", First: "A", Winner: "A", TTFT: wl.TTFT("A", "r0") + 2*time.Millisecond},
		{ID: "r1", First: "B", Winner: "B", TTFT: wl.TTFT("B", "r1") + 2*time.Millisecond},
		{ID: "r2", First: "A", Winner: "B", TTFT: time.Second}, // the hedge won: not counted
		{ID: "r3", TTFT: time.Second},                          // no report header: not counted
	}}
	got := Overhead(wl, run)
	if got.N != 2 || got.P99 != 2*time.Millisecond {
		t.Fatalf("overhead of %d answers, p99 %v; want 2 answers, 2ms", got.N, got.P99)
	}
}
