package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/llmhedge/llmhedge/internal/stats"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/regimeload"
)

// The regime scenario: upstream A degrades 8x for 30 s of every 80 s (real
// time; scaled like the rest of the workload), B stays calm. The same
// streaming requests go through llm_hedge with `primary ordered` (the
// first upstream is the primary, the hedge saves what it can) and with
// `primary fastest` (the primary moves to B while A is slow), each from the
// start of a fresh regime. A's first window opens 50 s (scaled) into a run,
// or when a third of its requests have been sent if that comes first (see
// degradeBy), so that every run shows one.

// RegimeRow is one variant of the regime scenario. Durations are in
// milliseconds of the scaled run.
type RegimeRow struct {
	Name           string                `json:"name"`
	Requests       int                   `json:"requests"`
	Failed         int                   `json:"failed"`
	Wrong          int                   `json:"wrong"`
	All            [3]float64            `json:"ttft_p50_p95_p99_ms"`
	Calm           [3]float64            `json:"calm_windows_ttft_p50_p95_p99_ms"`
	Degraded       [3]float64            `json:"degraded_windows_ttft_p50_p95_p99_ms"`
	ExtraLoad      float64               `json:"extra_load_pct"`
	PrimaryChanges int64                 `json:"primary_changes"`
	Reactions      []regimeload.Reaction `json:"reactions,omitempty"`
}

// RegimeResults is the whole regime run.
type RegimeResults struct {
	Scale       float64     `json:"scale"`
	Seed        int64       `json:"seed"`
	Concurrency int         `json:"concurrency"`
	Factor      float64     `json:"factor"`
	WindowS     float64     `json:"window_real_s"`
	PeriodS     float64     `json:"period_real_s"`
	Rows        []RegimeRow `json:"rows"`
	Chart       string      `json:"chart"`
	WallSeconds float64     `json:"wall_seconds"`
}

// regimeSite is one llm_hedge site of the regime scenario.
type regimeSite struct {
	name, primary, url string
}

// startRegimeCaddy serves llm_hedge with primary ordered and with primary
// fastest over A and B, both with the adaptive delay starting at delay and
// a hedge budget burst for one delay's worth of requests (see
// regimeload.Burst).
func startRegimeCaddy(upA, upB string, delay time.Duration) ([]regimeSite, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	sites := []regimeSite{
		{name: "llm_hedge primary ordered", primary: "ordered", url: fmt.Sprintf("http://127.0.0.1:%d", ports[0])},
		{name: "llm_hedge primary fastest", primary: "fastest", url: fmt.Sprintf("http://127.0.0.1:%d", ports[1])},
	}
	upstreams := []map[string]any{{"url": upA, "name": "A"}, {"url": upB, "name": "B"}}
	servers := map[string]any{}
	for i, s := range sites {
		servers[s.primary] = map[string]any{
			"listen": []string{fmt.Sprintf("127.0.0.1:%d", ports[i])},
			"routes": []any{map[string]any{"handle": []any{map[string]any{
				"handler": "llm_hedge", "route": s.primary, "upstreams": upstreams, "primary": s.primary,
				"delay":         map[string]any{"mode": "adaptive", "fixed": delay.String()},
				"report_header": regimeload.ReportHeader,
				"budget":        map[string]any{"burst": regimeload.Burst},
			}}}},
			"automatic_https": map[string]any{"disable": true},
		}
	}
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
		"apps":    map[string]any{"http": map[string]any{"servers": servers}},
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	if err := caddy.Load(raw, true); err != nil {
		return nil, fmt.Errorf("starting caddy: %w", err)
	}
	return sites, nil
}

// runRegime runs the regime scenario.
func runRegime(ctx context.Context, opts options, stdout, stderr io.Writer) error {
	began := time.Now()
	w := llmsim.Reference(opts.seed, opts.scale)
	delay := w.TrueQuantile(0.95).Round(time.Millisecond)
	a := llmsim.Start("A", w)
	defer a.Close()
	b := llmsim.Start("B", w)
	defer b.Close()
	sites, err := startRegimeCaddy(a.URL, b.URL, delay)
	if err != nil {
		return err
	}
	defer stopCaddy()
	shape := llmsim.RegimeShift(time.Time{})
	fmt.Fprintf(stderr, "simulated upstreams A and B (reference workload x%g); A %gx slower for %v of every %v (real time); Caddy with llm_hedge in-process\n",
		opts.scale, shape.Factor, shape.Window, shape.Period)
	res := &RegimeResults{Scale: opts.scale, Seed: opts.seed, Concurrency: opts.concurrency, Factor: shape.Factor,
		WindowS: shape.Window.Seconds(), PeriodS: shape.Period.Seconds()}
	transport := &http.Transport{MaxIdleConns: 4 * opts.concurrency, MaxIdleConnsPerHost: 4 * opts.concurrency}
	defer transport.CloseIdleConnections()
	var lines []timeline
	var regime llmsim.Regime
	for _, site := range sites {
		a.ResetCounters()
		b.ResetCounters()
		regime = llmsim.RegimeShift(time.Now())
		a.SetRegime(regime)
		fmt.Fprintf(stderr, "%s: %d requests...\n", site.name, opts.n)
		client := &http.Client{Transport: &degradeBy{RoundTripper: transport, a: a, k: max(1, int64(opts.n)/3), w: w}}
		run := regimeload.Drive(ctx, client, site.url+"/v1/", site.primary+"-", opts.n, opts.concurrency, w.Tokens)
		regime = a.Regime() // as degradeBy may have moved it
		a.SetRegime(llmsim.Regime{})
		if ctx.Err() != nil {
			return ctx.Err()
		}
		row := RegimeRow{Name: site.name, Requests: opts.n, Failed: run.Failed, Wrong: run.Wrong,
			ExtraLoad: 100 * float64(a.Served()+b.Served()-int64(opts.n)) / float64(opts.n), PrimaryChanges: run.Changes()}
		row.All = pct3(run.TTFTs(nil))
		row.Calm = pct3(run.TTFTs(func(q regimeload.Request) bool { return !regime.Degraded(q.Start, opts.scale) }))
		row.Degraded = pct3(run.TTFTs(func(q regimeload.Request) bool { return regime.Degraded(q.Start, opts.scale) }))
		if site.primary == "fastest" {
			row.Reactions = regimeload.Reactions(run, regime, opts.scale)
		}
		res.Rows = append(res.Rows, row)
		lines = append(lines, timelineOf(site.name, run, regime, opts.scale))
	}
	chart := timelineChart(fmt.Sprintf("TTFT p95 over time, A %gx slower for %v of every %v (x%g)", shape.Factor, shape.Window, shape.Period, opts.scale),
		lines, opts.scale)
	if err := os.WriteFile(opts.chart, chart, 0o644); err != nil {
		return err
	}
	abs, _ := filepath.Abs(opts.chart)
	res.Chart = abs
	res.WallSeconds = time.Since(began).Seconds()
	if opts.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	printRegimeTable(stdout, res)
	return nil
}

// degradeBy sends a run's requests and opens A's first degraded window
// when the k-th is sent, unless it is open or over already: a run is a
// number of requests and the regime is clock time, so a fast machine (or a
// small -n) would otherwise end the run before A ever degrades. The window
// then opens before the k-th request, so before the run ends.
type degradeBy struct {
	http.RoundTripper
	a    *llmsim.Running
	k    int64
	w    llmsim.Workload // its Scale is the regime's
	sent atomic.Int64
}

func (d *degradeBy) RoundTrip(r *http.Request) (*http.Response, error) {
	if d.sent.Add(1) == d.k {
		g := d.a.Regime()
		offset := d.w.Scaled(g.Offset)
		if now := time.Now(); now.Before(g.Epoch.Add(offset)) {
			g.Epoch = now.Add(-offset) // calm until now, then the window
			d.a.SetRegime(g)
		}
	}
	return d.RoundTripper.RoundTrip(r)
}

func pct3(ds []time.Duration) [3]float64 {
	s := stats.Summarize(ds)
	return [3]float64{ms(s.P50), ms(s.P95), ms(s.P99)}
}

func printRegimeTable(w io.Writer, res *RegimeResults) {
	fmt.Fprintf(w, "\nTTFT in ms of the x%g run (multiply by %g for real time): A %gx slower for %gs of every %gs (real time), B calm\n\n",
		res.Scale, 1/res.Scale, res.Factor, res.WindowS, res.PeriodS)
	fmt.Fprintf(w, "%-27s %-20s | %-20s | %-20s | %6s %8s %6s\n", "variant", "all p50/p95/p99", "A calm", "A degraded", "extra", "changes", "failed")
	for _, r := range res.Rows {
		fmt.Fprintf(w, "%-27s %-20s | %-20s | %-20s | %5.1f%% %8d %6d\n", r.Name, trio(r.All), trio(r.Calm), trio(r.Degraded),
			r.ExtraLoad, r.PrimaryChanges, r.Failed+r.Wrong)
	}
	if len(res.Rows) == 2 {
		fmt.Fprintf(w, "\nprimary fastest: TTFT p99 %.2fx primary ordered's, %.2fx in A's degraded windows.\n",
			res.Rows[1].All[2]/res.Rows[0].All[2], res.Rows[1].Degraded[2]/res.Rows[0].Degraded[2])
		for _, re := range res.Rows[1].Reactions {
			back := "not before the next window"
			if re.BackAfter >= 0 {
				back = fmt.Sprintf("after %d requests", re.BackAfter)
			}
			fmt.Fprintf(w, "  window %d: A stayed primary for %d requests (%.0f ms, %.1f s real); used again %s\n",
				re.Window, re.LeftAfter, re.LeftAfterMS, re.LeftAfterMS/1000/res.Scale, back)
		}
	}
	fmt.Fprintf(w, "chart: %s\n", res.Chart)
}

func trio(v [3]float64) string { return fmt.Sprintf("%.1f/%.1f/%.1f", v[0], v[1], v[2]) }

// timeline is one variant's TTFT p95 per time bucket.
type timeline struct {
	name    string
	at      []float64 // bucket middles, seconds since the run's start
	p95     []float64 // ms
	windows [][2]float64
}

// timelineBuckets is how many buckets a run is cut into.
const timelineBuckets = 60

func timelineOf(name string, run *regimeload.Run, g llmsim.Regime, scale float64) timeline {
	tl := timeline{name: name}
	width := run.Wall / timelineBuckets
	buckets := make([][]time.Duration, timelineBuckets)
	for _, q := range run.Requests {
		if q.TTFT <= 0 {
			continue
		}
		i := int(q.Start.Sub(run.Start) / width)
		if i >= 0 && i < timelineBuckets {
			buckets[i] = append(buckets[i], q.TTFT)
		}
	}
	for i, bk := range buckets {
		if len(bk) == 0 {
			continue
		}
		tl.at = append(tl.at, (time.Duration(i)*width + width/2).Seconds())
		tl.p95 = append(tl.p95, ms(stats.Quantile(bk, 0.95)))
	}
	for _, w := range g.Windows(run.Start.Add(run.Wall), scale) {
		end := w[1]
		if limit := run.Start.Add(run.Wall); end.After(limit) {
			end = limit
		}
		tl.windows = append(tl.windows, [2]float64{w[0].Sub(run.Start).Seconds(), end.Sub(run.Start).Seconds()})
	}
	return tl
}

// timelineChart draws each variant's TTFT p95 over time (log scale) with
// A's degraded windows shaded, as a standalone SVG.
func timelineChart(title string, lines []timeline, scale float64) []byte {
	const width, height, left, right, top, bottom = 960.0, 420.0, 78.0, 28.0, 58.0, 72.0
	colors := []string{"#d62728", "#1f77b4", "#2ca02c"}
	maxT, lo, hi := 0.0, math.Inf(1), 0.0
	for _, l := range lines {
		for i := range l.at {
			maxT = math.Max(maxT, l.at[i])
			lo = math.Min(lo, l.p95[i])
			hi = math.Max(hi, l.p95[i])
		}
	}
	if maxT == 0 || hi == 0 {
		return []byte(`<svg xmlns="http://www.w3.org/2000/svg"/>`)
	}
	lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	x := func(t float64) float64 { return left + (width-left-right)*t/maxT }
	y := func(v float64) float64 {
		return height - bottom - (height-top-bottom)*(math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="13">`, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%.0f" y="28" font-size="18">%s</text>`, left, xmlEscape(title))
	// Every run's windows start at its own beginning: draw the longest's.
	longest := 0
	for i, l := range lines {
		if len(l.windows) > len(lines[longest].windows) {
			longest = i
		}
	}
	if len(lines) > 0 {
		for i, w := range lines[longest].windows {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="#f3d3d3"/>`, x(w[0]), top, x(w[1])-x(w[0]), height-top-bottom)
			if i == 0 {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" fill="#a33">A degraded</text>`, x(w[0])+4, top+16)
			}
		}
	}
	for v := lo; v <= hi*1.001; v *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if tick := v * m; tick <= hi*1.001 {
				fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.0f" y="%.1f" text-anchor="end">%g ms</text>`,
					left, width-right, y(tick), y(tick), left-6, y(tick)+4, tick)
			}
		}
	}
	step := math.Max(1, math.Round(maxT/10))
	for t := 0.0; t <= maxT; t += step {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%gs</text>`, x(t), height-bottom+18, t)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">seconds since the start of the ×%g run, TTFT in ms of that run: ×%g for real time</text>`,
		(left+width-right)/2, height-bottom+40, scale, 1/scale)
	for i, l := range lines {
		var path bytes.Buffer
		for j := range l.at {
			cmd := "L"
			if j == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&path, "%s%.1f,%.1f ", cmd, x(l.at[j]), y(l.p95[j]))
		}
		color := colors[i%len(colors)]
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="2.2"/>`, path.String(), color)
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s" stroke-width="3"/><text x="%.0f" y="%.0f">%s: TTFT p95 of each 1/%d of its run</text>`,
			left+10, left+34, top+34+float64(i)*18, top+34+float64(i)*18, color, left+40, top+38+float64(i)*18, xmlEscape(l.name), timelineBuckets)
	}
	b.WriteString(`</svg>`)
	return b.Bytes()
}

func xmlEscape(s string) string {
	var b bytes.Buffer
	for _, r := range s {
		switch r {
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '&':
			b.WriteString("&amp;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
