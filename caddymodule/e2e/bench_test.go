package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/stats"

	"github.com/llmhedge/llmhedge/internal/testkit/envgate"
	"github.com/llmhedge/llmhedge/internal/testkit/lightload"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/refload"
	"github.com/llmhedge/llmhedge/internal/testkit/regimeload"
)

// The benchmarks drive the real Caddy binary and print their numbers; the
// ratios the issue demands are checked against baselines measured in the
// same run. They are long and load the machine, so they run only with
// LLMHEDGE_BENCH=1:
//
//	LLMHEDGE_BENCH=1 go test ./caddymodule/e2e -run Bench -v -timeout 20m

// loadClient is an HTTP/1.1 client with a connection per concurrent
// request kept alive, as a busy application's client would have.
func loadClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: conns,
		DisableCompression:  true,
	}}
}

// sseResult is one streamed request as the client saw it.
type sseResult struct {
	ttft, total time.Duration
	text        string
	err         error
}

// chatBody is a streaming chat request body.
const chatBody = `{"model":"bench","stream":true,"messages":[{"role":"user","content":"Say something."}]}`

// sseRequest posts a streaming chat request and reads the whole answer. TTFT
// is the time until the first event with non-empty content has been read.
// firstToken, if not nil, is called at that moment.
func sseRequest(ctx context.Context, client *http.Client, url, id string, firstToken func()) sseResult {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody))
	if err != nil {
		return sseResult{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(llmsim.HeaderRequest, id)
	resp, err := client.Do(req)
	if err != nil {
		return sseResult{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return sseResult{err: fmt.Errorf("status %d: %s", resp.StatusCode, body)}
	}
	var res sseResult
	var text strings.Builder
	reader := bufio.NewReader(resp.Body)
	for {
		line, err := reader.ReadString('\n')
		if strings.HasPrefix(line, "data: {") {
			if content := contentOf(line); content != "" {
				if res.ttft == 0 {
					res.ttft = time.Since(start)
					if firstToken != nil {
						firstToken()
					}
				}
				text.WriteString(content)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			res.err = err
			break
		}
	}
	res.total, res.text = time.Since(start), text.String()
	return res
}

// contentOf extracts the delta content of an llmsim chat chunk line (no
// escapes occur in the simulated tokens), "" when there is none.
func contentOf(line string) string {
	const key = `"content":"`
	i := strings.Index(line, key)
	if i < 0 {
		return ""
	}
	rest := line[i+len(key):]
	j := strings.IndexByte(rest, '"')
	if j < 0 {
		return ""
	}
	return rest[:j]
}

// load sends n streaming chat requests (ids prefix0 … prefix(n-1)) through
// url with `workers` concurrent clients, via refload, which checks every
// answer byte for byte against its own request from upstream A or B; any
// wrong or failed answer fails t.
func load(t *testing.T, ctx context.Context, client *http.Client, url, prefix string, n, workers, tokens int) *refload.Result {
	t.Helper()
	res := refload.Run(ctx, refload.Options{
		URL: url + "/v1/chat/completions", N: n, Concurrency: workers, IDPrefix: prefix,
		Upstreams: []string{"A", "B"}, Tokens: tokens, Client: client,
	})
	if res.Wrong != 0 || res.Failed != 0 {
		t.Fatalf("%s: %d wrong and %d failed answers of %d: %v", url, res.Wrong, res.Failed, n, res.Errors)
	}
	return res
}

// TestBenchReferenceWorkload runs the reference workload (time
// scaled by 0.1: median TTFT 60ms, stalls 1-2s) through llm_hedge and
// through Caddy's reverse_proxy on the same two upstreams, and compares with
// the ideal hedge computed from the same draws. (At scale 0.05 a few ms of
// scheduling delay on a busy 2-core machine are already 10% of the p99.)
func TestBenchReferenceWorkload(t *testing.T) {
	envgate.Bench(t)
	const (
		requests = 2000
		workers  = 16
		scale    = 0.1
		seed     = 6
	)
	wl := llmsim.Reference(seed, scale)
	a, b := llmsim.Start("A", wl), llmsim.Start("B", wl)
	defer a.Close()
	defer b.Close()
	delay := wl.TrueQuantile(0.95).Round(time.Millisecond)
	c := startCaddy(t, "",
		fmt.Sprintf("\tllm_hedge %s %s {\n\t\tdelay %v\n\t\tlog_level debug\n\t}", a.URL, b.URL, delay),
		fmt.Sprintf("\treverse_proxy %s %s", a.URL, b.URL))
	ctx := testContext(t)
	client := loadClient(workers)
	defer client.CloseIdleConnections()

	start := time.Now()
	hedgedRes := load(t, ctx, client, c.url(0), "ref-", requests, workers, wl.Tokens)
	hedged := hedgedRes.TTFT
	hedgeTime := time.Since(start)
	peers := refload.ComputePeers(wl, "A", "B", hedgedRes.IDs, delay)
	ideal, noHedge := peers.Ideal, peers.NoHedge
	served := a.Served() + b.Served()
	a.ResetCounters()
	b.ResetCounters()
	start = time.Now()
	proxied := load(t, ctx, client, c.url(1), "ref-", requests, workers, wl.Tokens).TTFT
	proxyTime := time.Since(start)

	sHedge, sIdeal, sProxy, sNo := stats.Summarize(hedged), stats.Summarize(ideal), stats.Summarize(proxied), stats.Summarize(noHedge)
	extra := float64(served-requests) / requests
	extraIdeal := peers.IdealExtra
	vsIdeal := float64(sHedge.P99) / float64(sIdeal.P99)
	vsProxy := float64(sHedge.P99) / float64(sProxy.P99)
	t.Logf("reference workload x%v, %d requests, %d concurrent, hedge delay %v (p95 of TTFT)", scale, requests, workers, delay)
	t.Logf("  llm_hedge      TTFT %v  (%v wall)", sHedge, hedgeTime.Round(time.Millisecond))
	t.Logf("  ideal hedge    TTFT %v", sIdeal)
	t.Logf("  reverse_proxy  TTFT %v  (%v wall)", sProxy, proxyTime.Round(time.Millisecond))
	t.Logf("  no hedge (A)   TTFT %v", sNo)
	t.Logf("  p99 llm_hedge / ideal hedge   = %.3f (want <= 1.10)", vsIdeal)
	t.Logf("  p99 llm_hedge / reverse_proxy = %.3f (want <= 0.20)", vsProxy)
	t.Logf("  extra attempts %.2f%%, ideal %.2f%% (want <= ideal + 2 points)", 100*extra, 100*extraIdeal)
	if vsIdeal > 1.10 {
		t.Errorf("TTFT p99 %v is %.3f x the ideal hedge's %v (want <= 1.10)", sHedge.P99, vsIdeal, sIdeal.P99)
	}
	if vsProxy > 0.20 {
		t.Errorf("TTFT p99 %v is %.3f x reverse_proxy's %v (want <= 0.20)", sHedge.P99, vsProxy, sProxy.P99)
	}
	if extra > extraIdeal+0.02 {
		t.Errorf("extra attempts %.2f%% > ideal %.2f%% + 2 points", 100*extra, 100*extraIdeal)
	}
}

// fastWorkload answers at once: the proxy's own cost dominates.
func fastWorkload() llmsim.Workload {
	return llmsim.Workload{MedianTTFT: time.Microsecond, Sigma: -1, StallProb: -1, Tokens: 3, TokenGap: -1, PingEvery: -1}
}

// TestBenchOverhead compares llm_hedge with reverse_proxy on one fast
// upstream where no hedge fires: throughput at 16 concurrent clients, and
// the latency one client at a time sees. Short rounds alternate between the
// two (in turns, so that neither always goes first) and the ratio is the
// median of the rounds' ratios, so that bursts of load from other processes
// on the machine hit both alike or drop out.
func TestBenchOverhead(t *testing.T) {
	envgate.Bench(t)
	const (
		rounds     = 8
		perRound   = 1500
		workers    = 16
		sequential = 100 // per round and proxy
		fastTokens = 3
	)
	up := llmsim.Start("A", fastWorkload())
	defer up.Close()
	spare := llmsim.Start("B", fastWorkload())
	defer spare.Close()
	c := startCaddy(t, "",
		fmt.Sprintf("\tllm_hedge %s %s {\n\t\tdelay 1s\n\t\tlog_level debug\n\t}", up.URL, spare.URL),
		fmt.Sprintf("\treverse_proxy %s", up.URL))
	ctx := testContext(t)
	client := loadClient(workers)
	defer client.CloseIdleConnections()
	names := []string{"llm_hedge", "reverse_proxy"}

	// Warm-up: connections, caches, the Go runtime of both sides.
	for i, name := range names {
		load(t, ctx, client, c.url(i), name+"-warm-", 500, workers, fastTokens)
	}

	var total, cpu [2]time.Duration
	var lat [2][]time.Duration
	var ratios []float64
	for r := 0; r < rounds; r++ {
		var elapsed [2]time.Duration
		for k := 0; k < 2; k++ {
			i := (r + k) % 2
			start, cpuStart := time.Now(), c.cpuTime()
			load(t, ctx, client, c.url(i), fmt.Sprintf("%s-r%d-", names[i], r), perRound, workers, fastTokens)
			elapsed[i] = time.Since(start)
			total[i] += elapsed[i]
			cpu[i] += c.cpuTime() - cpuStart
		}
		ratios = append(ratios, elapsed[1].Seconds()/elapsed[0].Seconds())
		for k := 0; k < 2; k++ {
			i := (r + k) % 2
			for _, id := range idRange(fmt.Sprintf("%s-s%d", names[i], r), sequential) {
				res := sseRequest(ctx, client, c.url(i), id, nil)
				if res.err != nil {
					t.Fatalf("%s %s: %v", names[i], id, res.err)
				}
				lat[i] = append(lat[i], res.total)
			}
		}
	}
	if spare.Served() != 0 {
		t.Errorf("a hedge fired on the fast upstream (%d requests to the spare)", spare.Served())
	}
	sort.Float64s(ratios)
	ratio := (ratios[rounds/2-1] + ratios[rounds/2]) / 2
	rps := func(i int) float64 { return float64(rounds*perRound) / total[i].Seconds() }
	p50 := func(i int) time.Duration { return stats.Quantile(lat[i], 0.5) }
	added := p50(0) - p50(1)
	t.Logf("overhead, fast upstream, no hedge: %d rounds x %d requests at %d concurrent, %d sequential", rounds, perRound, workers, rounds*sequential)
	perReq := func(i int) time.Duration { return cpu[i] / (rounds * perRound) }
	t.Logf("  llm_hedge      %8.0f req/s   latency p50 %v p99 %v   Caddy CPU %v/request", rps(0), p50(0), stats.Quantile(lat[0], 0.99), perReq(0))
	t.Logf("  reverse_proxy  %8.0f req/s   latency p50 %v p99 %v   Caddy CPU %v/request", rps(1), p50(1), stats.Quantile(lat[1], 0.99), perReq(1))
	t.Logf("  req/s llm_hedge / reverse_proxy: median of rounds %.3f (want >= 0.90), overall %.3f, rounds %.2f", ratio, rps(0)/rps(1), ratios)
	t.Logf("  added p50 latency = %v (want <= 500µs)", added)
	if ratio < 0.9 {
		t.Errorf("llm_hedge does %.3f x reverse_proxy's requests/s (median of rounds; want >= 0.9)", ratio)
	}
	if added > 500*time.Microsecond {
		t.Errorf("llm_hedge adds %v to the p50 latency (want <= 500µs)", added)
	}
}

// idRange returns n request ids prefix-0 … prefix-(n-1).
func idRange(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return ids
}

// TestBenchOpenStreams holds 1,000 streams open through Caddy (each has
// its first token and waits for the next) and reports Caddy's resident
// memory per open stream, for llm_hedge and for reverse_proxy, each in a
// fresh Caddy process.
func TestBenchOpenStreams(t *testing.T) {
	envgate.Bench(t)
	const streams = 1000
	// First token at once, the second after an hour: the stream stays open
	// until the client leaves.
	wl := llmsim.Workload{MedianTTFT: time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 2, TokenGap: time.Hour, PingEvery: -1}
	up := llmsim.Start("A", wl)
	defer up.Close()
	spare := llmsim.Start("B", wl)
	defer spare.Close()

	measure := func(name, site string) (idle, open int64) {
		c := startCaddy(t, "", site)
		ctx, cancel := context.WithCancel(testContext(t))
		client := loadClient(streams)
		defer client.CloseIdleConnections()
		// Warm up the process (and its pools) with a few short requests.
		for _, id := range idRange(name+"-warm", 20) {
			wctx, wcancel := context.WithCancel(ctx)
			sseRequest(wctx, client, c.url(0), id, wcancel)
			wcancel()
		}
		if err := up.WaitFor(ctx, func() bool { return up.InFlight() == 0 }); err != nil {
			t.Fatal(err)
		}
		idle = c.rss()
		var started, done sync.WaitGroup
		started.Add(streams)
		done.Add(streams)
		for i := 0; i < streams; i++ {
			go func(i int) {
				defer done.Done()
				var once sync.Once
				res := sseRequest(ctx, client, c.url(0), fmt.Sprintf("%s-open-%d", name, i), func() { once.Do(started.Done) })
				if res.ttft == 0 {
					once.Do(started.Done)
					t.Errorf("%s stream %d: no first token: %v", name, i, res.err)
				}
			}(i)
		}
		started.Wait()
		open = c.rss()
		if n := up.InFlight(); n != streams {
			t.Errorf("%s: %d streams open upstream, want %d", name, n, streams)
		}
		cancel()
		done.Wait()
		if err := up.WaitFor(testContext(t), func() bool { return up.InFlight() == 0 }); err != nil {
			t.Errorf("%s: streams still open upstream after the clients left: %d", name, up.InFlight())
		}
		c.stop()
		return idle, open
	}
	hIdle, hOpen := measure("llm_hedge", fmt.Sprintf("\tllm_hedge %s %s {\n\t\tdelay 10s\n\t\tlog_level debug\n\t}", up.URL, spare.URL))
	pIdle, pOpen := measure("reverse_proxy", fmt.Sprintf("\treverse_proxy %s", up.URL))
	perStream := func(idle, open int64) float64 { return float64(open-idle) / streams / 1024 }
	hPer, pPer := perStream(hIdle, hOpen), perStream(pIdle, pOpen)
	t.Logf("%d open streams through Caddy (RSS of the Caddy process)", streams)
	t.Logf("  llm_hedge      idle %6.1f MiB, open %6.1f MiB: %6.1f KiB per stream", mib(hIdle), mib(hOpen), hPer)
	t.Logf("  reverse_proxy  idle %6.1f MiB, open %6.1f MiB: %6.1f KiB per stream", mib(pIdle), mib(pOpen), pPer)
	t.Logf("  per-stream llm_hedge / reverse_proxy = %.2f", hPer/pPer)
	// Bounded: no whole-response buffering, a few fixed buffers per stream.
	if hPer > 256 {
		t.Errorf("llm_hedge holds %.1f KiB per open stream (want <= 256 KiB)", hPer)
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// TestBenchLightOverhead prices llm_hedge against reverse_proxy with the
// light load client (raw keep-alive TCP, a fixed request, a minimal
// reader), so that on a small machine the numbers measure Caddy rather than
// the client: requests/s at 20 concurrent connections on the 20-token fast
// upstream, where no hedge fires, and Caddy's own CPU per request from
// /proc. Runs alternate between the two sites.
//
//	LLMHEDGE_BENCH=1 go test ./caddymodule/e2e -run TestBenchLightOverhead -v
func TestBenchLightOverhead(t *testing.T) {
	envgate.Bench(t)
	const (
		rounds   = 6
		perRound = 3000
		conns    = 20
	)
	up := llmsim.Start("A", llmsim.Fast())
	defer up.Close()
	spare := llmsim.Start("B", llmsim.Fast())
	defer spare.Close()
	c := startCaddy(t, "",
		fmt.Sprintf("\tllm_hedge %s %s {\n\t\tdelay 30s\n\t\tlog_level debug\n\t}", up.URL, spare.URL),
		fmt.Sprintf("\treverse_proxy %s", up.URL))
	targets := func(n int) []lightload.Target {
		return []lightload.Target{
			lightload.StreamTarget("llm_hedge", strings.TrimPrefix(c.url(0), "http://"), "/v1/chat/completions", c.cmd.Process.Pid, conns, n),
			lightload.StreamTarget("reverse_proxy", strings.TrimPrefix(c.url(1), "http://"), "/v1/chat/completions", c.cmd.Process.Pid, conns, n),
		}
	}
	_, cmp, err := lightload.Bench(testContext(t), rounds, 1000, perRound, targets)
	if err != nil {
		t.Fatal(err)
	}
	cmp.CheckNoFailureNoHedge(t, spare)
	t.Logf("light client, fast 20-token upstream, no hedge: %d rounds x %d requests, %d connections", rounds, perRound, conns)
	for i, name := range cmp.Names {
		t.Logf("  %-14s %8.0f req/s   Caddy CPU %v/request", name, cmp.RPS(i), cmp.CPUPerRequest(i))
	}
	t.Logf("  req/s llm_hedge / reverse_proxy = %.3f (rounds %.2f); Caddy CPU per request llm_hedge / reverse_proxy = %.2f",
		cmp.RPS(0)/cmp.RPS(1), cmp.RoundRatios(0, 1), float64(cmp.CPUPerRequest(0))/float64(cmp.CPUPerRequest(1)))
}

// TestBenchRegimeShift is regimeload's regime-shift benchmark through the
// real Caddy, one site per route; its long form (regimeload.EnvOptions) is
// LLMHEDGE_BENCH=1 go test -run TestBenchRegimeShift -v ./caddymodule/e2e.
func TestBenchRegimeShift(t *testing.T) {
	regimeload.Bench(t, "caddy", startRegimeSites, regimeload.EnvOptions(0, 0))
}

// TestBenchIncident is regimeload's incident benchmark through
// the real Caddy: every run starts a fresh Caddy (startRegimeSites), one
// site per route. Its long form (regimeload.IncidentEnvOptions) is
// LLMHEDGE_BENCH=1 go test -run TestBenchIncident -v ./caddymodule/e2e.
func TestBenchIncident(t *testing.T) {
	regimeload.Incident(t, "caddy", startRegimeSites, regimeload.IncidentEnvOptions())
}

// startRegimeSites serves each route as a Caddy site of its own.
func startRegimeSites(t *testing.T, routes []regimeload.Route) map[string]string {
	var sites []string
	for _, r := range routes {
		prefer := ""
		if r.PreferA != 0 {
			prefer = fmt.Sprintf("\n\t\t\tprefer_margin %g%%", 100*r.PreferA)
		}
		// A field left 0 is not written: the engine's default holds.
		optional := ""
		if r.Burst != 0 {
			optional += fmt.Sprintf("\n\t\tbudget {\n\t\t\tburst %g\n\t\t}", r.Burst)
		}
		if r.MaxAttempts != 0 {
			optional += fmt.Sprintf("\n\t\tmax_attempts %d", r.MaxAttempts)
		}
		sites = append(sites, fmt.Sprintf(`	llm_hedge {
		route %s
		primary %s
		upstream %s {
			name A%s
		}
		upstream %s {
			name B
		}
		delay adaptive %v%s
		report_header %s
	}`, r.Name, r.Primary, r.A, prefer, r.B, r.Delay, optional, regimeload.ReportHeader))
	}
	c := startCaddy(t, "", sites...)
	bases := map[string]string{}
	for i, r := range routes {
		bases[r.Name] = c.url(i) + "/v1/"
	}
	return bases
}
