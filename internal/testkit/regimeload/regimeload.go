// Package regimeload is the regime-shift benchmark every adapter runs
// through its real proxy: upstream A degrades by a factor for a window of
// every period (llmsim.Regime), B stays calm, and routes with `primary
// ordered` and `primary fastest` are driven with the official OpenAI Go
// SDK, each on the shifting pair and on a calm pair. It measures what a
// client sees in each regime, the extra load, how often the primary
// changed, and how many requests and milliseconds the fastest route needed
// to leave A after it degraded and to come back after it recovered.
//
// Incident (incident.go) is the incident benchmark: the
// adaptive parts of `primary fastest` together, from a cold start inside
// a provider incident, on fresh proxy instances every run.
//
// It is test support: nothing outside this module's tests imports it.
package regimeload

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/stats"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/refload"
)

// ReportHeader is the report header every route must set (report_header).
const ReportHeader = "X-Llm-Hedge-Report"

// Route is one route an adapter must serve: upstreams A then B of the
// named pair, `primary` Primary, an adaptive delay starting at Delay
// (delay mode adaptive, fixed Delay), report header ReportHeader, hedge
// budget burst Burst and max_attempts MaxAttempts when they are not 0,
// A's prefer margin PreferA when it is not 0, defaults for the rest. An
// adapter's configuration writes nothing for a field that is 0, so that
// the engine's default holds.
type Route struct {
	Name    string // short, unique, safe in a URL path and a config key
	Primary string // "ordered" or "fastest"
	A, B    string // the upstreams' base URLs
	Delay   time.Duration
	// Burst is the hedge budget's burst; 0 leaves the default (10).
	Burst float64
	// PreferA is A's prefer margin; 0 sets none.
	PreferA float64
	// MaxAttempts bounds the race; 0 leaves the default (3), 1 is a route
	// that never hedges.
	MaxAttempts int
}

// RunPrefix starts the request ids of every measured run (RunPrefix0,
// RunPrefix1, …): the same ids, so the same draws, on every route.
const RunPrefix = "req-"

// Burst is the hedge budget's burst of every route: the requests that
// start in one hedge delay at the benchmark's rate (about 350 a second, 53
// ms), so that those that meet a degradation before the routing has seen
// it can all hedge. The default burst, 10, is sized for stalls, not for a
// whole upstream turning slow at once.
const Burst = 40

// Start serves every route through the adapter's proxy and returns each
// route's OpenAI base URL by name (ending in "/v1/"). The proxy stops at
// the end of the test.
type Start func(t *testing.T, routes []Route) map[string]string

// Options of a benchmark.
type Options struct {
	// N requests per run, Concurrency at a time. Defaults 4000 and 20.
	N, Concurrency int
	// Scale of the reference workload and of the regime. Default 0.05.
	Scale float64
	// Seed of the workload draws. Default 18.
	Seed int64
	// P99Bound is the largest allowed ratio of the fastest route's TTFT
	// p99 under the regime shift to its calm run's. Default 1.15.
	P99Bound float64
	// CalmBound is the largest allowed ratio of the calm fastest route's
	// TTFT p99 (run alone) to the ideal hedge's on the same draws. Default
	// 1.05. Whatever the bound, calm fastest must stay within 3 % of
	// ordered's p99 on the same draws (no worse than the static primary).
	CalmBound float64
	// Warmup requests go through every route, A calm, before the runs
	// (connections, the interpreter under Traefik, a calm history for the
	// estimates). Default N/20.
	Warmup int
	// Check: fail t when an acceptance bound is missed (the long form);
	// without it the numbers are only logged.
	Check bool
	// HTTPClient for the SDK. Default: keep-alive connections for
	// Concurrency clients.
	HTTPClient *http.Client
}

// Request is one request as the client saw it.
type Request struct {
	ID      string
	Start   time.Time
	TTFT    time.Duration // 0 when it failed
	Winner  string        // the upstream whose answer arrived
	First   string        // attempt 0's upstream (from the report header)
	Primary string        // the route's primary in force at the commit (fastest routes)
	Explore bool          // the request explored (attempt 0 on the runner-up)
	Changes int64         // primary changes so far (fastest routes)
	// Instance is the proxy instance the request went to: 0, or 1 after
	// a gateway restart (Incident's variant g).
	Instance int
	// Report is the report header as the proxy sent it.
	Report string
	Err    string
}

// Run is one series of requests through one route.
type Run struct {
	Route    string
	Start    time.Time
	Wall     time.Duration
	Requests []Request
	Failed   int
	Wrong    int
	Errors   []string
	// Extra is the share of upstream attempts beyond one per request.
	Extra float64
}

// Drive sends n streaming chat requests through the SDK at base, c at a
// time, with ids prefix0…, and checks every answer: the whole text of its
// own request from one upstream.
func Drive(ctx context.Context, client *http.Client, base, prefix string, n, c, tokens int) *Run {
	sdk := newSDK(client, base)
	return drive(ctx, prefix, n, c, func(ctx context.Context, id string) Request { return one(ctx, sdk, id, tokens) })
}

// newSDK is the OpenAI client of the benchmarks: no retries, so that a
// failure is counted rather than hidden.
func newSDK(client *http.Client, base string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base), option.WithAPIKey("sk-client"), option.WithMaxRetries(0),
		option.WithHTTPClient(client))
}

// caller runs one request with id and reports what the client saw.
type caller func(ctx context.Context, id string) Request

// drive sends n requests through call, c at a time, with ids prefix0…,
// and counts the failed and wrong answers (an Err starting "wrong
// answer").
func drive(ctx context.Context, prefix string, n, c int, call caller) *Run {
	run := &Run{Requests: make([]Request, n), Start: time.Now()}
	next := make(chan int)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				req := call(ctx, prefix+strconv.Itoa(i))
				mu.Lock()
				run.Requests[i] = req
				if req.Err != "" {
					if strings.HasPrefix(req.Err, wrongAnswer) {
						run.Wrong++
					} else {
						run.Failed++
					}
					if len(run.Errors) < 5 {
						run.Errors = append(run.Errors, req.ID+": "+req.Err)
					}
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	run.Wall = time.Since(run.Start)
	return run
}

// wrongAnswer starts the Err of a request whose answer arrived but was
// not its own whole answer (Run.Wrong), as opposed to a failure.
const wrongAnswer = "wrong answer"

// one runs one streaming chat completion.
func one(ctx context.Context, sdk openai.Client, id string, tokens int) Request {
	var resp *http.Response
	out := Request{ID: id, Start: time.Now()}
	params := openai.ChatCompletionNewParams{
		Model:    openai.ChatModel(llmsim.DefaultModel),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something.")},
	}
	s := sdk.Chat.Completions.NewStreaming(ctx, params, option.WithHeader(llmsim.HeaderRequest, id), option.WithResponseInto(&resp))
	defer s.Close()
	var a answer
	for s.Next() {
		ch := s.Current()
		for _, choice := range ch.Choices {
			a.chunk(ch.ID, choice.Delta.Content, choice.FinishReason, out.Start)
		}
		if len(ch.Choices) == 0 {
			a.chunk(ch.ID, "", "", out.Start)
		}
	}
	if err := s.Err(); err != nil {
		out.Err = err.Error()
		return out
	}
	report := ""
	if resp != nil {
		report = resp.Header.Get(ReportHeader)
	}
	a.settle(&out, tokens, report)
	return out
}

// answer is what a client read of one streamed chat answer.
type answer struct {
	ids      map[string]bool // the chunks' ids: one upstream's answer has one
	content  strings.Builder
	ttft     time.Duration // from the request's start to the first content delta
	finished bool          // a chunk said finish_reason "stop"
}

// chunk records one choice of a chunk (id, its delta's content, its
// finish reason) of a request started at start.
func (a *answer) chunk(id, content, finish string, start time.Time) {
	if a.ids == nil {
		a.ids = map[string]bool{}
	}
	a.ids[id] = true
	if content != "" {
		if a.ttft == 0 {
			a.ttft = time.Since(start)
		}
		a.content.WriteString(content)
	}
	if finish == "stop" {
		a.finished = true
	}
}

// settle checks the whole answer (finished, one upstream's chunks, the
// text of its own request) and records it in out: its winner, TTFT and
// the report header's fields, or a wrong answer.
func (a *answer) settle(out *Request, tokens int, report string) {
	if !a.finished || len(a.ids) != 1 || a.content.String() != llmsim.ExpectedChatText(out.ID, tokens) {
		out.Err = fmt.Sprintf("%s: %d chunk ids, finished %v, %d bytes of text", wrongAnswer, len(a.ids), a.finished, a.content.Len())
		return
	}
	for chunkID := range a.ids {
		out.Winner = strings.TrimSuffix(strings.TrimPrefix(chunkID, "chatcmpl-"), "-"+out.ID)
	}
	out.TTFT = a.ttft
	out.Report = report
	parseReport(out, report)
}

// parseReport reads the report header's winner=, upstream=, primary=,
// primary_changes= and explore= fields. With two upstreams A and B,
// attempt 0 went to the winner's upstream when attempt 0 won, else to
// the other one.
func parseReport(r *Request, h string) {
	winner := -1
	upstream := ""
	for _, f := range strings.Fields(strings.NewReplacer(`"`, " ", ";", " ").Replace(h)) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "winner":
			winner, _ = strconv.Atoi(v)
		case "upstream":
			upstream = v
		case "primary":
			r.Primary = v
		case "primary_changes":
			r.Changes, _ = strconv.ParseInt(v, 10, 64)
		case "explore":
			r.Explore = v == "1"
		}
	}
	switch {
	case winner == 0:
		r.First = upstream
	case winner > 0 && upstream == "A":
		r.First = "B"
	case winner > 0 && upstream == "B":
		r.First = "A"
	}
}

// TTFTs returns the TTFT of every successful request that started when
// keep says.
func (r *Run) TTFTs(keep func(Request) bool) []time.Duration {
	var out []time.Duration
	for _, q := range r.Requests {
		if q.TTFT > 0 && (keep == nil || keep(q)) {
			out = append(out, q.TTFT)
		}
	}
	return out
}

// Changes is the number of primary changes the route reported last,
// summed over the proxy instances the run went to (a restarted proxy
// counts from 0 again).
func (r *Run) Changes() int64 {
	last := map[int]int64{}
	for _, q := range r.Requests {
		if q.Changes > last[q.Instance] {
			last[q.Instance] = q.Changes
		}
	}
	var sum int64
	for _, n := range last {
		sum += n
	}
	return sum
}

// Reaction is how long the fastest route took to leave A after it
// degraded, and to take A back after it recovered.
type Reaction struct {
	Window int
	// LeftAfter counts the non-exploring requests started in the window
	// whose attempt 0 still went to A; LeftAfterMS is how far into the
	// window the last of them started.
	LeftAfter   int
	LeftAfterMS float64
	// BackAfter counts the requests started after the window ended before
	// the first non-exploring one whose attempt 0 went to A again, and
	// BackAfterMS when that one started; -1 when none did before the next
	// window (or the run's end).
	BackAfter   int
	BackAfterMS float64
}

// Reactions measures, per degraded window of g (scaled by scale) that
// began during the run, how long A stayed primary and when it was back.
func Reactions(run *Run, g llmsim.Regime, scale float64) []Reaction {
	reqs := append([]Request(nil), run.Requests...)
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].Start.Before(reqs[j].Start) })
	end := run.Start.Add(run.Wall)
	windows := g.Windows(end, scale)
	var out []Reaction
	for wi, w := range windows {
		react := Reaction{Window: wi + 1, BackAfter: -1, BackAfterMS: -1}
		nextStart := end
		if wi+1 < len(windows) {
			nextStart = windows[wi+1][0]
		}
		after := 0
		for _, q := range reqs {
			if q.Err != "" || q.Explore {
				continue
			}
			switch {
			case !q.Start.Before(w[0]) && q.Start.Before(w[1]):
				if q.First == "A" {
					react.LeftAfter++
					react.LeftAfterMS = float64(q.Start.Sub(w[0]).Microseconds()) / 1000
				}
			case !q.Start.Before(w[1]) && q.Start.Before(nextStart) && react.BackAfter < 0:
				if q.First == "A" {
					react.BackAfter = after
					react.BackAfterMS = float64(q.Start.Sub(w[1]).Microseconds()) / 1000
				}
				after++
			}
		}
		out = append(out, react)
	}
	return out
}

// Bench runs the regime-shift benchmark through start: routes ordered and
// fastest on a calm pair of upstreams and on a shifting one (A 8x slower
// for 30s of every 80s, scaled), plus fastest with A preferred by 25 %,
// each driven with opts.N requests with the same ids (RunPrefix), a
// configuration's calm and shifting runs at the same time; logs every
// number and, with opts.Check, fails t when a bound is missed.
func Bench(t *testing.T, proxy string, start Start, opts Options) {
	if testing.Short() {
		t.Skip("-short: the regime-shift benchmark's long load run")
	}
	if opts.N == 0 {
		opts.N = 4000
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = 20
	}
	if opts.Scale == 0 {
		opts.Scale = 0.05
	}
	if opts.Seed == 0 {
		opts.Seed = 18
	}
	if opts.P99Bound == 0 {
		opts.P99Bound = 1.15
	}
	if opts.CalmBound == 0 {
		opts.CalmBound = 1.05
	}
	if opts.Warmup == 0 {
		opts.Warmup = opts.N / 20
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Transport: &http.Transport{MaxIdleConns: 4 * opts.Concurrency,
			MaxIdleConnsPerHost: 4 * opts.Concurrency, IdleConnTimeout: 30 * time.Second}}
	}
	wl := llmsim.Reference(opts.Seed, opts.Scale)
	calmA, calmB := llmsim.Start("A", wl), llmsim.Start("B", wl)
	shiftA, shiftB := llmsim.Start("A", wl), llmsim.Start("B", wl)
	for _, up := range []*llmsim.Running{calmA, calmB, shiftA, shiftB} {
		defer up.Close()
	}
	delay := wl.TrueQuantile(0.95).Round(time.Millisecond)
	routes := []Route{
		{Name: "ordcalm", Primary: "ordered", A: calmA.URL, B: calmB.URL, Delay: delay, Burst: Burst},
		{Name: "fastcalm", Primary: "fastest", A: calmA.URL, B: calmB.URL, Delay: delay, Burst: Burst},
		{Name: "prefcalm", Primary: "fastest", A: calmA.URL, B: calmB.URL, Delay: delay, Burst: Burst, PreferA: 0.25},
		{Name: "ordshift", Primary: "ordered", A: shiftA.URL, B: shiftB.URL, Delay: delay, Burst: Burst},
		{Name: "fastshift", Primary: "fastest", A: shiftA.URL, B: shiftB.URL, Delay: delay, Burst: Burst},
		{Name: "prefshift", Primary: "fastest", A: shiftA.URL, B: shiftB.URL, Delay: delay, Burst: Burst, PreferA: 0.25},
	}
	bases := start(t, routes)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	runs := map[string]*Run{}
	regimes := map[string]llmsim.Regime{}
	for _, r := range routes {
		if warm := Drive(ctx, opts.HTTPClient, bases[r.Name], r.Name+"-warm-", opts.Warmup, opts.Concurrency, wl.Tokens); warm.Failed+warm.Wrong > 0 {
			t.Errorf("%s %s warm-up: %d failed and %d wrong answers: %v", proxy, r.Name, warm.Failed, warm.Wrong, warm.Errors)
		}
	}
	// Each configuration's calm and shifting runs go at the same time
	// (opts.Concurrency clients each, on their own pair of upstreams), so
	// that the load of a shared machine hits both alike and their ratio
	// holds; the configurations go one after the other. Every run sends
	// the same request ids (RunPrefix), so every run has the same draws:
	// the ratios compare policies, not samples (on different ids the calm
	// p99 alone varies by about 2 % from one set of 4,000 draws to the
	// next, more than the gaps being measured).
	var mu sync.Mutex
	for _, pair := range [][2]string{{"ordcalm", "ordshift"}, {"fastcalm", "fastshift"}, {"prefcalm", "prefshift"}} {
		calmA.ResetCounters()
		calmB.ResetCounters()
		shiftA.ResetCounters()
		shiftB.ResetCounters()
		g := llmsim.RegimeShift(time.Now())
		shiftA.SetRegime(g)
		var wg sync.WaitGroup
		for _, name := range pair {
			name := name
			wg.Add(1)
			go func() {
				defer wg.Done()
				run := Drive(ctx, opts.HTTPClient, bases[name], RunPrefix, opts.N, opts.Concurrency, wl.Tokens)
				run.Route = name
				mu.Lock()
				runs[name] = run
				mu.Unlock()
			}()
		}
		wg.Wait()
		shiftA.SetRegime(llmsim.Regime{})
		runs[pair[0]].Extra = float64(calmA.Served()+calmB.Served()-int64(opts.N)) / float64(opts.N)
		runs[pair[1]].Extra = float64(shiftA.Served()+shiftB.Served()-int64(opts.N)) / float64(opts.N)
		regimes[pair[1]] = g
		for _, name := range pair {
			if run := runs[name]; run.Failed != 0 || run.Wrong != 0 {
				t.Errorf("%s %s: %d failed and %d wrong answers of %d: %v", proxy, name, run.Failed, run.Wrong, opts.N, run.Errors)
			}
		}
	}
	// The calm workload alone, as a user runs it: each calm route with only
	// its own Concurrency clients on the machine, one after the other. The
	// paired calm runs above are the shifting runs' references (the same
	// load); these are the calm policy's comparison with the ideal hedge.
	for _, name := range []string{"ordcalm", "fastcalm"} {
		calmA.ResetCounters()
		calmB.ResetCounters()
		run := Drive(ctx, opts.HTTPClient, bases[name], RunPrefix, opts.N, opts.Concurrency, wl.Tokens)
		run.Route = name
		run.Extra = float64(calmA.Served()+calmB.Served()-int64(opts.N)) / float64(opts.N)
		if run.Failed != 0 || run.Wrong != 0 {
			t.Errorf("%s %s alone: %d failed and %d wrong answers of %d: %v", proxy, name, run.Failed, run.Wrong, opts.N, run.Errors)
		}
		runs[name+aloneSuffix] = run
	}
	report(t, proxy, opts, wl, delay, routes, runs, regimes)
}

// aloneSuffix names a calm route's run with no other run beside it.
const aloneSuffix = "-alone"

// report logs the numbers and checks the bounds.
func report(t *testing.T, proxy string, opts Options, wl llmsim.Workload, delay time.Duration, routes []Route,
	runs map[string]*Run, regimes map[string]llmsim.Regime) {
	t.Logf("%s: regime shift (A %vx slower for %v of every %v real time), time scale %v, %d streaming requests per run (after %d to warm up), %d concurrent clients per run, each calm run at the same time as its shifting one, OpenAI Go SDK, adaptive delay from %v, budget burst %v",
		proxy, llmsim.RegimeShift(time.Time{}).Factor, llmsim.RegimeShift(time.Time{}).Window, llmsim.RegimeShift(time.Time{}).Period,
		opts.Scale, opts.N, opts.Warmup, opts.Concurrency, delay, Burst)
	t.Logf("  %-10s %-12s %-22s %-22s %-22s %7s %8s %6s", "route", "primary", "all p50/p95/p99 ms", "calm windows", "degraded windows", "extra", "changes", "wall")
	for _, r := range routes {
		run := runs[r.Name]
		g := regimes[r.Name]
		all := stats.Summarize(run.TTFTs(nil))
		calm, degraded := "-", "-"
		if g.Factor > 0 {
			calm = pcts(stats.Summarize(run.TTFTs(func(q Request) bool { return !g.Degraded(q.Start, opts.Scale) })))
			degraded = pcts(stats.Summarize(run.TTFTs(func(q Request) bool { return g.Degraded(q.Start, opts.Scale) })))
		}
		primary := r.Primary
		if r.PreferA != 0 {
			primary += fmt.Sprintf("+A%.0f%%", 100*r.PreferA)
		}
		t.Logf("  %-10s %-12s %-22s %-22s %-22s %6.2f%% %8d %6v", r.Name, primary, pcts(all), calm, degraded, 100*run.Extra, run.Changes(),
			run.Wall.Round(100*time.Millisecond))
	}
	for _, name := range []string{"fastshift", "prefshift"} {
		for _, re := range Reactions(runs[name], regimes[name], opts.Scale) {
			back := "not before the next window"
			if re.BackAfter >= 0 {
				back = fmt.Sprintf("after %d requests, %.1f ms", re.BackAfter, re.BackAfterMS)
			}
			t.Logf("  %s window %d: A still primary for %d requests, the last %.1f ms into the window (%.1f s real); A primary again %s",
				name, re.Window, re.LeftAfter, re.LeftAfterMS, re.LeftAfterMS/1000/opts.Scale, back)
		}
	}
	calmRun := runs["fastcalm"]
	peers := refload.ComputePeers(wl, "A", "B", idsOf(calmRun), delay)
	ideal := stats.Summarize(peers.Ideal)
	check := func(ok bool, format string, args ...interface{}) {
		msg := fmt.Sprintf(format, args...)
		if !ok && opts.Check {
			t.Errorf("%s: %s", proxy, msg)
			return
		}
		t.Logf("  %s %s", map[bool]string{true: "ok  ", false: "MISS"}[ok], msg)
	}
	// The floor: perfect routing (attempt 0 on B exactly while A is
	// degraded) with a perfect hedge at the delay, from the same draws.
	floor := IdealRouting(wl, runs["fastshift"], regimes["fastshift"], opts.Scale, delay)
	floorCalm := stats.Summarize(refload.ComputePeers(wl, "A", "B", idsOf(runs["fastcalm"]), delay).Ideal)
	floorSum := stats.Summarize(floor)
	t.Logf("  ideal routing + ideal hedge on fastshift's draws: TTFT %s ms, p99 %.3fx the calm ideal hedge's %v (the bound's floor: B's stalls in A's windows can only hedge to the slow A)",
		pcts(floorSum), float64(floorSum.P99)/float64(floorCalm.P99), ms(floorCalm.P99))
	for _, name := range []string{"fastshift", "prefshift", "ordshift"} {
		calmName := strings.TrimSuffix(name, "shift") + "calm"
		shifted, calm := stats.Summarize(runs[name].TTFTs(nil)), stats.Summarize(runs[calmName].TTFTs(nil))
		ratio := float64(shifted.P99) / float64(calm.P99)
		extraGap := 100 * (runs[name].Extra - runs[calmName].Extra)
		bound := opts.P99Bound
		if strings.HasPrefix(name, "ord") {
			t.Logf("  (ordered for comparison: p99 %.3fx its calm run, extra %+.2f points)", ratio, extraGap)
			continue
		}
		check(ratio <= bound, "%s TTFT p99 %v = %.3fx the calm run's %v (want <= %.2f)", name, ms(shifted.P99), ratio, ms(calm.P99), bound)
		check(extraGap <= 3, "%s extra load %.2f%% = calm %.2f%% %+.2f points (want <= +3)", name, 100*runs[name].Extra, 100*runs[calmName].Extra, extraGap)
	}
	pairedFast := stats.Summarize(calmRun.TTFTs(nil))
	t.Logf("  calm beside a shifting run (%d clients on the proxy): fastest p99 %v = %.3fx the ideal hedge, ordered %.3fx",
		2*opts.Concurrency, ms(pairedFast.P99), float64(pairedFast.P99)/float64(ideal.P99),
		float64(stats.Summarize(runs["ordcalm"].TTFTs(nil)).P99)/float64(ideal.P99))
	calmRun = runs["fastcalm"+aloneSuffix]
	orderedRun := runs["ordcalm"+aloneSuffix]
	fast := stats.Summarize(calmRun.TTFTs(nil))
	ordered := stats.Summarize(orderedRun.TTFTs(nil))
	vsIdeal := float64(fast.P99) / float64(ideal.P99)
	t.Logf("  calm alone (%d clients): fastest p50/p95/p99 %s ms, ordered %s ms; ideal hedge at %v p99 %v, extra %.2f%%; ordered p99 %.3fx ideal, extra %.2f%% (the same draws); fastest p99 %.3fx ordered's",
		opts.Concurrency, pcts(fast), pcts(ordered), delay, ms(ideal.P99), 100*peers.IdealExtra, float64(ordered.P99)/float64(ideal.P99),
		100*orderedRun.Extra, float64(fast.P99)/float64(ordered.P99))
	ordOver, fastOver := Overhead(wl, orderedRun), Overhead(wl, calmRun)
	t.Logf("  calm: the path (client, %s, upstream server) adds to the TTFT of answers attempt 0 won (client TTFT - the draw) p50/p95/p99 %s ms on ordered, %s ms on fastest; a hedged answer pays it in its hedge delay too (measured through it) and in the hedge's TTFT",
		proxy, pcts(ordOver), pcts(fastOver))
	check(vsIdeal <= opts.CalmBound, "calm fastest p99 %v = %.3fx the ideal hedge (want <= %.2f)", ms(fast.P99), vsIdeal, opts.CalmBound)
	vsOrdered := float64(fast.P99) / float64(ordered.P99)
	check(vsOrdered <= 1.03, "calm fastest p99 %v = %.3fx ordered's %v on the same draws (want <= 1.03)", ms(fast.P99), vsOrdered, ms(ordered.P99))
	check(calmRun.Extra <= peers.IdealExtra+0.01, "calm fastest extra %.2f%% vs ideal %.2f%% (want <= ideal + 1 point)", 100*calmRun.Extra, 100*peers.IdealExtra)
	t.Logf("  calm fastest: the primary changed %d times in %d requests between two upstreams of equal speed", calmRun.Changes(), opts.N)
}

// Overhead is what the path from the upstream server through the proxy to
// the client adds to the TTFT of the run's answers that attempt 0 won: the
// client's TTFT minus the workload's draw for that upstream and request.
// For calm runs (in a shifting run A's draws are scaled in its windows).
func Overhead(wl llmsim.Workload, run *Run) stats.Summary {
	var ds []time.Duration
	for _, q := range run.Requests {
		if q.TTFT > 0 && q.First != "" && q.First == q.Winner {
			ds = append(ds, q.TTFT-wl.TTFT(q.Winner, q.ID))
		}
	}
	return stats.Summarize(ds)
}

// IdealRouting is the TTFT of each successful request of run with perfect
// routing and a perfect hedge at delay d: attempt 0 on B while A is
// degraded (by the request's start), on A otherwise, the hedge on the
// other, TTFT min(primary, d + hedge), from the workload's draws.
func IdealRouting(wl llmsim.Workload, run *Run, g llmsim.Regime, scale float64, d time.Duration) []time.Duration {
	var out []time.Duration
	for _, q := range run.Requests {
		if q.TTFT <= 0 {
			continue
		}
		a, b := wl.TTFT("A", q.ID), wl.TTFT("B", q.ID)
		primary, hedge := a, b
		if g.Degraded(q.Start, scale) {
			primary, hedge = b, time.Duration(float64(a)*g.Factor)
		}
		out = append(out, llmsim.IdealHedge(primary, hedge, d))
	}
	return out
}

func idsOf(run *Run) []string {
	ids := make([]string, 0, len(run.Requests))
	for _, q := range run.Requests {
		if q.TTFT > 0 {
			ids = append(ids, q.ID)
		}
	}
	return ids
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

func pcts(s stats.Summary) string {
	return fmt.Sprintf("%.1f/%.1f/%.1f", float64(s.P50.Microseconds())/1000, float64(s.P95.Microseconds())/1000, float64(s.P99.Microseconds())/1000)
}
