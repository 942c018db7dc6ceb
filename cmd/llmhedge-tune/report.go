package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Files written to -out.
const (
	fileChart     = "ttft-cdf.svg"
	fileSamples   = "samples.csv"
	fileResults   = "results.json"
	fileCaddyfile = "Caddyfile"
	fileTraefik   = "traefik-dynamic.yml"
	fileEnvoy     = "llmhedge-extproc.yaml"
)

// writeOutputs writes the chart, the raw samples, the results and the
// snippets to dir and records their paths in res.Files.
func writeOutputs(dir string, res *results, m *measurement, eps []endpoint) error {
	res.Files = map[string]string{}
	write := func(role, name string, data []byte) error {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return err
		}
		res.Files[role] = path
		return nil
	}
	if err := write("chart", fileChart, res.chart); err != nil {
		return err
	}
	if err := write("samples", fileSamples, samplesCSV(m, eps)); err != nil {
		return err
	}
	if s := res.Snippets; s != nil {
		for _, f := range []struct{ role, name, text string }{
			{"caddyfile", fileCaddyfile, s.Caddyfile},
			{"traefik", fileTraefik, s.Traefik},
			{"envoy", fileEnvoy, s.Envoy},
		} {
			if err := write(f.role, f.name, []byte(f.text)); err != nil {
				return err
			}
		}
	}
	// Recorded before writing so results.json lists itself too.
	res.Files["results"] = filepath.Join(dir, fileResults)
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(res.Files["results"], append(data, '\n'), 0o644)
}

// samplesCSV is every completed request, one row per endpoint and index,
// so the numbers can be re-analysed elsewhere.
func samplesCSV(m *measurement, eps []endpoint) []byte {
	var b strings.Builder
	w := csv.NewWriter(&b)
	_ = w.Write([]string{"request", "endpoint", "ttft_ms", "total_ms", "error"})
	ms := func(d time.Duration) string {
		if d <= 0 {
			return ""
		}
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
	}
	for i := range m.Samples[0] {
		for e, ep := range eps {
			s := m.Samples[e][i]
			if !s.completed() {
				continue
			}
			_ = w.Write([]string{requestIDPrefix + strconv.Itoa(i), ep.Name, ms(s.TTFT), ms(s.Total), s.Err})
		}
	}
	w.Flush()
	return []byte(b.String())
}

// printJSON writes res as indented JSON.
func printJSON(w io.Writer, res *results) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// printReport writes res for people.
func printReport(w io.Writer, res *results) error {
	fmt.Fprintf(w, "\nMeasured in %s:\n", formatDuration(time.Duration(res.Wall)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "endpoint\tok\terrors\tTTFT p50\tp95\tp99\tmax\ttotal p50\tp95\tp99\tmax\t")
	for _, e := range res.Endpoints {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s%s\n", e.Name, e.OK, e.Errors, distCells(e.TTFT), distCells(e.Total))
	}
	tw.Flush()
	for _, e := range res.Endpoints {
		if e.Errors == 0 {
			continue
		}
		fmt.Fprintf(w, "Errors of %s: %s; e.g. %s\n", e.Name, kinds(e.ErrorKinds), e.ErrorExamples[0])
	}
	printTokens(w, res.Endpoints)
	if rec := res.Recommendation; rec != nil {
		fmt.Fprintf(w, "\nRecommended hedge delay: %s (p%s of %s's TTFT: target extra load %.1f %%, expected %.1f %% over %d paired requests).\n",
			rec.Delay, quantileName(rec.Quantile), rec.Primary, 100*rec.TargetExtra, 100*rec.ExpectedExtra, rec.Pairs)
		if t := res.Strategies; t != nil {
			printStrategies(w, t, rec)
		}
	}
	for _, n := range res.Notes {
		fmt.Fprintf(w, "Note: %s\n", n)
	}
	if s := res.Snippets; s != nil {
		fmt.Fprintf(w, "\n--- Caddyfile (%s)\n%s", res.Files["caddyfile"], s.Caddyfile)
		fmt.Fprintf(w, "\n--- Traefik (%s)\n%s", res.Files["traefik"], s.Traefik)
		fmt.Fprintf(w, "\n--- Envoy ext_proc server (%s)\n%s", res.Files["envoy"], s.Envoy)
	}
	_, err := fmt.Fprintf(w, "\nChart: %s\nSamples: %s\nResults: %s\n", res.Files["chart"], res.Files["samples"], res.Files["results"])
	return err
}

// distCells is p50, p95, p99 and max as tab-separated cells.
func distCells(d distribution) string {
	if d.N == 0 {
		return "-\t-\t-\t-\t"
	}
	cells := make([]string, 0, 4)
	for _, v := range []millis{d.P50, d.P95, d.P99, d.Max} {
		cells = append(cells, formatDuration(time.Duration(v)))
	}
	return strings.Join(cells, "\t") + "\t"
}

// kinds writes an error count map as "status 429 ×3, timeout ×1".
func kinds(m map[string]int) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s ×%d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// printStrategies writes the strategy table and the winner.
func printStrategies(w io.Writer, t *strategyTable, rec *recommendation) {
	fmt.Fprintf(w, "\nStrategies on the same %d requests (the hedge goes to %s; computed from the measured samples, an attempt sent is billed in full):\n", t.Requests, rec.Secondary)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "strategy\tsends to\textra\tfailed\tTTFT p50\tp95\tp99\tmax\ttotal p50\tp95\tp99\tmax\tUSD per 1k\t")
	for _, r := range t.Rows {
		cost := "-"
		if t.Priced {
			cost = fmt.Sprintf("%.4f", r.CostPer1000)
		}
		mark := ""
		if r.Name == t.Winner {
			mark = " ←"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s%s%s\t%s\n", r.Label, strings.Join(r.Endpoints, "+"), extraPercent(r.Extra), r.Failed,
			distCells(r.TTFT), distCells(r.Total), cost, mark)
	}
	tw.Flush()
	if t.Verdict != "" {
		fmt.Fprintln(w, t.Verdict)
	} else {
		fmt.Fprintln(w, "Set -target-p99 (e.g. -target-p99 1.5s) to have the cheapest strategy that meets it named.")
	}
}

// extraPercent writes a share of extra requests: "0 %", "5.2 %", "100 %".
func extraPercent(f float64) string {
	if f == 0 || f == 1 {
		return fmt.Sprintf("%.0f %%", 100*f)
	}
	return fmt.Sprintf("%.1f %%", 100*f)
}

// printTokens writes the billed tokens per answer and where they come from,
// for endpoints with a price.
func printTokens(w io.Writer, eps []endpointResult) {
	for _, e := range eps {
		if e.Billed == 0 || (e.PriceIn == 0 && e.PriceOut == 0) {
			continue
		}
		from := "usage blocks"
		switch {
		case e.UsageReported == 0:
			from = "no usage block: input estimated as body bytes / 4, output counted as content events"
		case e.UsageReported < e.Billed:
			from = fmt.Sprintf("usage blocks in %d of %d answers, the others estimated", e.UsageReported, e.Billed)
		}
		fmt.Fprintf(w, "Tokens of %s: %.1f in + %.1f out per answer (%s); $%g + $%g per million: $%.4f for %d answers.\n",
			e.Name, float64(e.InputTokens)/float64(e.Billed), float64(e.OutputTokens)/float64(e.Billed), from, e.PriceIn, e.PriceOut, e.CostUSD, e.Billed)
	}
}
