package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/llmhedge/llmhedge/internal/stats"
)

// millis is a duration that reads as milliseconds in JSON.
type millis time.Duration

// MarshalJSON writes m in milliseconds with microsecond precision.
func (m millis) MarshalJSON() ([]byte, error) {
	return strconv.AppendFloat(nil, float64(m)/float64(time.Millisecond), 'f', 3, 64), nil
}

// distribution is the summary of a set of durations: p50, p95, p99, max.
type distribution struct {
	N   int    `json:"n"`
	P50 millis `json:"p50_ms"`
	P95 millis `json:"p95_ms"`
	P99 millis `json:"p99_ms"`
	Max millis `json:"max_ms"`
}

func distributionOf(ds []time.Duration) distribution {
	s := stats.Summarize(ds)
	return distribution{N: s.N, P50: millis(s.P50), P95: millis(s.P95), P99: millis(s.P99), Max: millis(s.Max)}
}

// endpointResult is what one endpoint did.
type endpointResult struct {
	endpoint
	URL  string `json:"url"`
	Role string `json:"role"`
	// Sent counts requests sent; Completed those not cut short by Ctrl-C.
	Sent      int `json:"sent"`
	Completed int `json:"completed"`
	// OK counts answers with a first output event; Errors every failure,
	// by kind in ErrorKinds, with the first few messages in ErrorExamples.
	OK            int            `json:"ok"`
	Errors        int            `json:"errors"`
	ErrorKinds    map[string]int `json:"error_kinds,omitempty"`
	ErrorExamples []string       `json:"error_examples,omitempty"`
	TTFT          distribution   `json:"ttft"`
	Total         distribution   `json:"total"`
	// Billed counts the answers with a 2xx status; InputTokens and
	// OutputTokens are their tokens, UsageReported how many of them came
	// from a usage block (the others: input estimated as body bytes / 4,
	// output counted as content events). CostUSD is their price.
	Billed        int     `json:"billed"`
	InputTokens   int64   `json:"input_tokens"`
	OutputTokens  int64   `json:"output_tokens"`
	UsageReported int     `json:"usage_reported"`
	CostUSD       float64 `json:"cost_usd"`
}

// outcome is what a client would see under one strategy.
type outcome struct {
	TTFT  distribution `json:"ttft"`
	Total distribution `json:"total"`
	// Failed counts requests with no answer under the strategy.
	Failed int `json:"failed"`
}

// recommendation is the tuned hedge delay and what it buys.
type recommendation struct {
	// TargetExtra is -target-extra; Quantile = 1 - TargetExtra is the
	// primary's TTFT quantile used as the delay.
	TargetExtra float64 `json:"target_extra"`
	Quantile    float64 `json:"quantile"`
	// Delay is the recommended hedge delay (Go duration syntax).
	Delay   string        `json:"delay"`
	DelayMs millis        `json:"delay_ms"`
	delay   time.Duration // the same, for the snippets
	// ExpectedExtra is the share of paired requests that would start a
	// hedge with Delay (primary slower than Delay, or failed).
	ExpectedExtra float64 `json:"expected_extra"`
	Primary       string  `json:"primary"`
	Secondary     string  `json:"secondary"`
	// SelfPaired: there was no second endpoint of the primary's format, so
	// each primary sample is paired with the primary's next one, as if the
	// hedge went to an independent replica of the same endpoint.
	SelfPaired bool `json:"self_paired,omitempty"`
	// Pairs is the number of request indices both endpoints completed.
	Pairs int `json:"pairs"`
	// NoHedge is the primary alone; Hedged the hedge at Delay, computed
	// per pair as min(TTFT_A, d + TTFT_B) (a failed primary hedges at
	// once); RaceAll sends both at once (100 % extra).
	NoHedge outcome `json:"no_hedge"`
	Hedged  outcome `json:"hedged"`
	RaceAll outcome `json:"race_all"`

	pairs []pair // the paired samples behind the numbers
}

// results is the whole report.
type results struct {
	Endpoints            []endpointResult `json:"endpoints"`
	RequestedPerEndpoint int              `json:"requested_per_endpoint"`
	Interrupted          bool             `json:"interrupted"`
	Wall                 millis           `json:"wall_ms"`
	Recommendation       *recommendation  `json:"recommendation"`
	// Notes are caveats in plain words (e.g. too few samples for a p99).
	Notes []string `json:"notes,omitempty"`
	// Strategies compares single request, priority tier, race-all and the
	// hedge on the same requests, with their cost.
	Strategies *strategyTable    `json:"strategies,omitempty"`
	Snippets   *snippets         `json:"snippets,omitempty"`
	Files      map[string]string `json:"files,omitempty"`

	chart []byte
}

// maxErrorExamples bounds the error messages kept per endpoint.
const maxErrorExamples = 5

// analyze summarises m and derives the recommendation.
func analyze(p *plan, m *measurement) *results {
	o := p.opts
	res := &results{RequestedPerEndpoint: o.N, Interrupted: m.Interrupted, Wall: millis(m.Wall)}
	for e, ep := range o.Endpoints {
		r := endpointStats(ep, e, m.Samples[e])
		r.Role = role(o.Endpoints, e)
		res.Endpoints = append(res.Endpoints, r)
	}
	if m.Interrupted {
		res.Notes = append(res.Notes, fmt.Sprintf("Interrupted: the report covers the %d of %d requests per endpoint that completed.",
			res.Endpoints[0].Completed, o.N))
	}
	secondary := pickSecondary(o.Endpoints)
	rec, _, note := recommend(o, m, secondary)
	if note != "" {
		res.Notes = append(res.Notes, note)
	}
	res.Recommendation = rec

	title := "Time to first token of " + o.Endpoints[0].Name
	var series []stats.Series
	var delay time.Duration
	delayLabel := ""
	if rec != nil {
		res.Strategies = strategies(o, m, rec)
		series = strategySeries(res.Strategies)
		delay = rec.delay
		delayLabel = fmt.Sprintf("hedge delay %s: +%.1f %% requests", rec.Delay, 100*rec.ExpectedExtra)
		title = fmt.Sprintf("TTFT by strategy: %s hedged to %s at %s (%d requests)", rec.Primary, rec.Secondary, rec.Delay, res.Strategies.Requests)
		if rec.Pairs < 100 {
			res.Notes = append(res.Notes, fmt.Sprintf("Only %d paired requests: the p99 rests on %d samples; use -n 500 or more for a stable tail.",
				rec.Pairs, int(math.Ceil(float64(rec.Pairs)/100))))
		}
		res.Snippets = makeSnippets(o.Endpoints, secondary, rec)
	} else {
		series = []stats.Series{{Name: o.Endpoints[0].Name + " (primary)", Values: okTTFTs(m.Samples[0])}}
	}
	res.chart = stats.ChartOptions{Title: title, Delay: delay, DelayLabel: delayLabel, Percentiles: true}.CDF(series)
	return res
}

// strategySeries is one chart series per strategy, its extra requests and
// cost in the legend.
func strategySeries(t *strategyTable) []stats.Series {
	series := make([]stats.Series, 0, len(t.Rows))
	for _, r := range t.Rows {
		note := fmt.Sprintf("+%.0f %% requests", 100*r.Extra)
		if r.Extra > 0 && r.Extra < 1 {
			note = fmt.Sprintf("+%.1f %% requests", 100*r.Extra)
		}
		if t.Priced {
			note += fmt.Sprintf(" · $%.4f per 1k", r.CostPer1000)
		}
		series = append(series, stats.Series{Name: r.Label + " (" + strings.Join(r.Endpoints, "+") + ")", Note: note, Values: r.ttft})
	}
	return series
}

// endpointStats summarises one endpoint's samples.
func endpointStats(ep endpoint, index int, samples []sample) endpointResult {
	r := endpointResult{endpoint: ep, URL: ep.URL(), Role: "secondary"}
	if index == 0 {
		r.Role = "primary"
	}
	var ttft, total []time.Duration
	for _, s := range samples {
		if s.Sent {
			r.Sent++
		}
		if !s.completed() {
			continue
		}
		r.Completed++
		if s.ok() {
			r.OK++
			ttft = append(ttft, s.TTFT)
		}
		if s.Total > 0 {
			total = append(total, s.Total)
		}
		if s.Billed {
			r.Billed++
			r.InputTokens += s.InTokens
			r.OutputTokens += s.OutTokens
			r.CostUSD += ep.cost(s)
			if s.Usage {
				r.UsageReported++
			}
		}
		if s.Err != "" {
			r.Errors++
			if r.ErrorKinds == nil {
				r.ErrorKinds = map[string]int{}
			}
			r.ErrorKinds[s.Kind]++
			if len(r.ErrorExamples) < maxErrorExamples {
				r.ErrorExamples = append(r.ErrorExamples, s.Err)
			}
		}
	}
	r.TTFT, r.Total = distributionOf(ttft), distributionOf(total)
	return r
}

// pickSecondary is the endpoint the hedge goes to: the first after the
// primary that speaks the primary's format (a proxy forwards one body to
// every upstream, so it cannot hedge across formats) and is not the
// priority tier. 0 means none.
func pickSecondary(eps []endpoint) int {
	for i := 1; i < len(eps); i++ {
		if eps[i].Format == eps[0].Format && !eps[i].Priority {
			return i
		}
	}
	return 0
}

// recommend picks the delay and predicts the hedge from the paired
// samples. It also returns the predicted hedged TTFTs (for the chart) and
// a note when something limits the result.
func recommend(o *options, m *measurement, secondary int) (*recommendation, []time.Duration, string) {
	primary := m.Samples[0]
	var done []int // completed primary indices
	for i, s := range primary {
		if s.completed() {
			done = append(done, i)
		}
	}
	delay, note, ok := pickDelay(primary, done, 1-o.TargetExtra)
	if !ok {
		return nil, nil, note
	}
	rec := &recommendation{
		TargetExtra: o.TargetExtra,
		Quantile:    1 - o.TargetExtra,
		Delay:       delay.String(),
		DelayMs:     millis(delay),
		delay:       delay,
		Primary:     o.Endpoints[0].Name,
	}
	var pairs []pair
	if secondary > 0 {
		rec.Secondary = o.Endpoints[secondary].Name
		for _, i := range done {
			if b := m.Samples[secondary][i]; b.completed() {
				pairs = append(pairs, pair{i: i, a: primary[i], b: b, bEndpoint: secondary})
			}
		}
	} else {
		rec.Secondary, rec.SelfPaired = o.Endpoints[0].Name, true
		for k, i := range done {
			pairs = append(pairs, pair{i: i, a: primary[i], b: primary[done[(k+1)%len(done)]]})
		}
		note = joinNotes(note, "No second endpoint of the primary's format: the hedge is predicted against an independent replica of the primary (each sample paired with the next one).")
	}
	rec.Pairs = len(pairs)
	var noHedge, hedged, raceAll strategy
	hedges := 0
	for _, pr := range pairs {
		a, b := pr.a, pr.b
		noHedge.add(a.TTFT, a.Total, a.ok())
		t, total, won, started := hedge(a, b, delay)
		hedged.add(t, total, won)
		if started {
			hedges++
		}
		t, total, won, _ = hedge(a, b, 0)
		raceAll.add(t, total, won)
	}
	if len(pairs) > 0 {
		rec.ExpectedExtra = float64(hedges) / float64(len(pairs))
	}
	rec.NoHedge, rec.Hedged, rec.RaceAll = noHedge.outcome(), hedged.outcome(), raceAll.outcome()
	rec.pairs = pairs
	return rec, hedged.ttft, note
}

// pair is request i on the primary (a) and on the hedge target (b, of
// endpoint bEndpoint; with self-pairing the primary's next sample).
type pair struct {
	i         int
	a, b      sample
	bEndpoint int
}

// pickDelay is the nearest-rank q-quantile of the primary's TTFT over its
// completed requests, a failure counting as slower than any answer (a
// failure starts a hedge too). ok is false when nothing completed.
func pickDelay(primary []sample, done []int, q float64) (time.Duration, string, bool) {
	if len(done) == 0 {
		return 0, "No request to the primary completed: no delay can be recommended.", false
	}
	const failed = time.Duration(math.MaxInt64)
	keys := make([]time.Duration, 0, len(done))
	var slowest time.Duration
	for _, i := range done {
		s := primary[i]
		if !s.ok() {
			keys = append(keys, failed)
			continue
		}
		keys = append(keys, s.TTFT)
		slowest = max(slowest, s.TTFT)
	}
	d := stats.Quantile(keys, q)
	note := ""
	if d == failed {
		if slowest == 0 {
			return 0, "Every completed request to the primary failed: no delay can be recommended (see its errors).", false
		}
		failures := 0
		for _, k := range keys {
			if k == failed {
				failures++
			}
		}
		note = fmt.Sprintf("The primary failed on %.1f %% of requests, more than the target extra load: its failures alone start more hedges than the target allows. The delay is its slowest answer.",
			100*float64(failures)/float64(len(keys)))
		d = slowest
	}
	return roundDelay(d), note, true
}

// roundDelay keeps a delay readable in a configuration file: whole
// milliseconds, or tenths below 10 ms (time-scaled simulations). It rounds
// up, so that the rounded delay never hedges more than the target.
func roundDelay(d time.Duration) time.Duration {
	unit := time.Millisecond
	if d < 10*time.Millisecond {
		unit = 100 * time.Microsecond
	}
	return (d + unit - 1) / unit * unit
}

// hedge is the ideal hedge of one pair at delay d, min(TTFT_A, d + TTFT_B)
// (see README.md of this command, "How the prediction is computed"): the backup
// starts at d, or at once when the primary failed earlier, and the first
// output wins; a fatal client error goes to the client unhedged. started
// says whether the backup was sent. d = 0 is race-all.
func hedge(a, b sample, d time.Duration) (ttft, total time.Duration, ok, started bool) {
	if a.ok() && a.TTFT <= d {
		return a.TTFT, a.Total, true, false
	}
	if a.Fatal {
		return 0, 0, false, false
	}
	start := d
	if !a.ok() && a.FailedAt < d {
		start = a.FailedAt
	}
	if b.ok() && (!a.ok() || start+b.TTFT < a.TTFT) {
		total := time.Duration(0)
		if b.Total > 0 {
			total = start + b.Total
		}
		return start + b.TTFT, total, true, true
	}
	if a.ok() {
		return a.TTFT, a.Total, true, true
	}
	return 0, 0, false, true
}

// strategy collects the outcomes of one strategy over the pairs.
type strategy struct {
	ttft, total []time.Duration
	failed      int
}

func (s *strategy) add(ttft, total time.Duration, ok bool) {
	if !ok {
		s.failed++
		return
	}
	s.ttft = append(s.ttft, ttft)
	if total > 0 {
		s.total = append(s.total, total)
	}
}

func (s *strategy) outcome() outcome {
	return outcome{TTFT: distributionOf(s.ttft), Total: distributionOf(s.total), Failed: s.failed}
}

// okTTFTs returns the TTFTs of the answered requests, in index order.
func okTTFTs(samples []sample) []time.Duration {
	var out []time.Duration
	for _, s := range samples {
		if s.ok() {
			out = append(out, s.TTFT)
		}
	}
	return out
}

func joinNotes(a, b string) string {
	if a == "" {
		return b
	}
	return a + " " + b
}
