// Command demo shows first-token hedging cut the latency tail, on your
// machine, in one command:
//
//	go run ./examples/demo
//
// It starts two simulated LLM upstreams with the reference workload (BENCHMARKS.md, "The reference workload":
// TTFT lognormal around 600 ms, 2 % stalls of 10–20 s, early headers, a
// role-only first chunk and keep-alive pings, all time-scaled to run fast),
// and a real Caddy, in this process, with three sites: plain reverse_proxy
// over both upstreams, llm_hedge with a fixed delay at the workload's p95,
// and llm_hedge with the adaptive delay. It drives the same streaming
// requests through each and prints a side-by-side table against the ideal
// hedge computed from the same draws, and writes a TTFT CDF chart.
//
// With -scenario regime it shows latency-aware routing instead: upstream A
// degrades 8x for 30 s of every 80 s (real time), and the same requests go
// through llm_hedge with `primary ordered` and `primary fastest`; it
// prints both regimes side by side and charts the TTFT p95 over time (see
// regime.go).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/llmhedge/llmhedge/internal/stats"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/refload"
)

func main() {
	opts := options{}
	flag.IntVar(&opts.n, "n", 2000, "streaming requests per variant")
	flag.IntVar(&opts.concurrency, "concurrency", 40, "requests in flight")
	flag.Float64Var(&opts.scale, "scale", 0.05, "time scale of the reference workload (0.05 runs 20x faster)")
	flag.Int64Var(&opts.seed, "seed", 1, "seed of the simulated latencies")
	flag.StringVar(&opts.chart, "chart", "llmhedge-demo-ttft.svg", "where to write the TTFT CDF chart (SVG)")
	flag.BoolVar(&opts.json, "json", false, "print the results as JSON instead of a table")
	flag.DurationVar(&opts.delay, "delay", 0, "fixed hedge delay of the llm_hedge site, in scaled time (default: the workload's true p95)")
	flag.BoolVar(&opts.simOnly, "sim-only", false, "only serve the two simulated upstreams (to point llmhedge-tune or a proxy at them) until Ctrl-C")
	flag.StringVar(&opts.simPorts, "sim-ports", "9001,9002", "with -sim-only, the loopback ports of A and B (the Traefik and Envoy examples use 9001,9002; 0,0 lets the system choose)")
	scenario := flag.String("scenario", "reference", "reference (the tail cut) or regime (upstream A degrades for 30s of every 80s: primary ordered against primary fastest)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	do := run
	switch *scenario {
	case "reference":
	case "regime":
		// Long enough for three degraded windows at the default scale.
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["n"] {
			opts.n = 4000
		}
		if !set["concurrency"] {
			opts.concurrency = 20
		}
		if !set["chart"] {
			opts.chart = "llmhedge-demo-regime.svg"
		}
		do = runRegime
	default:
		fmt.Fprintf(os.Stderr, "demo: -scenario %q: want reference or regime\n", *scenario)
		os.Exit(2)
	}
	if err := do(ctx, opts, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type options struct {
	n, concurrency int
	scale          float64
	seed           int64
	chart          string
	json           bool
	delay          time.Duration
	simOnly        bool
	simPorts       string
}

// Row is one line of the table (and of the JSON output). Durations are in
// milliseconds of the scaled run.
type Row struct {
	Name        string  `json:"name"`
	Requests    int     `json:"requests"`
	Failed      int     `json:"failed"`
	Wrong       int     `json:"wrong"`
	TTFTP50     float64 `json:"ttft_p50_ms"`
	TTFTP95     float64 `json:"ttft_p95_ms"`
	TTFTP99     float64 `json:"ttft_p99_ms"`
	TTFTMax     float64 `json:"ttft_max_ms"`
	TotalP50    float64 `json:"total_p50_ms,omitempty"`
	TotalP99    float64 `json:"total_p99_ms,omitempty"`
	TotalMax    float64 `json:"total_max_ms,omitempty"`
	ExtraLoad   float64 `json:"extra_load_pct"`
	HedgeWins   float64 `json:"hedge_win_pct"`
	P99VsIdeal  float64 `json:"p99_vs_ideal"`
	DelayMillis float64 `json:"delay_ms,omitempty"`
}

// Results is the whole run.
type Results struct {
	Scale       float64 `json:"scale"`
	Seed        int64   `json:"seed"`
	Concurrency int     `json:"concurrency"`
	TrueP95     float64 `json:"true_p95_ms"`
	Rows        []Row   `json:"rows"`
	Chart       string  `json:"chart"`
	WallSeconds float64 `json:"wall_seconds"`
}

func run(ctx context.Context, opts options, stdout, stderr io.Writer) error {
	began := time.Now()
	w := llmsim.Reference(opts.seed, opts.scale)
	p95 := w.TrueQuantile(0.95)
	if opts.simOnly {
		return serveSimOnly(ctx, w, opts, stdout)
	}
	a := llmsim.Start("A", w)
	defer a.Close()
	b := llmsim.Start("B", w)
	defer b.Close()
	delay := p95
	if opts.delay > 0 {
		delay = opts.delay
	}
	sites, err := startCaddy(a.URL, b.URL, delay)
	if err != nil {
		return err
	}
	defer stopCaddy()
	fmt.Fprintf(stderr, "simulated upstreams A and B (reference workload x%g, true TTFT p95 %s); Caddy with reverse_proxy and llm_hedge in-process\n",
		opts.scale, p95.Round(time.Millisecond/10))

	res := &Results{Scale: opts.scale, Seed: opts.seed, Concurrency: opts.concurrency, TrueP95: ms(p95)}
	var ids []string
	var chartSeries []stats.Series
	for _, site := range sites {
		a.ResetCounters()
		b.ResetCounters()
		bar := newProgress(stderr, site.name, opts.n)
		out := refload.Run(ctx, refload.Options{
			URL: site.url + "/v1/chat/completions", N: opts.n, Concurrency: opts.concurrency,
			Upstreams: []string{"A", "B"}, Progress: bar.update,
		})
		bar.done()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		ids = out.IDs
		served := a.Served() + b.Served()
		row := summarize(site.name, out, served, opts.n)
		if site.hedged {
			row.DelayMillis = ms(site.delay) // 0 for the adaptive site
		}
		res.Rows = append(res.Rows, row)
		chartSeries = append(chartSeries, stats.Series{Name: site.name, Values: stats.Successful(out.TTFT), Note: extraNote(row.ExtraLoad)})
	}
	peers := refload.ComputePeers(w, "A", "B", ids, delay)
	ideal := Row{Name: "ideal hedge (computed)", Requests: len(ids), ExtraLoad: 100 * peers.IdealExtra, P99VsIdeal: 1}
	fill(&ideal, peers.Ideal, nil)
	idealP99 := ideal.TTFTP99
	for i := range res.Rows {
		res.Rows[i].P99VsIdeal = res.Rows[i].TTFTP99 / idealP99
	}
	res.Rows = append(res.Rows, ideal)
	chartSeries = append(chartSeries, stats.Series{Name: "ideal hedge (computed)", Values: peers.Ideal, Note: extraNote(ideal.ExtraLoad)})

	chart := demoChart(opts, chartSeries, delay)
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
	printTable(stdout, res)
	return nil
}

// demoChart draws the variants' TTFT: the upper panel a row per variant
// with its percentiles and extra load (their full CDFs coincide below the
// delay), the tail panel their CDFs from 90 %, the time axis in the run's
// scaled time with the factor to real time.
func demoChart(opts options, series []stats.Series, delay time.Duration) []byte {
	return stats.ChartOptions{
		Title:       fmt.Sprintf("TTFT, %d streaming requests per variant (reference workload ×%g)", opts.n, opts.scale),
		Delay:       delay,
		DelayLabel:  "hedge delay " + fmt.Sprintf("%.0f ms", ms(delay)) + " (fixed site)",
		Percentiles: true,
		TimeScale:   opts.scale,
	}.CDF(series)
}

// extraNote is a variant's extra upstream requests, as the chart shows it.
func extraNote(pct float64) string { return fmt.Sprintf("+%.1f %% requests", pct) }

func summarize(name string, out *refload.Result, served int64, n int) Row {
	row := Row{Name: name, Requests: n, Failed: out.Failed, Wrong: out.Wrong}
	fill(&row, stats.Successful(out.TTFT), stats.Successful(out.Total))
	extra := served - int64(n)
	row.ExtraLoad = 100 * float64(extra) / float64(n)
	hedgeWins := 0
	for _, w := range out.Winner {
		if w == "B" {
			hedgeWins++
		}
	}
	if extra > 0 {
		row.HedgeWins = 100 * float64(hedgeWins) / float64(extra)
	}
	return row
}

func fill(row *Row, ttft, total []time.Duration) {
	s := stats.Summarize(ttft)
	row.TTFTP50, row.TTFTP95, row.TTFTP99, row.TTFTMax = ms(s.P50), ms(s.P95), ms(s.P99), ms(s.Max)
	if len(total) > 0 {
		t := stats.Summarize(total)
		row.TotalP50, row.TotalP99, row.TotalMax = ms(t.P50), ms(t.P99), ms(t.Max)
	}
}

func printTable(w io.Writer, res *Results) {
	fmt.Fprintf(w, "\nTTFT and total time in ms of the x%g run (multiply by %g for real time); true TTFT p95 %.1f ms\n\n",
		res.Scale, 1/res.Scale, res.TrueP95)
	fmt.Fprintf(w, "%-30s %7s %7s %7s %7s | %7s %7s | %6s %6s %9s %6s\n",
		"variant", "p50", "p95", "p99", "max", "tot p99", "tot max", "extra", "h.wins", "p99/ideal", "failed")
	for _, r := range res.Rows {
		total := fmt.Sprintf("%7.1f %7.1f", r.TotalP99, r.TotalMax)
		if r.TotalMax == 0 {
			total = fmt.Sprintf("%7s %7s", "-", "-")
		}
		name := r.Name
		if r.DelayMillis > 0 {
			name = fmt.Sprintf("%s (%.0fms)", r.Name, r.DelayMillis)
		}
		fmt.Fprintf(w, "%-30s %7.1f %7.1f %7.1f %7.1f | %s | %5.1f%% %5.1f%% %9.2f %6d\n",
			name, r.TTFTP50, r.TTFTP95, r.TTFTP99, r.TTFTMax, total, r.ExtraLoad, r.HedgeWins, r.P99VsIdeal, r.Failed+r.Wrong)
	}
	plain, fixed := res.Rows[0], res.Rows[1]
	fmt.Fprintf(w, "\nllm_hedge (fixed) p99 TTFT is %.2fx reverse_proxy's at %.1f%% extra upstream attempts.\n",
		fixed.TTFTP99/plain.TTFTP99, fixed.ExtraLoad)
	fmt.Fprintf(w, "chart: %s\n", res.Chart)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
