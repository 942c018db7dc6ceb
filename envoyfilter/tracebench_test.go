package envoyfilter_test

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmhedge/llmhedge/internal/testkit/envgate"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/heyload"
	"github.com/llmhedge/llmhedge/internal/testkit/jaeger"
	"github.com/llmhedge/llmhedge/internal/testkit/lightload"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestBenchTracingOverhead prices tracing: two ext_proc server processes
// with the same route on the fast 20-token upstream (no hedge fires), one
// with tracing off, one exporting every request's spans (a request span
// and an attempt span, each request a new sampled trace) over OTLP/HTTP to
// a real Jaeger, driven in alternating rounds by the light load client
// through the Envoy driver (TestBenchLightOverhead's loop). It prints
// requests/s of each and their ratio, and each server's CPU per request;
// it asserts no number (a shared machine's load moves them), only that
// every request was answered. It runs with LLMHEDGE_BENCH=1, as the other
// benchmarks here.
//
//	LLMHEDGE_BENCH=1 go test ./envoyfilter -run TestBenchTracingOverhead -v
func TestBenchTracingOverhead(t *testing.T) {
	envgate.Bench(t)
	j := jaeger.Start(t)
	rounds, perRound, warmUp, conns := 3, 5000, 1000, 20
	up := llmsim.Start("A", llmsim.Fast())
	defer up.Close()
	spare := llmsim.Start("B", llmsim.Fast())
	defer spare.Close()
	routes := fmt.Sprintf("routes:\n  - {name: chat, upstreams: [{name: A, url: %q}, {name: B, url: %q}], delay: 30s}\n", up.URL, spare.URL)
	head := "metrics: {listen: \"off\"}\nlog: {requests: false}\n"
	type server struct {
		name  string
		pid   int
		front *httptest.Server
	}
	var servers []server
	for _, s := range []struct{ name, tracing string }{
		{"tracing off", ""},
		{"tracing on", fmt.Sprintf("tracing: {endpoint: %q}\n", j.OTLPHTTPEndpoint())},
	} {
		addr, pid := startExtProcProcess(t, head+s.tracing+routes)
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		driver := envoydriver.New(conn, envoydriver.Config{})
		front := httptest.NewServer(driver)
		t.Cleanup(func() {
			front.Close()
			driver.Close()
			conn.Close()
		})
		servers = append(servers, server{s.name, pid, front})
	}
	targets := func(n int) []lightload.Target {
		var out []lightload.Target
		for _, s := range servers {
			out = append(out, lightload.StreamTarget(s.name, strings.TrimPrefix(s.front.URL, "http://"), "/v1/chat/completions", s.pid, conns, n))
		}
		return out
	}
	_, cmp, err := lightload.Bench(t.Context(), rounds, warmUp, perRound, targets)
	if err != nil {
		t.Fatal(err)
	}
	cmp.CheckNoFailureNoHedge(t, spare)
	t.Logf("light client, fast 20-token upstream, no hedge: %d alternating rounds x %d requests, %d connections, through the driver", rounds, perRound, conns)
	for i, name := range cmp.Names {
		t.Logf("  %-12s %8.0f req/s   ext_proc server CPU %v/request", name, cmp.RPS(i), cmp.CPUPerRequest(i))
	}
	t.Logf("  req/s tracing on / off = %.3f (rounds %.2f); server CPU/request on / off = %.2f",
		cmp.RPS(1)/cmp.RPS(0), cmp.RoundRatios(1, 0), float64(cmp.CPUPerRequest(1))/float64(cmp.CPUPerRequest(0)))
	cpuOf := func(pid int) func() time.Duration {
		return func() time.Duration {
			d, err := lightload.ProcessCPU(pid)
			if err != nil {
				t.Fatalf("reading the server's CPU time: %v", err)
			}
			return d
		}
	}
	heyload.Compare(t, [2]string{"tracing on", "tracing off"}, [2]string{servers[1].front.URL + "/v1/chat/completions", servers[0].front.URL + "/v1/chat/completions"},
		[2]func() time.Duration{cpuOf(servers[1].pid), cpuOf(servers[0].pid)}, "ext_proc server")
}
