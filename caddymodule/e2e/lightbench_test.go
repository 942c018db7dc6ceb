package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/lightload"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// throughputWorkload is the fast streaming upstream of the throughput
// benchmarks of all three adapters: first token after 100µs, 20 tokens
// without gaps, no jitter, no stalls.
func throughputWorkload() llmsim.Workload {
	return llmsim.Workload{Seed: 1, MedianTTFT: 100 * time.Microsecond, Sigma: -1, StallProb: -1, TokenGap: -1, PingEvery: -1}
}

// TestBenchLightOverhead prices llm_hedge against reverse_proxy with the
// light load client (raw keep-alive TCP, a fixed request, a minimal
// reader), so that on a small machine the numbers measure Caddy rather than
// the client: requests/s at 20 concurrent connections on the 20-token fast
// upstream, where no hedge fires, and Caddy's own CPU per request from
// /proc. Runs alternate between the two sites.
//
//	LLMHEDGE_BENCH=1 go test ./caddymodule/e2e -run TestBenchLightOverhead -v
func TestBenchLightOverhead(t *testing.T) {
	benchOnly(t)
	const (
		rounds   = 6
		perRound = 3000
		conns    = 20
	)
	up := llmsim.Start("A", throughputWorkload())
	defer up.Close()
	spare := llmsim.Start("B", throughputWorkload())
	defer spare.Close()
	c := startCaddy(t, "",
		fmt.Sprintf("\tllm_hedge %s %s {\n\t\tdelay 30s\n\t\tlog_level debug\n\t}", up.URL, spare.URL),
		fmt.Sprintf("\treverse_proxy %s", up.URL))
	pid := c.cmd.Process.Pid
	caddyCPU := func() (time.Duration, error) { return lightload.ProcessCPU(pid) }
	target := func(name string, site, n int) lightload.Target {
		addr := strings.TrimPrefix(c.url(site), "http://")
		return lightload.Target{Name: name, CPU: caddyCPU, Options: lightload.Options{
			Addr: addr, Conns: conns, N: n, WantSuffix: []byte("data: [DONE]\n\n"),
			Request: lightload.NewRequest("POST", addr, "/v1/chat/completions", chatBody,
				"Content-Type: application/json", llmsim.HeaderRequest+": light"),
		}}
	}
	ctx := testContext(t)
	// Warm-up: connections, pools, the Go runtime of both sides.
	if _, err := lightload.Compare(ctx, 1, []lightload.Target{target("llm_hedge", 0, 1000), target("reverse_proxy", 1, 1000)}); err != nil {
		t.Fatal(err)
	}
	cmp, err := lightload.Compare(ctx, rounds, []lightload.Target{target("llm_hedge", 0, perRound), target("reverse_proxy", 1, perRound)})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range cmp.Failures() {
		t.Error(f)
	}
	if spare.Served() != 0 {
		t.Errorf("a hedge fired on the fast upstream (%d requests to the spare)", spare.Served())
	}
	t.Logf("light client, fast 20-token upstream, no hedge: %d rounds x %d requests, %d connections", rounds, perRound, conns)
	for i, name := range cmp.Names {
		t.Logf("  %-14s %8.0f req/s   Caddy CPU %v/request", name, cmp.RPS(i), cmp.CPUPerRequest(i))
	}
	t.Logf("  req/s llm_hedge / reverse_proxy = %.3f (rounds %.2f); Caddy CPU per request llm_hedge / reverse_proxy = %.2f",
		cmp.RPS(0)/cmp.RPS(1), cmp.RoundRatios(0, 1), float64(cmp.CPUPerRequest(0))/float64(cmp.CPUPerRequest(1)))
}
