package stats

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// svgNode is an element of the chart with its attributes and text.
type svgNode struct {
	name  string
	attr  map[string]string
	text  string
	float func(key string) float64
}

// svgNodes returns every element of doc in document order.
func svgNodes(t *testing.T, doc []byte) []svgNode {
	t.Helper()
	var nodes []svgNode
	dec := xml.NewDecoder(bytes.NewReader(doc))
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nodes
		}
		if err != nil {
			t.Fatalf("chart is not valid XML: %v", err)
		}
		switch v := tok.(type) {
		case xml.StartElement:
			n := svgNode{name: v.Name.Local, attr: map[string]string{}}
			for _, a := range v.Attr {
				n.attr[a.Name.Local] = a.Value
			}
			attr := n.attr
			n.float = func(key string) float64 { f, _ := strconv.ParseFloat(attr[key], 64); return f }
			nodes = append(nodes, n)
		case xml.CharData:
			if len(nodes) > 0 {
				nodes[len(nodes)-1].text += string(v)
			}
		}
	}
}

// TestDelayLineStaysOutOfTickLabels: with the delay on a labelled tick (50
// ms), the dashed delay line must not run through that tick's label below
// a panel (it used to run from the top panel to the bottom of the tail
// panel, across the labels between them).
func TestDelayLineStaysOutOfTickLabels(t *testing.T) {
	a, b := latencies(1, 500, 0.05), latencies(2, 500, 0.05)
	const delay = 50 * time.Millisecond
	for _, percentiles := range []bool{false, true} {
		doc := ChartOptions{Title: "delay on a tick", Delay: delay, Percentiles: percentiles}.CDF([]Series{{Name: "a", Values: a}, {Name: "b", Values: b}})
		nodes := svgNodes(t, doc)
		var labels, lines []svgNode
		for _, n := range nodes {
			switch {
			case n.name == "text" && strings.TrimSpace(n.text) == "50 ms":
				labels = append(labels, n)
			case n.name == "line" && n.attr["stroke-dasharray"] == "7 5":
				lines = append(lines, n)
			}
		}
		if len(labels) < 2 || len(lines) == 0 {
			t.Fatalf("percentiles %v: %d \"50 ms\" tick labels and %d delay lines; want one label per panel and the line", percentiles, len(labels), len(lines))
		}
		for _, l := range lines {
			for _, lab := range labels {
				// A 13px label spans about y-13 to y+3 and 5 characters.
				crossesX := math.Abs(l.float("x1")-lab.float("x")) < 5*chartCharWidth/2
				crossesY := l.float("y1") < lab.float("y")+3 && l.float("y2") > lab.float("y")-13
				if crossesX && crossesY {
					t.Errorf("percentiles %v: delay line x=%.1f y %.1f–%.1f cuts the tick label \"50 ms\" at y=%.1f",
						percentiles, l.float("x1"), l.float("y1"), l.float("y2"), lab.float("y"))
				}
			}
		}
	}
}

// TestPercentilePanel: with Percentiles the upper panel is a row per
// series (its name, note, p50/p95/p99/max written out and marked), not a
// second set of CDF curves, so series whose CDFs coincide up to the delay
// still differ visibly there.
func TestPercentilePanel(t *testing.T) {
	series, d := referenceSeries(2000)
	series[0].Note = "+0 % requests"
	series[2].Note = "+5.1 % requests · $0.37 per 1k"
	doc := ChartOptions{Title: "strategies", Delay: d, Percentiles: true}.CDF(series)
	counts := svgElements(t, doc)
	if counts["path"]-counts["circle"]/2 != len(series) {
		// Every row has two circles and a diamond path; the tail panel one
		// curve per series.
		t.Errorf("%d paths and %d circles: want %d tail curves plus a diamond and two circles per row", counts["path"], counts["circle"], len(series))
	}
	if counts["circle"] != 2*len(series) {
		t.Errorf("%d circles, want 2 per series (p50, p99)", counts["circle"])
	}
	text := string(doc)
	for _, s := range series {
		ok := Successful(s.Values)
		p99 := "p99 " + formatMillis(millis(Quantile(ok, 0.99)))
		if !strings.Contains(text, esc(s.Name)) || !strings.Contains(text, p99) {
			t.Errorf("row of %q lacks its name or %q", s.Name, p99)
		}
		if s.Note != "" && !strings.Contains(text, esc(s.Note)) {
			t.Errorf("row of %q lacks its note %q", s.Name, s.Note)
		}
	}
	if strings.Contains(text, "share of requests with TTFT") {
		t.Error("the upper panel is still a full CDF")
	}
}

// TestTimeScaleAxisTitle: a chart of a scaled run says on its time axis
// how to read it in real time; an unscaled one does not.
func TestTimeScaleAxisTitle(t *testing.T) {
	series, d := referenceSeries(200)
	for _, tc := range []struct {
		scale float64
		want  string
	}{
		{0.05, "times of the ×0.05 run: ×20 for real time"},
		{0.02, "×50 for real time"},
		{0, "time to first token (log scale)<"},
		{1, "time to first token (log scale)<"},
	} {
		doc := ChartOptions{Title: "scaled", Delay: d, Percentiles: true, TimeScale: tc.scale}.CDF(series)
		if !strings.Contains(string(doc), tc.want) {
			t.Errorf("TimeScale %g: the chart lacks %q", tc.scale, tc.want)
		}
	}
}
