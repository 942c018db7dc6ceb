package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDemoRuns runs the demo small, through the real in-process Caddy, and
// checks its table, its JSON and its chart. (The full-size acceptance run is
// `go run ./examples/demo`; its numbers are in the README.)
func TestDemoRuns(t *testing.T) {
	dir := t.TempDir()
	var out, progress bytes.Buffer
	opts := options{n: 300, concurrency: 20, scale: 0.05, seed: 1, chart: filepath.Join(dir, "chart.svg"), json: true}
	if err := run(context.Background(), opts, &out, &progress); err != nil {
		t.Fatal(err)
	}
	var res Results
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("JSON output: %v\n%s", err, out.String())
	}
	if len(res.Rows) != 4 || res.Rows[3].Name != "ideal hedge (computed)" {
		t.Fatalf("rows %+v", res.Rows)
	}
	for _, r := range res.Rows[:3] {
		if r.Failed != 0 || r.Wrong != 0 || r.TTFTP50 <= 0 {
			t.Fatalf("%s: %+v", r.Name, r)
		}
	}
	if res.Rows[0].ExtraLoad != 0 || res.Rows[1].ExtraLoad <= 0 {
		t.Fatalf("extra load: plain %.1f%% hedged %.1f%%", res.Rows[0].ExtraLoad, res.Rows[1].ExtraLoad)
	}
	svg, err := os.ReadFile(res.Chart)
	if err != nil || !bytes.Contains(svg, []byte("llm_hedge fixed delay")) {
		t.Fatalf("chart %s: %v", res.Chart, err)
	}
	if !strings.Contains(progress.String(), "300/300") {
		t.Fatalf("no progress shown: %q", progress.String())
	}
	t.Logf("%+v", res.Rows)

	out.Reset()
	opts.json = false
	opts.n = 100
	if err := run(context.Background(), opts, &out, &progress); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "p99/ideal") || !strings.Contains(out.String(), "chart: ") {
		t.Fatalf("table:\n%s", out.String())
	}
}

// TestDemoRegimeRuns runs the regime scenario small: both variants answer
// every request, the fastest one reports its primary changes, and the
// timeline chart is written.
func TestDemoRegimeRuns(t *testing.T) {
	dir := t.TempDir()
	var out, progress bytes.Buffer
	opts := options{n: 600, concurrency: 20, scale: 0.02, seed: 1, chart: filepath.Join(dir, "regime.svg"), json: true}
	if err := runRegime(context.Background(), opts, &out, &progress); err != nil {
		t.Fatal(err)
	}
	var res RegimeResults
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("JSON output: %v\n%s", err, out.String())
	}
	if len(res.Rows) != 2 || res.Rows[0].Name != "llm_hedge primary ordered" || res.Rows[1].Name != "llm_hedge primary fastest" {
		t.Fatalf("%d rows, want primary ordered then primary fastest", len(res.Rows))
	}
	for _, r := range res.Rows {
		if r.Failed != 0 || r.Wrong != 0 || r.All[0] <= 0 {
			t.Fatalf("%s: %d failed, %d wrong, p50 %.1fms; want 0, 0, > 0", r.Name, r.Failed, r.Wrong, r.All[0])
		}
	}
	svg, err := os.ReadFile(res.Chart)
	if err != nil || !bytes.Contains(svg, []byte("A degraded")) || !bytes.Contains(svg, []byte("primary fastest")) {
		t.Fatalf("chart %s (%v): no degraded window or no fastest line", res.Chart, err)
	}
	out.Reset()
	opts.json = false
	opts.n = 200
	if err := runRegime(context.Background(), opts, &out, &progress); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "A degraded") || !strings.Contains(out.String(), "chart: ") {
		t.Fatalf("table:\n%s", out.String())
	}
}
