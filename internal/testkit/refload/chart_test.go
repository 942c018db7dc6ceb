package refload

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// referenceSeries draws n requests of the reference workload for a primary,
// a backup and the ideal hedge at the primary's p95, as the demo does.
func referenceSeries(n int) ([]Series, time.Duration) {
	w := llmsim.Reference(7, 1)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("chart-%d", i)
	}
	primary := make([]time.Duration, n)
	for i, id := range ids {
		primary[i] = w.TTFT("a", id)
	}
	d := llmsim.Quantile(primary, 0.95)
	p := ComputePeers(w, "a", "b", ids, d)
	backup := make([]time.Duration, n)
	for i, id := range ids {
		backup[i] = w.TTFT("b", id)
	}
	return []Series{
		{Name: "primary (no hedge)", Values: p.NoHedge},
		{Name: "secondary", Values: backup},
		{Name: "hedged at p95 <ideal>", Values: p.Ideal},
	}, d
}

// svgElements parses doc with encoding/xml and counts its elements by name.
func svgElements(t *testing.T, doc []byte) map[string]int {
	t.Helper()
	counts := map[string]int{}
	dec := xml.NewDecoder(bytes.NewReader(doc))
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return counts
		}
		if err != nil {
			t.Fatalf("chart is not valid XML: %v\n%s", err, doc)
		}
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
		}
	}
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
