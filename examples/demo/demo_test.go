package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/stats"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestDemoRuns runs the demo small, through the real in-process Caddy, and
// checks its table, its JSON and its chart. (The full-size acceptance run is
// `go run ./examples/demo`; its numbers are in the README.)
func TestDemoRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the demo's 300-request load run, about a minute under -race")
	}
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
	// The chart shows each variant's extra load and reads in real time.
	for _, r := range res.Rows {
		if note := extraNote(r.ExtraLoad); !bytes.Contains(svg, []byte(note)) {
			t.Errorf("chart: no extra load %q for %s", note, r.Name)
		}
	}
	if !bytes.Contains(svg, []byte("×20 for real time")) {
		t.Error("chart: the time axis does not say ×20 for real time")
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
// timeline chart is written with A's degraded window even when a run ends
// before A's first 50 s of calm (scaled) are over.
func TestDemoRegimeRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the regime demo's 600-request load run, ~30 s under -race")
	}
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
	svg := regimeChart(t, res.Chart)
	if !bytes.Contains(svg, []byte("×50 for real time")) {
		t.Error("chart: the time axis does not say ×50 for real time (scale 0.02)")
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
	regimeChart(t, opts.chart)
}

// regimeChart reads the regime chart at path and checks that it shades
// A's degraded window and draws a line with points for both variants.
func regimeChart(t *testing.T, path string) []byte {
	t.Helper()
	svg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(svg, []byte("A degraded")) {
		t.Errorf("chart %s: no \"A degraded\" window", path)
	}
	for _, name := range []string{"llm_hedge primary ordered", "llm_hedge primary fastest"} {
		if !bytes.Contains(svg, []byte(name+": TTFT p95")) {
			t.Errorf("chart %s: no legend of %s", path, name)
		}
	}
	lines := 0
	for _, e := range svgElements(t, svg) {
		if e.name == "path" && strings.HasPrefix(e.attr["d"], "M") {
			lines++
		}
	}
	if lines != 2 {
		t.Errorf("chart %s: %d lines with points, want 2", path, lines)
	}
	return svg
}

// svgElement is one element of a chart, its attributes and text.
type svgElement struct {
	name string
	attr map[string]string
	text string
}

func svgElements(t *testing.T, doc []byte) []svgElement {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(doc))
	var out []svgElement
	var open []int // indexes into out of the elements being read
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("chart is not valid XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := svgElement{name: tok.Name.Local, attr: map[string]string{}}
			for _, a := range tok.Attr {
				e.attr[a.Name.Local] = a.Value
			}
			out = append(out, e)
			open = append(open, len(out)-1)
		case xml.EndElement:
			open = open[:len(open)-1]
		case xml.CharData:
			if len(open) > 0 {
				out[open[len(open)-1]].text += string(tok)
			}
		}
	}
}

// chartSeries are the demo's variants drawn from the reference workload:
// plain (A alone), hedged at delay (the faster of A and B+delay), ideal.
func chartSeries(n int, delay time.Duration) []stats.Series {
	w := llmsim.Reference(1, 0.05)
	var plain, hedged []time.Duration
	for i := 0; i < n; i++ {
		id := strconv.Itoa(i)
		a, b := w.TTFT("A", id), w.TTFT("B", id)+delay
		plain = append(plain, a)
		if b < a {
			a = b
		}
		hedged = append(hedged, a)
	}
	return []stats.Series{
		{Name: "caddy reverse_proxy", Values: plain, Note: extraNote(0)},
		{Name: "llm_hedge fixed delay", Values: hedged, Note: extraNote(5.2)},
	}
}

// TestDemoChart: the demo's chart says how its scaled time axis reads in
// real time, shows each variant's extra load, draws the upper panel as
// one row per variant whose tail markers differ (full CDFs of a hedge and
// its primary coincide up to the delay), and keeps the dashed delay line
// off the "50 ms" tick labels.
func TestDemoChart(t *testing.T) {
	const delay = 50 * time.Millisecond
	series := chartSeries(2000, delay)
	doc := demoChart(options{n: 2000, scale: 0.05}, series, delay)
	text := string(doc)
	if !strings.Contains(text, "×20 for real time") {
		t.Error("the time axis does not say ×20 for real time (scale 0.05)")
	}
	for _, s := range series {
		if !strings.Contains(text, s.Note) {
			t.Errorf("the row of %q does not show its extra load %q", s.Name, s.Note)
		}
	}
	if strings.Contains(text, "share of requests with TTFT") {
		t.Error("the upper panel is a full CDF, where the variants' curves overlap; want a row per variant")
	}
	elements := svgElements(t, doc)
	var p99s []string // cx of the filled p99 markers, one per row
	var labels, delayLines []svgElement
	for _, e := range elements {
		switch {
		case e.name == "circle" && e.attr["r"] == "6.5":
			p99s = append(p99s, e.attr["cx"])
		case e.name == "text" && strings.TrimSpace(e.text) == "50 ms":
			labels = append(labels, e)
		case e.name == "line" && e.attr["stroke-dasharray"] == "7 5":
			delayLines = append(delayLines, e)
		}
	}
	if len(p99s) != len(series) {
		t.Fatalf("%d p99 markers, want one per variant (%d)", len(p99s), len(series))
	}
	if p99s[0] == p99s[1] {
		t.Errorf("the p99 markers of reverse_proxy and llm_hedge are both at x=%s; want distinct", p99s[0])
	}
	if len(labels) == 0 || len(delayLines) == 0 {
		t.Fatalf("%d \"50 ms\" tick labels and %d delay lines, want both", len(labels), len(delayLines))
	}
	num := func(e svgElement, key string) float64 {
		v, err := strconv.ParseFloat(e.attr[key], 64)
		if err != nil {
			t.Fatalf("%s %s=%q: %v", e.name, key, e.attr[key], err)
		}
		return v
	}
	for _, l := range delayLines {
		for _, lab := range labels {
			// A 13px label spans about y-13 to y+3, and "50 ms" ±19px around x.
			crossesX := math.Abs(num(l, "x1")-num(lab, "x")) < 19
			crossesY := num(l, "y1") < num(lab, "y")+3 && num(l, "y2") > num(lab, "y")-13
			if crossesX && crossesY {
				t.Errorf("delay line at x=%s, y %s–%s cuts the \"50 ms\" label at y=%s", l.attr["x1"], l.attr["y1"], l.attr["y2"], lab.attr["y"])
			}
		}
	}
}
