package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/lightload"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestBenchLightOverhead is TestBenchThroughput with the light load client
// (raw keep-alive TCP, a fixed request, a minimal reader), so that on a
// small machine the numbers measure Traefik rather than the client:
// requests/s through the plugin and through Traefik's plain load balancer
// at 20 concurrent connections on the same fast 20-token upstream, where no
// hedge fires, and Traefik's own CPU per request from /proc. Runs
// alternate between the two routes.
//
//	LLMHEDGE_BENCH=1 go test ./traefikplugin/e2e -run TestBenchLightOverhead -v
func TestBenchLightOverhead(t *testing.T) {
	benchOnly(t)
	const rounds, perRound, conns = 4, 2500, 20
	fast := llmsim.Workload{Seed: 1, MedianTTFT: 100 * time.Microsecond, Sigma: noJitter, StallProb: neverStall, TokenGap: noGap, PingEvery: -1}
	f := llmsim.Start("F", fast)
	defer f.Close()
	d := newDynamic("light").
		loadBalancer("fast", f.URL).
		route("plain", "fast").
		hedge("hedge", pluginConfig([][2]string{{"F", f.URL}, {"F", f.URL}}, "delay: 30s", "log: off")).
		route("hedge", "noop@internal", "hedge")
	tr := startTraefik(t, "ERROR", d)
	pid := tr.cmd.Process.Pid
	addr := strings.TrimPrefix(tr.URL, "http://")
	target := func(name, route string, n int) lightload.Target {
		return lightload.Target{Name: name,
			CPU: func() (time.Duration, error) { return lightload.ProcessCPU(pid) },
			Options: lightload.Options{Addr: addr, Conns: conns, N: n, WantSuffix: []byte("data: [DONE]\n\n"),
				Request: lightload.NewRequest("POST", addr, "/"+route+"/v1/chat/completions",
					`{"model":"bench","stream":true,"messages":[{"role":"user","content":"Say something."}]}`,
					"Content-Type: application/json", llmsim.HeaderRequest+": light")}}
	}
	ctx := t.Context()
	// Warm up connections and the interpreter.
	if _, err := lightload.Compare(ctx, 1, []lightload.Target{target("plugin", "hedge", 500), target("plain LB", "plain", 500)}); err != nil {
		t.Fatal(err)
	}
	f.ResetCounters()
	cmp, err := lightload.Compare(ctx, rounds, []lightload.Target{target("plugin", "hedge", perRound), target("plain LB", "plain", perRound)})
	if err != nil {
		t.Fatal(err)
	}
	// Traefik's own load balancer cuts a few streams short under load (see
	// TestBenchTruncationStudy): counted for it, failures for the plugin.
	if cmp.Failed[0] != 0 {
		t.Errorf("plugin: %d of %d requests failed: %v", cmp.Failed[0], rounds*perRound, cmp.Errors[0])
	}
	if served, sent := f.Served(), int64(cmp.Requests[0]+cmp.Failed[0]+cmp.Requests[1]+cmp.Failed[1]); served != sent {
		t.Errorf("upstream served %d requests for %d sent: a hedge fired", served, sent)
	}
	t.Logf("light client, fast 20-token upstream, no hedge: %d rounds x %d requests, %d connections", rounds, perRound, conns)
	for i, name := range cmp.Names {
		t.Logf("  %-9s %8.0f req/s   Traefik CPU %v/request   (%d failed: %v)", name, cmp.RPS(i), cmp.CPUPerRequest(i), cmp.Failed[i], cmp.Errors[i])
	}
	t.Logf("  req/s plugin / plain LB = %.3f (rounds %.2f); Traefik CPU per request plugin / plain LB = %.2f (the interpreter: %v/request)",
		cmp.RPS(0)/cmp.RPS(1), cmp.RoundRatios(0, 1), float64(cmp.CPUPerRequest(0))/float64(cmp.CPUPerRequest(1)),
		cmp.CPUPerRequest(0)-cmp.CPUPerRequest(1))
}
