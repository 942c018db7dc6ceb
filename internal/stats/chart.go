package stats

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Series is one named set of durations drawn as a CDF curve.
type Series struct {
	// Name labels the curve in the legend.
	Name string
	// Values are the samples; values <= 0 (failed requests) are left out.
	Values []time.Duration
	// Note, when set, follows the series' numbers in the legend: what the
	// curve costs, e.g. "+5.0 % requests".
	Note string
}

// ChartOptions configure CDF.
type ChartOptions struct {
	// Title is drawn above the chart.
	Title string
	// Delay, when > 0, is marked by a vertical dashed line.
	Delay time.Duration
	// DelayLabel labels that line. Default "hedge delay <Delay>".
	DelayLabel string
	// TailFrom is where the zoomed tail panel starts, as a fraction: 0.9
	// shows the CDF from 90 % to 100 % below the full one, so that p99
	// differences are visible. Default 0.9; a negative value or >= 1 draws
	// no tail panel.
	TailFrom float64
	// Width of the SVG in pixels. Default 960.
	Width int
	// Percentiles draws the upper panel as one row per series with its
	// p50, p95, p99 and max marked on the time axis and written out,
	// instead of the full CDF. A hedge's CDF coincides with its primary's
	// below the delay, so full CDFs of strategies mostly overlap; the rows
	// show them side by side where they differ. The rows are the legend.
	Percentiles bool
	// TimeScale, when set and not 1, says the times drawn are those of a
	// run scaled by this factor (0.05 runs 20 times faster than real): the
	// time axis's title then says by how much to multiply for real time.
	TimeScale float64
}

// CDFChart draws the CDFs of series on a log-scale time axis with the hedge
// delay marked and a tail panel from 90 %, as a standalone SVG document.
func CDFChart(title string, series []Series, delay time.Duration) []byte {
	return ChartOptions{Title: title, Delay: delay}.CDF(series)
}

// Chart geometry, in pixels. Fonts are at least 12px so the chart stays
// readable when scaled down in a README.
const (
	chartMarginLeft    = 78
	chartMarginRight   = 28
	chartTitleBand     = 58
	chartMainHeight    = 300
	chartPanelGap      = 64
	chartTailHeight    = 200
	chartBottomBand    = 64
	chartFont          = 13
	chartTitleFont     = 18
	chartCharWidth     = 7.4 // average width of a 13px sans-serif glyph
	chartBoldCharWidth = 8.2
	chartLegendLine    = 20
	chartLegendSwatch  = 26
)

// chartPalette holds distinct colours that stay distinct for the common
// forms of colour blindness (Okabe–Ito order, black moved last).
var chartPalette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#7F7F7F", "#000000"}

// CDF renders the chart of series.
func (o ChartOptions) CDF(series []Series) []byte {
	if o.Width <= 0 {
		o.Width = 960
	}
	if o.TailFrom == 0 {
		o.TailFrom = 0.9
	}
	tail := o.TailFrom > 0 && o.TailFrom < 1
	sorted := make([][]float64, len(series)) // milliseconds, ascending
	for i, s := range series {
		sorted[i] = positiveMillis(s.Values)
	}
	axis := newLogAxis(sorted, o.Delay, chartMarginLeft, float64(o.Width-chartMarginRight))

	mainTop := float64(chartTitleBand)
	mainHeight := float64(chartMainHeight)
	var rows []percentileRow
	if o.Percentiles {
		rows, mainHeight = percentileRows(series, sorted, axis)
	}
	mainPanel := panel{top: mainTop, height: mainHeight, from: 0}
	height := mainTop + mainHeight + chartBottomBand
	var tailPanel panel
	if tail {
		tailPanel = panel{top: mainTop + mainHeight + chartPanelGap, height: chartTailHeight, from: o.TailFrom}
		height = tailPanel.top + chartTailHeight + chartBottomBand
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%.0f" viewBox="0 0 %d %.0f" font-family="Helvetica, Arial, sans-serif" font-size="%d">`+"\n",
		o.Width, height, o.Width, height, chartFont)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	if o.Title != "" {
		fmt.Fprintf(&b, `<text x="%d" y="32" font-size="%d" font-weight="bold">%s</text>`+"\n", chartMarginLeft, chartTitleFont, esc(o.Title))
	}

	// The delay line goes first, under the curves and the labels.
	if o.Delay > 0 {
		label := o.DelayLabel
		if label == "" {
			label = "hedge delay " + formatMillis(millis(o.Delay))
		}
		panels := []panel{mainPanel}
		if tail {
			panels = append(panels, tailPanel)
		}
		drawDelay(&b, axis, millis(o.Delay), panels, label)
	}
	if o.Percentiles {
		mainPanel.drawRows(&b, axis, series, rows)
	} else {
		mainPanel.draw(&b, "main", axis, sorted, "share of requests with TTFT ≤ x")
	}
	if tail {
		tailPanel.draw(&b, "tail", axis, sorted, fmt.Sprintf("tail: %s–100 %%", percent(o.TailFrom)))
		tailPanel.markQuantile(&b, axis, 0.99, "p99")
	}
	bottom := mainPanel.top + mainPanel.height
	if tail {
		bottom = tailPanel.top + tailPanel.height
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n",
		(axis.x0+axis.x1)/2, bottom+48, esc(timeAxisTitle(o.TimeScale)))
	if !o.Percentiles {
		drawLegend(&b, series, sorted, axis, mainPanel)
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// timeAxisTitle names the time axis, and for a scaled run how to read it
// in real time.
func timeAxisTitle(scale float64) string {
	if scale <= 0 || scale == 1 {
		return "time to first token (log scale)"
	}
	return fmt.Sprintf("time to first token (log scale) · times of the ×%s run: ×%s for real time",
		strconv.FormatFloat(roundSig(scale, 3), 'f', -1, 64), strconv.FormatFloat(roundSig(1/scale, 3), 'f', -1, 64))
}

// panel is one plot area: the full CDF (from 0) or the zoomed tail.
type panel struct {
	top, height float64
	from        float64 // the fraction at the bottom edge
}

func (p panel) y(frac float64) float64 {
	return p.top + p.height - (frac-p.from)/(1-p.from)*p.height
}

// draw paints the frame, gridlines, tick labels and every curve, clipped
// to the panel so the tail panel shows only its part of each curve.
func (p panel) draw(b *bytes.Buffer, id string, axis logAxis, sorted [][]float64, yTitle string) {
	fmt.Fprintf(b, `<clipPath id="clip-%s"><rect x="%.1f" y="%.1f" width="%.1f" height="%.1f"/></clipPath>`+"\n",
		id, axis.x0, p.top-1, axis.x1-axis.x0, p.height+2)
	p.verticalGrid(b, axis)
	// Horizontal gridlines: quarters of the full panel, fifths of the tail.
	steps := 4
	if p.from > 0 {
		steps = 5
	}
	for i := 0; i <= steps; i++ {
		frac := p.from + (1-p.from)*float64(i)/float64(steps)
		y := p.y(frac)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#cfcfcf"/>`+"\n", axis.x0, y, axis.x1, y)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", axis.x0-8, y+4, esc(percent(frac)))
	}
	fmt.Fprintf(b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", p.top+p.height/2, esc(yTitle))
	for i, values := range sorted {
		if len(values) == 0 {
			continue
		}
		fmt.Fprintf(b, `<path clip-path="url(#clip-%s)" d="%s" fill="none" stroke="%s" stroke-width="%.1f" stroke-linejoin="round"/>`+"\n",
			id, stepPath(values, axis, p), seriesColor(i), seriesWidth(i))
	}
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#555"/>`+"\n", axis.x0, p.top, axis.x1-axis.x0, p.height)
}

// Rows of a percentile panel: the text line, then the markers; a row
// whose numbers do not fit beside its name has them on a third line.
const (
	chartRowHeight     = 44
	chartRowWrapHeight = 60
)

// chartHalo outlines a text in white under its fill, so that the gridlines
// and the delay line behind it do not cut it.
const chartHalo = `stroke="white" stroke-width="4" stroke-linejoin="round" paint-order="stroke"`

// percentileRow is the text of one row of a percentile panel.
type percentileRow struct {
	stats              string // "p50 … · p99 …"
	wrap               bool   // the stats go under the markers
	p50, p95, p99, max float64
}

// percentileRows lays out the rows of series; height is the panel's.
func percentileRows(series []Series, sorted [][]float64, axis logAxis) (rows []percentileRow, height float64) {
	height = 8
	for i, s := range series {
		r := percentileRow{stats: "(no samples)"}
		if len(sorted[i]) > 0 {
			ok := Successful(s.Values)
			q := func(f float64) float64 { return millis(Quantile(ok, f)) }
			r.p50, r.p95, r.p99, r.max = q(0.5), q(0.95), q(0.99), sorted[i][len(sorted[i])-1]
			r.stats = fmt.Sprintf("p50 %s · p99 %s", formatMillis(r.p50), formatMillis(r.p99))
		}
		nameWidth := float64(len([]rune(s.Name)))*chartBoldCharWidth + float64(len([]rune(s.Note))+3)*chartCharWidth
		r.wrap = nameWidth+float64(len([]rune(r.stats)))*chartCharWidth+40 > axis.x1-axis.x0
		rows = append(rows, r)
		if r.wrap {
			height += chartRowWrapHeight
		} else {
			height += chartRowHeight
		}
	}
	if len(series) == 0 {
		height += chartRowHeight
	}
	return rows, height
}

// drawRows paints the percentile panel: per series its name, its note and
// its p50 and p99, and its p50, p95, p99 and max marked on the time axis
// (open circle, diamond, filled circle, bar).
func (p panel) drawRows(b *bytes.Buffer, axis logAxis, series []Series, rows []percentileRow) {
	p.verticalGrid(b, axis)
	fmt.Fprintf(b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", p.top+p.height/2, esc("○ p50 ◆ p95 ● p99 | max"))
	top := p.top + 4
	for i, s := range series {
		r := rows[i]
		textY, lineY := top+15, top+31
		color := seriesColor(i)
		note := ""
		if s.Note != "" {
			note = `<tspan dx="6" font-weight="normal" fill="#333">— ` + esc(s.Note) + `</tspan>`
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-weight="bold" fill="%s" %s>%s%s</text>`+"\n", axis.x0+8, textY, color, chartHalo, esc(s.Name), note)
		statsX, statsY, anchor := axis.x1-8, textY, "end"
		if r.wrap {
			statsX, statsY, anchor = axis.x0+8, top+chartRowWrapHeight-6, "start"
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="%s" fill="#333" %s>%s</text>`+"\n", statsX, statsY, anchor, chartHalo, esc(r.stats))
		if r.wrap {
			top += chartRowWrapHeight
		} else {
			top += chartRowHeight
		}
		if r.max == 0 {
			continue
		}
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2.5"/>`+"\n", axis.x(r.p50), lineY, axis.x(r.max), lineY, color)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2.5"/>`+"\n", axis.x(r.max), lineY-7, axis.x(r.max), lineY+7, color)
		x95 := axis.x(r.p95)
		fmt.Fprintf(b, `<path d="M%.1f %.1f L%.1f %.1f L%.1f %.1f L%.1f %.1f Z" fill="%s" stroke="white"/>`+"\n", x95-6, lineY, x95, lineY-6, x95+6, lineY, x95, lineY+6, color)
		fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="6.5" fill="%s" stroke="white" stroke-width="1.5"/>`+"\n", axis.x(r.p99), lineY, color)
		fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="4.5" fill="white" stroke="%s" stroke-width="2"/>`+"\n", axis.x(r.p50), lineY, color)
	}
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#555"/>`+"\n", axis.x0, p.top, axis.x1-axis.x0, p.height)
}

// verticalGrid draws a gridline at every tick of the time axis and the
// labels of the labelled ones below the panel.
func (p panel) verticalGrid(b *bytes.Buffer, axis logAxis) {
	bottom := p.top + p.height
	// Vertical gridlines at every tick; labels only where axis says.
	for _, t := range axis.ticks {
		x := axis.x(t.ms)
		stroke := "#e4e4e4"
		if t.label != "" {
			stroke = "#cfcfcf"
		}
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", x, p.top, x, bottom, stroke)
		if t.label != "" {
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, bottom+18, esc(t.label))
		}
	}
}

// markQuantile draws a labelled horizontal dashed line at quantile q.
func (p panel) markQuantile(b *bytes.Buffer, axis logAxis, q float64, label string) {
	y := p.y(q)
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="3 3"/>`+"\n", axis.x0, y, axis.x1, y)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" fill="#333">%s</text>`+"\n", axis.x0+6, y-5, esc(label))
}

// stepPath is the empirical CDF of values as a staircase: at each sample
// the curve rises by 1/n. Consecutive points that land on the same pixel
// are merged, so 10,000 samples stay a small path.
func stepPath(values []float64, axis logAxis, p panel) string {
	n := float64(len(values))
	var sb strings.Builder
	lastX, lastY := math.NaN(), math.NaN()
	point := func(cmd string, x, y float64) {
		x, y = math.Round(x*10)/10, math.Round(y*10)/10
		if x == lastX && y == lastY {
			return
		}
		sb.WriteString(cmd)
		sb.WriteString(strconv.FormatFloat(x, 'f', -1, 64))
		sb.WriteByte(' ')
		sb.WriteString(strconv.FormatFloat(y, 'f', -1, 64))
		lastX, lastY = x, y
	}
	point("M", axis.x0, p.y(0))
	for i, v := range values {
		x := axis.x(v)
		point("L", x, p.y(float64(i)/n))
		point("L", x, p.y(float64(i+1)/n))
	}
	point("L", axis.x1, p.y(1))
	return sb.String()
}

// drawDelay marks the hedge delay in every panel, inside each frame only,
// so that the line never cuts the tick labels between the panels.
func drawDelay(b *bytes.Buffer, axis logAxis, ms float64, panels []panel, label string) {
	x := axis.x(ms)
	for i, p := range panels {
		top := p.top
		if i == 0 {
			top -= 6 // up to the label
		}
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222" stroke-width="1.6" stroke-dasharray="7 5"/>`+"\n", x, top, x, p.top+p.height)
	}
	top := panels[0].top
	anchor, dx := "start", 6.0
	if x+float64(len(label))*chartCharWidth > axis.x1 {
		anchor, dx = "end", -6
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="%s" font-weight="bold" fill="#222">%s</text>`+"\n", x+dx, top-10, anchor, esc(label))
}

// drawLegend lists the series with their p50 and p99 in the lower right of
// the main panel, where CDF curves (which rise to the right) leave room.
// Names and numbers are two columns so the numbers line up.
func drawLegend(b *bytes.Buffer, series []Series, sorted [][]float64, axis logAxis, p panel) {
	if len(series) == 0 {
		return
	}
	stats := make([]string, len(series))
	nameWidth, statWidth := 0, 0
	for i, s := range series {
		stats[i] = "(no samples)"
		if len(sorted[i]) > 0 {
			ok := Successful(s.Values)
			stats[i] = fmt.Sprintf("p50 %s · p99 %s", formatMillis(millis(Quantile(ok, 0.5))), formatMillis(millis(Quantile(ok, 0.99))))
		}
		if s.Note != "" {
			stats[i] += " · " + s.Note
		}
		if n := len([]rune(s.Name)); n > nameWidth {
			nameWidth = n
		}
		if n := len([]rune(stats[i])); n > statWidth {
			statWidth = n
		}
	}
	nameColumn := float64(nameWidth)*chartCharWidth + 18
	w := float64(chartLegendSwatch+24) + nameColumn + float64(statWidth)*chartCharWidth
	h := float64(len(series)*chartLegendLine + 12)
	x := axis.x1 - w - 10
	y := p.top + p.height - h - 10
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="white" fill-opacity="0.92" stroke="#999" rx="4"/>`+"\n", x, y, w, h)
	for i, s := range series {
		ly := y + 6 + float64(i*chartLegendLine) + chartLegendLine/2
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", x+8, ly, x+8+chartLegendSwatch, ly, seriesColor(i))
		tx := x + 16 + chartLegendSwatch
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", tx, ly+4.5, esc(s.Name))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" fill="#333">%s</text>`+"\n", tx+nameColumn, ly+4.5, esc(stats[i]))
	}
}

// seriesColor is the colour of series i.
func seriesColor(i int) string { return chartPalette[i%len(chartPalette)] }

// seriesWidth is the stroke width of series i: earlier series are drawn
// wider, so a curve that coincides with a later one (the hedged CDF equals
// the primary's below the delay) still shows at its edges.
func seriesWidth(i int) float64 { return math.Max(1.6, 3.6-0.7*float64(i)) }

// logAxis maps milliseconds to x on a log scale spanning whole 1-2-5 ticks.
type logAxis struct {
	lo, hi float64 // ms at the left and right edges
	x0, x1 float64
	ticks  []tick
}

type tick struct {
	ms    float64
	label string // "" for an unlabelled gridline
}

func newLogAxis(sorted [][]float64, delay time.Duration, x0, x1 float64) logAxis {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range sorted {
		if len(v) > 0 {
			lo, hi = math.Min(lo, v[0]), math.Max(hi, v[len(v)-1])
		}
	}
	if delay > 0 {
		lo, hi = math.Min(lo, millis(delay)), math.Max(hi, millis(delay))
	}
	if math.IsInf(lo, 1) { // nothing to draw: show 10 ms – 1 s
		lo, hi = 10, 1000
	}
	candidates := oneTwoFive(lo, hi)
	a := logAxis{lo: candidates[0], hi: candidates[len(candidates)-1], x0: x0, x1: x1}
	// Over more than about three decades 2s and 5s would crowd the labels:
	// keep them as gridlines only.
	crowded := len(candidates) > 13
	for _, c := range candidates {
		t := tick{ms: c}
		if !crowded || leadingDigit(c) == 1 {
			t.label = formatMillis(c)
		}
		a.ticks = append(a.ticks, t)
	}
	return a
}

func (a logAxis) x(ms float64) float64 {
	ms = math.Max(a.lo, math.Min(a.hi, ms))
	return a.x0 + (math.Log(ms)-math.Log(a.lo))/(math.Log(a.hi)-math.Log(a.lo))*(a.x1-a.x0)
}

// oneTwoFive returns the 1-2-5 sequence from the largest value <= lo to the
// smallest >= hi, with at least two values.
func oneTwoFive(lo, hi float64) []float64 {
	var out []float64
	for e := math.Floor(math.Log10(lo)) - 1; e <= math.Ceil(math.Log10(hi))+1; e++ {
		for _, m := range []float64{1, 2, 5} {
			out = append(out, m*math.Pow(10, e))
		}
	}
	first, last := 0, len(out)-1
	for i, v := range out {
		if v <= lo*(1+1e-9) {
			first = i
		}
	}
	for i := len(out) - 1; i >= 0; i-- {
		if out[i] >= hi*(1-1e-9) {
			last = i
		}
	}
	if last <= first {
		last = first + 1
	}
	return out[first : last+1]
}

func leadingDigit(v float64) int {
	return int(math.Round(v / math.Pow(10, math.Floor(math.Log10(v)+1e-9))))
}

// formatMillis writes ms as "50 ms", "1 s", "1.5 s", "0.2 ms".
func formatMillis(ms float64) string {
	if ms >= 1000 {
		return strconv.FormatFloat(roundSig(ms/1000, 3), 'f', -1, 64) + " s"
	}
	return strconv.FormatFloat(roundSig(ms, 3), 'f', -1, 64) + " ms"
}

func roundSig(v float64, digits int) float64 {
	if v == 0 {
		return 0
	}
	p := math.Pow(10, float64(digits)-math.Ceil(math.Log10(math.Abs(v))))
	return math.Round(v*p) / p
}

func percent(frac float64) string {
	return strconv.FormatFloat(roundSig(frac*100, 4), 'f', -1, 64) + " %"
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// positiveMillis returns the positive values of ds in ms, sorted.
func positiveMillis(ds []time.Duration) []float64 {
	out := make([]float64, 0, len(ds))
	for _, d := range ds {
		if d > 0 {
			out = append(out, millis(d))
		}
	}
	sort.Float64s(out)
	return out
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder does not fail
	return b.String()
}
