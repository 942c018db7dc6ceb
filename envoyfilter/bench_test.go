package envoyfilter_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/stats"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/refload"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envFloat(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil && v > 0 {
		return v
	}
	return def
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runLoad sends n streaming chat requests with ids prefix0..prefix(n-1),
// conc at a time, through refload, which checks every answer byte for byte
// against its own request from one upstream; any wrong or failed answer
// fails t.
func runLoad(t testing.TB, client *http.Client, url, prefix string, n, conc int) *refload.Result {
	t.Helper()
	res := refload.Run(context.Background(), refload.Options{
		URL: url, N: n, Concurrency: conc, IDPrefix: prefix, Upstreams: []string{"A", "B"}, Client: client,
	})
	if res.Wrong != 0 || res.Failed != 0 {
		t.Fatalf("%d wrong and %d failed answers of %d: %v", res.Wrong, res.Failed, n, res.Errors)
	}
	return res
}

// TestReferenceBenchmark runs the reference workload through the
// Envoy driver and the ext_proc server, and the same workload straight
// into core, and prints TTFT against the ideal hedge, extra attempts and
// CPU per request. Gated: LLMHEDGE_BENCH=1 (LLMHEDGE_BENCH_N, _SCALE,
// _CONC tune it).
func TestReferenceBenchmark(t *testing.T) {
	if os.Getenv("LLMHEDGE_BENCH") != "1" {
		t.Skip("set LLMHEDGE_BENCH=1 to run the reference benchmark")
	}
	n := envInt("LLMHEDGE_BENCH_N", 2000)
	conc := envInt("LLMHEDGE_BENCH_CONC", 32)
	scale := envFloat("LLMHEDGE_BENCH_SCALE", 0.05)
	wl := llmsim.Reference(42, scale)
	delay := wl.TrueQuantile(0.95)
	a, b := llmsim.Start("A", wl), llmsim.Start("B", wl)
	defer a.Close()
	defer b.Close()
	routes := fmt.Sprintf(`
  - name: chat
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: A, url: %q}, {name: B, url: %q}]
    delay: %s
`, a.URL, b.URL, delay)
	cfg, err := envoyfilter.ParseConfig([]byte("metrics: {listen: \"off\"}\nlog: {requests: false}\nroutes:" + routes))
	if err != nil {
		t.Fatal(err)
	}
	var slowMu sync.Mutex
	var slow []*core.Report
	srv, err := envoyfilter.NewServer(cfg, envoyfilter.Options{Observer: core.ObserverFunc(func(r *core.Report) {
		if r.TTFT > 3*delay {
			slowMu.Lock()
			slow = append(slow, r)
			slowMu.Unlock()
		}
	})})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// The slowest requests' reports, to see why when the tail is off.
		for i, r := range slow {
			if i == 10 {
				t.Logf("... %d more requests slower than 3x the delay", len(slow)-i)
				break
			}
			t.Logf("slow: ttft=%v denials=%v attempts=%+v", r.TTFT, r.Denials, r.Attempts)
		}
	}()
	gs, conn := serveGRPC(t, srv)
	defer gs.Stop()
	defer conn.Close()
	driver := envoydriver.New(conn, envoydriver.Config{})
	front := httptest.NewServer(driver)
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc}}

	// Warm connections and pools, then measure.
	runLoad(t, client, front.URL+"/v1/chat/completions", "warm-", conc, conc)
	a.ResetCounters()
	b.ResetCounters()
	cpu0, wall0 := cpuTime(), time.Now()
	viaExt := runLoad(t, client, front.URL+"/v1/chat/completions", "bench-", n, conc)
	cpuExt, wallExt := cpuTime()-cpu0, time.Since(wall0)
	extra := float64(a.Served()+b.Served()-int64(n)) / float64(n)
	ttfts, totals := viaExt.TTFT, viaExt.Total
	peers := refload.ComputePeers(wl, "A", "B", viaExt.IDs, delay)
	ideal, noHedge, idealExtra := peers.Ideal, peers.NoHedge, peers.IdealExtra

	// The same workload straight into core, for the CPU baseline.
	cc, _ := cfg.Routes[0].CoreConfig()
	h, err := core.New(cc, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	direct := httptest.NewServer(h)
	defer direct.Close()
	runLoad(t, client, direct.URL+"/v1/chat/completions", "dwarm-", conc, conc)
	a.ResetCounters()
	b.ResetCounters()
	cpu0, wall0 = cpuTime(), time.Now()
	directRes := runLoad(t, client, direct.URL+"/v1/chat/completions", "direct-", n, conc)
	cpuDirect, wallDirect := cpuTime()-cpu0, time.Since(wall0)
	dExtra := float64(a.Served()+b.Served()-int64(n)) / float64(n)
	dTTFTs := directRes.TTFT
	dPeers := refload.ComputePeers(wl, "A", "B", directRes.IDs, delay)
	dIdeal, dIdealExtra := dPeers.Ideal, dPeers.IdealExtra

	m, i := stats.Summarize(ttfts), stats.Summarize(ideal)
	ratio := float64(m.P99) / float64(i.P99)
	t.Logf("reference workload: n=%d conc=%d scale=%v delay=%v (p95 of TTFT)", n, conc, scale, delay)
	t.Logf("TTFT via ext_proc : %v", m)
	t.Logf("TTFT ideal hedge  : %v", i)
	t.Logf("TTFT no hedge     : %v", stats.Summarize(noHedge))
	t.Logf("total via ext_proc: %v", stats.Summarize(totals))
	t.Logf("p99 ratio measured/ideal = %.3f (limit 1.10)", ratio)
	t.Logf("extra attempts: %.2f%% (ideal %.2f%%, limit ideal+2 points)", 100*extra, 100*idealExtra)
	t.Logf("TTFT direct core  : %v; ideal %v; p99 ratio %.3f; extra %.2f%% (ideal %.2f%%)",
		stats.Summarize(dTTFTs), stats.Summarize(dIdeal), float64(stats.Summarize(dTTFTs).P99)/float64(stats.Summarize(dIdeal).P99),
		100*dExtra, 100*dIdealExtra)
	perExt, perDirect := cpuExt/time.Duration(n), cpuDirect/time.Duration(n)
	t.Logf("CPU per request (whole process: client, upstreams, proxy): ext_proc path %v, direct core %v; ratio %.2f; ext_proc overhead %v/request",
		perExt, perDirect, float64(perExt)/float64(perDirect), perExt-perDirect)
	t.Logf("wall: ext_proc %v, direct %v", wallExt.Round(time.Millisecond), wallDirect.Round(time.Millisecond))
	if ratio > 1.10 {
		t.Errorf("TTFT p99 %v is %.3f x the ideal hedge's %v (limit 1.10)", m.P99, ratio, i.P99)
	}
	if extra > idealExtra+0.02 {
		t.Errorf("extra attempts %.2f%% exceed ideal %.2f%% + 2 points", 100*extra, 100*idealExtra)
	}
	if s := driver.Stats(); s.Spurious+s.GRPCErrors+s.Resets+s.LostBodyBytes != 0 {
		t.Errorf("protocol trouble under load: s.Spurious+s.GRPCErrors+s.Resets+s.LostBodyBytes = %v, want 0", s.Spurious+s.GRPCErrors+s.Resets+s.LostBodyBytes)
	}
	driver.Close()
}

// fastWorkload answers at once: the benchmarks below measure the cost of
// the path, not the model.
func fastWorkload() llmsim.Workload {
	return llmsim.Workload{MedianTTFT: time.Microsecond, Sigma: -1, StallProb: noStalls, Tokens: 20, TokenGap: -1,
		PingEvery: -1, Scale: 1}
}

func benchmarkPath(b *testing.B, viaExtProc bool) {
	up := llmsim.Start("A", fastWorkload())
	defer up.Close()
	cfg, err := envoyfilter.ParseConfig([]byte(fmt.Sprintf(
		"metrics: {listen: \"off\"}\nlog: {requests: false}\nroutes:\n  - {name: chat, upstreams: [{name: A, url: %q}], delay: 10s}\n", up.URL)))
	if err != nil {
		b.Fatal(err)
	}
	var url string
	if viaExtProc {
		srv, err := envoyfilter.NewServer(cfg, envoyfilter.Options{})
		if err != nil {
			b.Fatal(err)
		}
		gs, conn := serveGRPC(b, srv)
		defer gs.Stop()
		defer conn.Close()
		driver := envoydriver.New(conn, envoydriver.Config{})
		defer driver.Close()
		front := httptest.NewServer(driver)
		defer front.Close()
		url = front.URL
	} else {
		cc, _ := cfg.Routes[0].CoreConfig()
		h, err := core.New(cc, core.Options{})
		if err != nil {
			b.Fatal(err)
		}
		direct := httptest.NewServer(h)
		defer direct.Close()
		url = direct.URL
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	res := refload.Run(context.Background(), refload.Options{
		URL: url + "/v1/chat/completions", N: b.N, Concurrency: 1, IDPrefix: "b-", Upstreams: []string{"A"}, Client: client,
	})
	if res.Wrong != 0 || res.Failed != 0 {
		b.Fatalf("%d wrong and %d failed answers: %v", res.Wrong, res.Failed, res.Errors)
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkExtProcPath: client → driver → gRPC → server → core → upstream.
func BenchmarkExtProcPath(b *testing.B) { benchmarkPath(b, true) }

// BenchmarkDirectCore: client → core → upstream, the baseline.
func BenchmarkDirectCore(b *testing.B) { benchmarkPath(b, false) }
