package stats

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"
)

// latencies draws n seeded times to first token shaped like the
// simulator's reference workload (lognormal around 600 ms, sigma 0.3, 2 %
// stalls of 10-20 s), times scale. The test kit's simulator imports this
// package, so the charts are tested on draws of their own.
func latencies(seed uint64, n int, scale float64) []time.Duration {
	r := rand.New(rand.NewPCG(seed, 0))
	ds := make([]time.Duration, n)
	for i := range ds {
		ms := 600 * math.Exp(0.3*r.NormFloat64())
		if r.Float64() < 0.02 {
			ms = 10000 + 10000*r.Float64()
		}
		ds[i] = time.Duration(ms * scale * float64(time.Millisecond))
	}
	return ds
}

// referenceSeries draws n requests for a primary, a backup and the ideal
// hedge at the primary's p95 (min(a, d+b)), as the demo does.
func referenceSeries(n int) ([]Series, time.Duration) {
	primary, backup := latencies(1, n, 1), latencies(2, n, 1)
	d := Quantile(primary, 0.95)
	ideal := make([]time.Duration, n)
	for i, a := range primary {
		ideal[i] = min(a, d+backup[i])
	}
	return []Series{
		{Name: "primary (no hedge)", Values: primary},
		{Name: "secondary", Values: backup},
		{Name: "hedged at p95 <ideal>", Values: ideal},
	}, d
}

// svgElements parses doc with encoding/xml and counts its elements by name.
func svgElements(t *testing.T, doc []byte) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, n := range svgNodes(t, doc) {
		counts[n.name]++
	}
	return counts
}

func TestCDFChartIsValidSVGWithEverySeriesAndTheDelay(t *testing.T) {
	series, d := referenceSeries(2000)
	doc := CDFChart("TTFT: reference workload & <friends>", series, d)
	counts := svgElements(t, doc)
	if counts["svg"] != 1 {
		t.Fatalf("want one svg root, got %d", counts["svg"])
	}
	// One curve per series in each of the two panels.
	if counts["path"] != 2*len(series) {
		t.Errorf("want %d curves (2 panels x %d series), got %d", 2*len(series), len(series), counts["path"])
	}
	text := string(doc)
	for _, s := range series {
		if !strings.Contains(text, esc(s.Name)) {
			t.Errorf("legend lacks series %q", s.Name)
		}
	}
	if !strings.Contains(text, "TTFT: reference workload &amp; &lt;friends&gt;") {
		t.Error("title missing or not escaped")
	}
	wantDelay := "hedge delay " + formatMillis(millis(d))
	if !strings.Contains(text, wantDelay) || !strings.Contains(text, `stroke-dasharray="7 5"`) {
		t.Errorf("delay marker %q missing", wantDelay)
	}
	for _, label := range []string{">100 ms<", ">1 s<", ">10 s<", ">90 %<", ">100 %<", ">p99<"} {
		if !strings.Contains(text, label) {
			t.Errorf("axis label %s missing", label)
		}
	}
	// LLMHEDGE_CHART_OUT=file.svg keeps the chart for a look.
	if out := os.Getenv("LLMHEDGE_CHART_OUT"); out != "" {
		if err := os.WriteFile(out, doc, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCDFChartWithoutTailPanelOrDelay(t *testing.T) {
	series, _ := referenceSeries(200)
	doc := ChartOptions{Title: "no tail", TailFrom: -1}.CDF(series)
	counts := svgElements(t, doc)
	if counts["path"] != len(series) {
		t.Errorf("want %d curves in one panel, got %d", len(series), counts["path"])
	}
	if strings.Contains(string(doc), "hedge delay") || strings.Contains(string(doc), ">p99<") {
		t.Error("marker drawn without a delay or tail panel")
	}
}

func TestCDFChartToleratesEmptyAndFailedSeries(t *testing.T) {
	doc := CDFChart("", []Series{
		{Name: "empty"},
		{Name: "all failed", Values: []time.Duration{0, 0}},
		{Name: "one", Values: []time.Duration{42 * time.Millisecond}},
	}, 0)
	svgElements(t, doc)
	if !strings.Contains(string(doc), "(no samples)") || !strings.Contains(string(doc), "p50 42 ms") {
		t.Errorf("legend wrong:\n%s", doc)
	}
	svgElements(t, CDFChart("nothing", nil, 0))
}

func TestLogAxisTicks(t *testing.T) {
	cases := []struct {
		lo, hi float64
		want   []float64
	}{
		{30, 80, []float64{20, 50, 100}},
		{50, 50, []float64{50, 100}},
		{0.4, 3, []float64{0.2, 0.5, 1, 2, 5}},
		{100, 1000, []float64{100, 200, 500, 1000}},
	}
	for _, c := range cases {
		got := oneTwoFive(c.lo, c.hi)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("oneTwoFive(%v, %v) = %v, want %v", c.lo, c.hi, got, c.want)
		}
	}
	for ms, want := range map[float64]string{0.2: "0.2 ms", 50: "50 ms", 1000: "1 s", 1500: "1.5 s", 20000: "20 s"} {
		if got := formatMillis(ms); got != want {
			t.Errorf("formatMillis(%v) = %q, want %q", ms, got, want)
		}
	}
	// Five decades: only powers of ten are labelled.
	a := newLogAxis([][]float64{{1, 60000}}, 0, 0, 100)
	for _, tk := range a.ticks {
		if (tk.label != "") != (leadingDigit(tk.ms) == 1) {
			t.Errorf("tick %v labelled %q", tk.ms, tk.label)
		}
	}
}
