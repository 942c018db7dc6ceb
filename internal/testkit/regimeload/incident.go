package regimeload

// The incident benchmark: the adaptive parts of a route —
// `primary fastest`, the adaptive delay and the default hedge budget —
// together, from a cold start inside a provider incident, on workloads
// they were not tuned for. Every measured run starts fresh proxy
// instances (nothing reached their routes before) and drives a shifting
// pair of upstreams and a calm pair at the same time with the same request
// ids, so that the ratios compare the incident with no incident on the
// same draws and under the same machine load.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/internal/stats"
	"github.com/llmhedge/llmhedge/internal/testkit/lightload"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// Variant is one incident: how the shifting upstreams degrade and what
// else happens during the run. Durations are workload time, as in
// llmsim.Regime: real time is them times the scale (at the reference
// scale 0.05, 80s is 4 s).
type Variant struct {
	// Name is the variant's letter, as LLMHEDGE_INCIDENT_VARIANTS names it.
	Name string
	// Desc says what happens, in real time at the reference scale.
	Desc string
	// Regime is how the shifting upstream A degrades; Timeline places its
	// Epoch when the run starts (Offset 0: the first requests arrive
	// inside a window).
	Regime llmsim.Regime
	// BothDegrade: B follows Regime too, so no routing can gain anything;
	// an unhedged route (max_attempts 1) on a third shifting pair runs
	// beside, and the hedged route must do no worse than it within the
	// budget.
	BothDegrade bool
	// RestartInto, when not 0, restarts the gateway this long into the
	// first degraded window: the clients switch to a second proxy
	// instance, started before the run and never reached before.
	RestartInto time.Duration
}

// Restarts reports whether the variant restarts the gateway.
func (v Variant) Restarts() bool { return v.RestartInto > 0 }

// window is a Regime that degrades by factor for window of every period,
// from offset into it (workload time).
func window(factor float64, period, window, offset time.Duration) llmsim.Regime {
	return llmsim.Regime{Period: period, Window: window, Offset: offset, Factor: factor}
}

// Variants are the incidents (a)–(g).
var Variants = []Variant{
	{Name: "a", Desc: "A 8x slower for 1.5 s of every 4 s, from the start of a window",
		Regime: window(8, 80*time.Second, 30*time.Second, 0)},
	{Name: "b", Desc: "A 8x slower for 1.5 s of every 4 s, calm first (the window closes each period)",
		Regime: window(8, 80*time.Second, 30*time.Second, 50*time.Second)},
	{Name: "c", Desc: "A 3x slower for 1.5 s of every 4 s, from the start of a window",
		Regime: window(3, 80*time.Second, 30*time.Second, 0)},
	{Name: "d", Desc: "A 20x slower for 1.5 s of every 4 s, from the start of a window",
		Regime: window(20, 80*time.Second, 30*time.Second, 0)},
	{Name: "e", Desc: "flapping: A 8x slower for 300 ms of every 1 s, from the start of a window",
		Regime: window(8, 20*time.Second, 6*time.Second, 0)},
	{Name: "f", Desc: "A and B both 8x slower for 1.5 s of every 4 s, from the start of a window",
		Regime: window(8, 80*time.Second, 30*time.Second, 0), BothDegrade: true},
	{Name: "g", Desc: "gateway restart: calm 1 s, then A 8x slower for 1.5 s of every 4 s; 0.75 s into the window the clients switch to a fresh instance",
		Regime: window(8, 80*time.Second, 30*time.Second, 20*time.Second), RestartInto: 15 * time.Second},
}

// SelectVariants returns the variants named in list ("a,g"; empty: all),
// in Variants' order, or an error naming an unknown one.
func SelectVariants(list string) ([]Variant, error) {
	if strings.TrimSpace(list) == "" {
		return Variants, nil
	}
	want := map[string]bool{}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		known := false
		for _, v := range Variants {
			known = known || v.Name == name
		}
		if !known {
			return nil, fmt.Errorf("unknown incident variant %q (want some of a–g)", name)
		}
		want[name] = true
	}
	var out []Variant
	for _, v := range Variants {
		if want[v.Name] {
			out = append(out, v)
		}
	}
	return out, nil
}

// IncidentDelay is the adaptive delay's starting point on every route.
const IncidentDelay = 50 * time.Millisecond

// UnhedgedTolerance is how much worse than the unhedged route's the
// hedged route's p99 may be in variant f (both upstreams degraded): 2 %,
// the noise of the p99 of a few thousand requests through the same proxy
// on the same draws on a shared machine; nothing the policy may spend.
const UnhedgedTolerance = 0.02

// IncidentOptions are the options of the incident benchmark.
type IncidentOptions struct {
	// N requests per run, Concurrency clients per route. Defaults 4000
	// (ciRequests in the CI form) and 20.
	N, Concurrency int
	// Scale of the reference workload and of the regimes. Default 0.05.
	Scale float64
	// Seeds of the workload draws, one run each. Default 18, 19, 20; the
	// CI form runs the first only.
	Seeds []int64
	// Variants to run (SelectVariants's list). Default all.
	Variants string
	// CI is the CI form: ciRequests per run, one run per variant (the
	// clients taking turns), one seed, a shortened lead-in (see Timeline),
	// no bound checked.
	CI bool
	// P99Bound, MaxBound: the largest allowed ratios of the shifting
	// route's TTFT p99 and maximum to its calm baseline's. Defaults 1.15
	// and 1.5.
	P99Bound, MaxBound float64
	// ExtraPoints is how many percentage points of extra load above the
	// calm baseline's the shifting route may spend. Default 3.
	ExtraPoints float64
	// Check: fail t when a bound is missed (the long form); without it
	// the numbers are only logged. Wrong answers fail t always.
	Check bool
}

func (o IncidentOptions) withDefaults() IncidentOptions {
	switch {
	case o.N != 0:
	case o.CI:
		o.N = ciRequests
	default:
		o.N = 4000
	}
	if o.Concurrency == 0 {
		o.Concurrency = 20
	}
	if o.Scale == 0 {
		o.Scale = 0.05
	}
	if len(o.Seeds) == 0 {
		o.Seeds = []int64{18, 19, 20}
	}
	if o.CI {
		o.Seeds = o.Seeds[:1]
	}
	if o.P99Bound == 0 {
		o.P99Bound = 1.15
	}
	if o.MaxBound == 0 {
		o.MaxBound = 1.5
	}
	if o.ExtraPoints == 0 {
		o.ExtraPoints = 3
	}
	return o
}

// Client is one of the benchmark's load clients: Request returns the
// function that sends one streaming chat request to the route at base
// (ending in "/v1/") over hc and checks its answer.
type Client struct {
	Name    string
	Request func(hc *http.Client, base string, tokens int) caller
}

// Clients are the two clients every variant runs with: the official
// OpenAI Go SDK, and a light client that reads the SSE stream itself.
var Clients = []Client{
	{Name: "sdk", Request: sdkRequest},
	{Name: "light", Request: lightRequest},
}

func sdkRequest(hc *http.Client, base string, tokens int) caller {
	sdk := newSDK(hc, base)
	return func(ctx context.Context, id string) Request { return one(ctx, sdk, id, tokens) }
}

func lightRequest(hc *http.Client, base string, tokens int) caller {
	return func(ctx context.Context, id string) Request { return lightOne(ctx, hc, base, id, tokens) }
}

// clientsFor returns the clients the i-th variant run runs with: both,
// or in the CI form one, taking turns from variant to variant, so that a
// short run still exercises both.
func (o IncidentOptions) clientsFor(i int) []Client {
	if o.CI {
		return Clients[i%len(Clients) : i%len(Clients)+1]
	}
	return Clients
}

// keepAliveClient is a bare HTTP/1.1 client with a keep-alive connection
// for each of c clients (no proxy from the environment, no compression).
func keepAliveClient(c int) *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConns: 4 * c, MaxIdleConnsPerHost: 4 * c,
		IdleConnTimeout: 30 * time.Second, DisableCompression: true}}
}

// lightOne sends one streaming Chat Completions request with id to base
// with plain net/http, reads the SSE stream itself, times the first
// content delta and checks the whole answer as one does.
func lightOne(ctx context.Context, hc *http.Client, base, id string, tokens int) Request {
	out := Request{ID: id, Start: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"chat/completions", strings.NewReader(lightload.ChatStreamBody))
	if err != nil {
		out.Err = err.Error()
		return out
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-client")
	req.Header.Set(llmsim.HeaderRequest, id)
	resp, err := hc.Do(req)
	if err != nil {
		out.Err = err.Error()
		return out
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		out.Err = fmt.Sprintf("status %d: %q", resp.StatusCode, body)
		return out
	}
	var a answer
	if err := readChatSSE(resp.Body, &a, out.Start); err != nil {
		out.Err = err.Error()
		return out
	}
	a.settle(&out, tokens, resp.Header.Get(ReportHeader))
	return out
}

// chatChunk is what the light client reads of a Chat Completions chunk.
type chatChunk struct {
	ID      string `json:"id"`
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Error json.RawMessage `json:"error"`
}

// readChatSSE reads a Chat Completions SSE stream into a, up to its
// "data: [DONE]". Comments (pings, keep-alives) and other fields are
// skipped; an error event, a chunk that is not JSON, or a stream that
// ends before [DONE] is an error (a failure, as the SDK raises it).
func readChatSSE(body io.Reader, a *answer, start time.Time) error {
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			return nil
		}
		var ch chatChunk
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return fmt.Errorf("chunk not JSON: %.100q", data)
		}
		if len(ch.Error) > 0 && string(ch.Error) != "null" {
			return fmt.Errorf("error event: %.200s", ch.Error)
		}
		for _, c := range ch.Choices {
			a.chunk(ch.ID, c.Delta.Content, c.FinishReason, start)
		}
		if len(ch.Choices) == 0 {
			a.chunk(ch.ID, "", "", start)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return fmt.Errorf("the stream ended without data: [DONE]")
}

// switching sends each request through calls[0] until at, then through
// calls[1] (a gateway restart), and records the instance; with one
// caller, every request goes through it.
func switching(calls []caller, at time.Time) caller {
	if len(calls) == 1 {
		return calls[0]
	}
	return func(ctx context.Context, id string) Request {
		i := 0
		if !time.Now().Before(at) {
			i = 1
		}
		q := calls[i](ctx, id)
		q.Instance = i
		return q
	}
}

// The CI form's run is a few hundred requests, about a second: it caps
// the calm lead-in before the first degraded window (b, g) and the time
// into the window before the restart (g) at ciLead, so that its requests
// reach them whatever the machine's speed.
const (
	ciRequests = 300
	ciLead     = 250 * time.Millisecond
)

// Timeline places v's incident for a run starting at start: the regime
// with its Epoch (start itself, so that the run begins where the variant
// says, or, with ci, earlier, so that a calm lead-in lasts at most
// ciLead), and when the clients switch to the second proxy instance
// (RestartInto into the first window, at most ciLead with ci; the zero
// time when v restarts nothing). Durations are scaled by scale.
func Timeline(v Variant, start time.Time, scale float64, ci bool) (llmsim.Regime, time.Time) {
	scaled := func(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }
	g := v.Regime
	g.Epoch = start
	if lead := scaled(g.Offset); ci && lead > ciLead {
		g.Epoch = start.Add(ciLead - lead)
	}
	if !v.Restarts() {
		return g, time.Time{}
	}
	into := scaled(v.RestartInto)
	if ci && into > ciLead {
		into = ciLead
	}
	firstWindow := g.Epoch.Add(scaled(g.Offset))
	return g, firstWindow.Add(into)
}

// pair is two upstreams A and B of the same workload.
type pair struct{ a, b *llmsim.Running }

// startPair starts A and B of wl; they close at the end of t.
func startPair(t *testing.T, wl llmsim.Workload) pair {
	p := pair{a: llmsim.Start("A", wl), b: llmsim.Start("B", wl)}
	t.Cleanup(p.a.Close)
	t.Cleanup(p.b.Close)
	return p
}

// extra is the share of the pair's upstream attempts beyond one per
// request, for n requests.
func (p pair) extra(n int) float64 {
	return float64(p.a.Served()+p.b.Served()-int64(n)) / float64(n)
}

// ControlPrefix starts the request ids of the control route: the calm
// workload on draws of its own. A run's slowest request is decided by a
// double stall (a stall hedged to an attempt that stalls too, about 1 in
// 2,500 requests), in a calm run as in an incident, so the control's
// maximum against the calm baseline's shows how far two calm runs differ
// there, beside the incident's ratio.
const ControlPrefix = "ctl-"

// Route names of an incident run.
const (
	calmRoute     = "calm"     // the calm pair: the baseline
	controlRoute  = "control"  // a second calm pair on other draws (ControlPrefix): the maximum's noise
	shiftRoute    = "shift"    // the shifting pair: the incident
	unhedgedRoute = "unhedged" // variant f: max_attempts 1 on a third shifting pair
)

// incidentRoute is the route under test on the pair: primary fastest,
// adaptive delay from IncidentDelay, the default budget.
func incidentRoute(name string, p pair) Route {
	return Route{Name: name, Primary: "fastest", A: p.a.URL, B: p.b.URL, Delay: IncidentDelay}
}

// IncidentRun is one measured run of a variant with a client and a seed.
type IncidentRun struct {
	Variant Variant
	Client  string
	Seed    int64
	N       int
	Scale   float64
	// Regime is the shifting upstreams' regime, its Epoch placed by
	// Timeline.
	Regime llmsim.Regime
	// SwitchAt is when the clients switched to the second instance
	// (variant g); the zero time for the others.
	SwitchAt time.Time
	// Calm, Shift and (variant f) Unhedged are the routes' runs, Extra
	// filled in from their upstreams' counters; Control is the calm route
	// again on other draws (ControlPrefix), at the same time.
	Calm, Shift, Unhedged, Control *Run
}

// runIncident starts the upstreams and fresh proxy instances for one run
// of v with client cl and seed, drives every route at the same time with
// the same request ids, and returns what it measured.
func runIncident(t *testing.T, start Start, v Variant, cl Client, seed int64, opts IncidentOptions) *IncidentRun {
	wl := llmsim.Reference(seed, opts.Scale)
	n := opts.N
	pairs := map[string]pair{calmRoute: startPair(t, wl), shiftRoute: startPair(t, wl), controlRoute: startPair(t, wl)}
	names := []string{calmRoute, shiftRoute, controlRoute}
	if v.BothDegrade {
		pairs[unhedgedRoute] = startPair(t, wl)
		names = append(names, unhedgedRoute)
	}
	var routes []Route
	for _, name := range names {
		r := incidentRoute(name, pairs[name])
		if name == unhedgedRoute {
			r.MaxAttempts = 1
		}
		routes = append(routes, r)
	}
	// A fresh proxy instance per run (and a second one, started now too,
	// for a restart): the engine's state starts cold, and no request
	// reaches a route before the measured ones.
	instances := []map[string]string{start(t, routes)}
	if v.Restarts() {
		instances = append(instances, start(t, routes))
	}
	run := &IncidentRun{Variant: v, Client: cl.Name, Seed: seed, N: n, Scale: opts.Scale}
	run.Regime, run.SwitchAt = Timeline(v, time.Now(), opts.Scale, opts.CI)
	pairs[shiftRoute].a.SetRegime(run.Regime)
	if v.BothDegrade {
		pairs[shiftRoute].b.SetRegime(run.Regime)
		pairs[unhedgedRoute].a.SetRegime(run.Regime)
		pairs[unhedgedRoute].b.SetRegime(run.Regime)
	}
	runs := driveRoutes(names, instances, cl, run.SwitchAt, n, opts.Concurrency, wl.Tokens)
	for _, name := range names {
		runs[name].Route = name
		runs[name].Extra = pairs[name].extra(n)
	}
	run.Calm = runs[calmRoute]
	run.Control = runs[controlRoute]
	run.Shift = runs[shiftRoute]
	run.Unhedged = runs[unhedgedRoute]
	return run
}

// driveRoutes drives every named route at the same time, n requests with
// ids RunPrefix0… each, c clients each over a fresh keep-alive client;
// each route's requests go to the route on instances[0], and from
// switchAt on (when not zero) to instances[1].
func driveRoutes(names []string, instances []map[string]string, cl Client, switchAt time.Time, n, c, tokens int) map[string]*Run {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	runs := map[string]*Run{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, name := range names {
		hc := keepAliveClient(c)
		var calls []caller
		for _, bases := range instances {
			calls = append(calls, cl.Request(hc, bases[name], tokens))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer hc.CloseIdleConnections()
			prefix := RunPrefix
			if name == controlRoute {
				prefix = ControlPrefix
			}
			r := drive(ctx, prefix, n, c, switching(calls, switchAt))
			mu.Lock()
			runs[name] = r
			mu.Unlock()
		}()
	}
	wg.Wait()
	return runs
}

// Incident runs the incident benchmark through start: for every selected
// variant, client and seed, a run on fresh proxy instances (a subtest, so
// that its proxies stop when it ends); it logs each run's numbers and the
// worst of each variant's runs per client and, with opts.Check, fails t
// when a bound is missed. Wrong answers fail t always.
func Incident(t *testing.T, proxy string, start Start, opts IncidentOptions) {
	if testing.Short() {
		t.Skip("-short: the incident benchmark's load runs")
	}
	opts = opts.withDefaults()
	variants, err := SelectVariants(opts.Variants)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: incident benchmark, time scale %v, primary fastest, adaptive delay from %v, the default budget, %d concurrent clients per route, fresh proxy instances every run, seeds %v",
		proxy, opts.Scale, IncidentDelay, opts.Concurrency, opts.Seeds)
	for i, v := range variants {
		for _, cl := range opts.clientsFor(i) {
			var runs []*IncidentRun
			for _, seed := range opts.Seeds {
				t.Run(fmt.Sprintf("%s/%s/seed%d", v.Name, cl.Name, seed), func(t *testing.T) {
					run := runIncident(t, start, v, cl, seed, opts)
					for _, r := range []*Run{run.Calm, run.Shift, run.Unhedged, run.Control} {
						switch {
						case r == nil:
						case r.Wrong > 0:
							t.Errorf("%s %s: %d wrong answers and %d failed of %d: %v", proxy, r.Route, r.Wrong, r.Failed, run.N, r.Errors)
						case r.Failed > 0:
							t.Logf("%s %s: %d failed of %d: %v", proxy, r.Route, r.Failed, run.N, r.Errors)
						}
					}
					t.Logf("%s (%s): %s", v.Name, v.Desc, run.Summary())
					for _, q := range run.Slowest(3) {
						t.Logf("  slowest: %s", q)
					}
					runs = append(runs, run)
				})
			}
			if len(runs) > 0 {
				judge(t, proxy, v, cl.Name, runs, opts)
			}
		}
	}
}

// Summary is one line of the run's numbers.
func (r *IncidentRun) Summary() string {
	shift, calm := r.Shift.summary(), r.Calm.summary()
	var b strings.Builder
	fmt.Fprintf(&b, "%s client, seed %d, %d requests (%d started in a degraded window", r.Client, r.Seed, r.N, r.inWindows())
	if !r.SwitchAt.IsZero() {
		fmt.Fprintf(&b, ", %d after the restart", r.afterSwitch())
	}
	fmt.Fprintf(&b, "): TTFT p99 %s max %s, calm p99 %s max %s: p99 %.3fx, max %.3fx (control max %s: %.3fx); extra %.2f%%, calm %.2f%%: %+.2f points; primary changes %d (calm %d); failed %d (calm %d), wrong %d (calm %d); wall %v",
		ms(shift.P99), ms(shift.Max), ms(calm.P99), ms(calm.Max), r.P99Ratio(), r.MaxRatio(), ms(r.Control.summary().Max), r.ControlMaxRatio(),
		100*r.Shift.Extra, 100*r.Calm.Extra, r.ExtraGap(), r.Shift.Changes(), r.Calm.Changes(),
		r.Shift.Failed, r.Calm.Failed, r.Shift.Wrong, r.Calm.Wrong, r.Shift.Wall.Round(100*time.Millisecond))
	if r.Unhedged != nil {
		u := r.Unhedged.summary()
		fmt.Fprintf(&b, "; unhedged p99 %s max %s: p99 %.3fx unhedged's, extra %.2f%% (unhedged %.2f%%, budget %.2f%%); unhedged failed %d, wrong %d",
			ms(u.P99), ms(u.Max), r.VsUnhedged(), 100*r.Shift.Extra, 100*r.Unhedged.Extra, 100*BudgetShare(r.N, r.Shift.Wall), r.Unhedged.Failed, r.Unhedged.Wrong)
	}
	return b.String()
}

// Slowest describes the shifting route's n slowest requests: when each
// started (after the run's first window began; in a window or not), its
// TTFT, the calm baseline's for the same id, and the proxy's report.
func (r *IncidentRun) Slowest(n int) []string {
	calm := map[string]time.Duration{}
	for _, q := range r.Calm.Requests {
		calm[q.ID] = q.TTFT
	}
	reqs := append([]Request(nil), r.Shift.Requests...)
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].TTFT > reqs[j].TTFT })
	if len(reqs) > n {
		reqs = reqs[:n]
	}
	scaled := time.Duration(float64(r.Regime.Offset) * r.Scale)
	var out []string
	for _, q := range reqs {
		out = append(out, fmt.Sprintf("%s at %s (degraded %v, instance %d): TTFT %s, calm %s; %s", q.ID,
			ms(q.Start.Sub(r.Regime.Epoch.Add(scaled))), r.Regime.Degraded(q.Start, r.Scale), q.Instance, ms(q.TTFT), ms(calm[q.ID]), q.Report))
	}
	return out
}

// summary is the TTFT summary of the run's successful requests.
func (r *Run) summary() stats.Summary { return stats.Summarize(r.TTFTs(nil)) }

// P99Ratio is the shifting route's TTFT p99 over the calm baseline's.
func (r *IncidentRun) P99Ratio() float64 {
	return float64(r.Shift.summary().P99) / float64(r.Calm.summary().P99)
}

// MaxRatio is the shifting route's largest TTFT over the calm baseline's.
func (r *IncidentRun) MaxRatio() float64 {
	return float64(r.Shift.summary().Max) / float64(r.Calm.summary().Max)
}

// ControlMaxRatio is the control route's largest TTFT over the calm
// baseline's: two calm runs on different draws.
func (r *IncidentRun) ControlMaxRatio() float64 {
	if r.Control == nil {
		return 0
	}
	return float64(r.Control.summary().Max) / float64(r.Calm.summary().Max)
}

// ExtraGap is the shifting route's extra load minus the calm baseline's,
// in percentage points.
func (r *IncidentRun) ExtraGap() float64 { return 100 * (r.Shift.Extra - r.Calm.Extra) }

// VsUnhedged is the shifting route's TTFT p99 over the unhedged route's
// (variant f).
func (r *IncidentRun) VsUnhedged() float64 {
	return float64(r.Shift.summary().P99) / float64(r.Unhedged.summary().P99)
}

// BudgetShare is the most extra load the default hedge budget allows over
// n requests that took wall: its ratio, plus its bucket's burst, which
// starts full, plus what the bucket refills by time (all of burst in
// core.BudgetRefillTime).
func BudgetShare(n int, wall time.Duration) float64 {
	b := config.Config{}.WithDefaults().Budget
	return b.Ratio + b.Burst*(1+float64(wall)/float64(core.BudgetRefillTime))/float64(n)
}

// BudgetUse is the shifting route's extra load over what the budget
// allowed it in its run (variant f): at most 1.
func (r *IncidentRun) BudgetUse() float64 {
	return r.Shift.Extra / BudgetShare(r.N, r.Shift.Wall)
}

// failed counts the failed requests of every route of the run.
func (r *IncidentRun) failed() int {
	n := 0
	for _, run := range []*Run{r.Calm, r.Shift, r.Unhedged, r.Control} {
		if run != nil {
			n += run.Failed
		}
	}
	return n
}

// inWindows counts the shifting route's requests that started in a
// degraded window.
func (r *IncidentRun) inWindows() int {
	n := 0
	for _, q := range r.Shift.Requests {
		if r.Regime.Degraded(q.Start, r.Scale) {
			n++
		}
	}
	return n
}

// afterSwitch counts the shifting route's requests that went to the
// second proxy instance.
func (r *IncidentRun) afterSwitch() int {
	n := 0
	for _, q := range r.Shift.Requests {
		if q.Instance == 1 {
			n++
		}
	}
	return n
}

// bound is one acceptance bound on a value of a run: the worst run of a
// variant and client must keep the value at most limit.
type bound struct {
	what  string // names the value, with its unit
	value func(*IncidentRun) float64
	limit float64
}

// bounds are the acceptance bounds of a variant. With both upstreams
// degraded (f) nothing can be gained over the calm baseline: the route
// must do no worse than not hedging, within the budget.
func bounds(v Variant, opts IncidentOptions) []bound {
	failed := bound{"failed requests", func(r *IncidentRun) float64 { return float64(r.failed()) }, 0}
	if v.BothDegrade {
		return []bound{
			{"TTFT p99 / the unhedged route's (x)", (*IncidentRun).VsUnhedged, 1 + UnhedgedTolerance},
			{"extra load / the budget's share (ratio + burst × (1 + wall / 10 s) / N)", (*IncidentRun).BudgetUse, 1},
			failed,
		}
	}
	return []bound{
		{"TTFT p99 / the calm baseline's (x)", (*IncidentRun).P99Ratio, opts.P99Bound},
		{"max TTFT / the calm baseline's (x)", (*IncidentRun).MaxRatio, opts.MaxBound},
		{"extra load above the calm baseline's (points)", (*IncidentRun).ExtraGap, opts.ExtraPoints},
		failed,
	}
}

// worst returns the run with the largest value.
func worst(runs []*IncidentRun, value func(*IncidentRun) float64) *IncidentRun {
	sorted := append([]*IncidentRun(nil), runs...)
	sort.SliceStable(sorted, func(i, j int) bool { return value(sorted[i]) > value(sorted[j]) })
	return sorted[0]
}

// judge logs the worst of a variant's runs with one client for every
// bound and, with opts.Check, fails t for each bound it misses.
func judge(t *testing.T, proxy string, v Variant, client string, runs []*IncidentRun, opts IncidentOptions) {
	t.Logf("%s %s, %s client, worst of %d runs:", proxy, v.Name, client, len(runs))
	for _, b := range bounds(v, opts) {
		w := worst(runs, b.value)
		ok := b.value(w) <= b.limit
		msg := fmt.Sprintf("incident %s (%s), %s client: %s %.3f in the run of seed %d (want <= %.3f)",
			v.Name, v.Desc, client, b.what, b.value(w), w.Seed, b.limit)
		if !ok && opts.Check {
			t.Errorf("%s: %s", proxy, msg)
			continue
		}
		t.Logf("  %s %s", map[bool]string{true: "ok  ", false: "MISS"}[ok], msg)
	}
	over, controlOver := 0, 0
	for _, r := range runs {
		if r.MaxRatio() > opts.MaxBound {
			over++
		}
		if r.ControlMaxRatio() > opts.MaxBound {
			controlOver++
		}
	}
	t.Logf("  maximum over %.1fx the calm baseline's in %d of %d runs; the control (calm on other draws) in %d", opts.MaxBound, over, len(runs), controlOver)
	changes := worst(runs, func(r *IncidentRun) float64 { return float64(r.Shift.Changes()) })
	t.Logf("  most primary changes: %d (seed %d)", changes.Shift.Changes(), changes.Seed)
}
