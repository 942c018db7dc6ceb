package envoyfilter_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/lightload"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// helperConfigEnv carries the configuration file of the ext_proc server
// that TestLightExtProcHelper runs in a child process.
const helperConfigEnv = "LLMHEDGE_LIGHT_EXTPROC_CONFIG"

// TestLightExtProcHelper is not a test: TestBenchLightOverhead runs the
// test binary again with only this function, to serve the ext_proc server
// in a process of its own whose CPU time it can read. It prints the gRPC
// address and serves until its stdin closes.
func TestLightExtProcHelper(t *testing.T) {
	yaml := os.Getenv(helperConfigEnv)
	if yaml == "" {
		t.Skip("the ext_proc server process of TestBenchLightOverhead")
	}
	cfg, err := envoyfilter.ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := envoyfilter.NewServer(cfg, envoyfilter.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gs, conn := serveGRPC(t, srv)
	conn.Close()
	fmt.Printf("ADDR %s\n", conn.Target())
	io.Copy(io.Discard, os.Stdin)
	gs.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.Close(ctx) // a tracing pipeline's goroutines end
}

// startExtProcProcess runs the ext_proc server with configuration yaml in
// a child process and returns its gRPC address and pid.
func startExtProcProcess(t *testing.T, yaml string) (addr string, pid int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLightExtProcHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperConfigEnv+"="+yaml)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if !strings.HasPrefix(line, "ADDR ") {
		t.Fatalf("ext_proc process: %q, %v", line, err)
	}
	go io.Copy(io.Discard, stdout)
	return strings.TrimSpace(strings.TrimPrefix(line, "ADDR ")), cmd.Process.Pid
}

// TestBenchLightOverhead prices the ext_proc path with the light load
// client (raw keep-alive TCP, a fixed request, a minimal reader) at 20
// concurrent connections on the fast 20-token upstream of the throughput
// benchmarks, where no hedge fires. The ext_proc server runs in a process
// of its own, so its CPU per request is the server's alone. Envoy is the Go
// driver in this process; the plain baseline is a Go reverse proxy (Envoy
// without the filter) in this process too, so the requests/s ratio
// includes the driver's cost of speaking ext_proc, which real Envoy pays in
// C++. Runs alternate between the two.
//
//	LLMHEDGE_BENCH=1 go test ./envoyfilter -run TestBenchLightOverhead -v
func TestBenchLightOverhead(t *testing.T) {
	if os.Getenv("LLMHEDGE_BENCH") != "1" {
		t.Skip("set LLMHEDGE_BENCH=1 to run the benchmark")
	}
	const rounds, perRound, conns = 4, 2500, 20
	up := llmsim.Start("A", llmsim.Fast())
	defer up.Close()
	spare := llmsim.Start("B", llmsim.Fast())
	defer spare.Close()
	grpcAddr, serverPid := startExtProcProcess(t, fmt.Sprintf(
		"metrics: {listen: \"off\"}\nlog: {requests: false}\nroutes:\n  - {name: chat, upstreams: [{name: A, url: %q}, {name: B, url: %q}], delay: 30s}\n",
		up.URL, spare.URL))
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	driver := envoydriver.New(conn, envoydriver.Config{})
	defer driver.Close()
	viaExtProc := httptest.NewServer(driver)
	defer viaExtProc.Close()
	upURL, _ := url.Parse(up.URL)
	plainProxy := httputil.NewSingleHostReverseProxy(upURL)
	plainProxy.Transport = &http.Transport{MaxIdleConnsPerHost: conns}
	plainProxy.FlushInterval = -1 // flush each event, as Envoy streams
	plain := httptest.NewServer(plainProxy)
	defer plain.Close()

	self := os.Getpid()
	target := func(name string, srv *httptest.Server, n int, pid int) lightload.Target {
		return lightload.StreamTarget(name, strings.TrimPrefix(srv.URL, "http://"), "/v1/chat/completions", pid, conns, n)
	}
	ctx := t.Context()
	// Warm up connections and pools.
	if _, err := lightload.Compare(ctx, 1, []lightload.Target{target("ext_proc", viaExtProc, 500, serverPid), target("plain", plain, 500, self)}); err != nil {
		t.Fatal(err)
	}
	// Two measurements of the same runs: the server process's CPU, and
	// this process's (client, upstreams, driver or reverse proxy).
	var selfCPU [2]time.Duration
	withSelf := func(i int, tg lightload.Target) lightload.Target {
		cpu := tg.CPU
		var start time.Duration
		tg.CPU = func() (time.Duration, error) {
			d, err := cpu()
			s, _ := lightload.ProcessCPU(self)
			if start == 0 {
				start = s
			} else {
				selfCPU[i] += s - start
				start = 0
			}
			return d, err
		}
		return tg
	}
	cmp, err := lightload.Compare(ctx, rounds, []lightload.Target{
		withSelf(0, target("ext_proc", viaExtProc, perRound, serverPid)),
		withSelf(1, target("plain", plain, perRound, self)),
	})
	if err != nil {
		t.Fatal(err)
	}
	cmp.CheckNoFailureNoHedge(t, spare)
	perReq := func(d time.Duration, i int) time.Duration { return d / time.Duration(cmp.Requests[i]) }
	t.Logf("light client, fast 20-token upstream, no hedge: %d rounds x %d requests, %d connections", rounds, perRound, conns)
	t.Logf("  driver+ext_proc %8.0f req/s   ext_proc server CPU %v/request   test process CPU %v/request (client, upstream, driver)",
		cmp.RPS(0), cmp.CPUPerRequest(0), perReq(selfCPU[0], 0))
	t.Logf("  plain proxy     %8.0f req/s                                     test process CPU %v/request (client, upstream, reverse proxy)",
		cmp.RPS(1), perReq(selfCPU[1], 1))
	t.Logf("  req/s ext_proc / plain = %.3f (rounds %.2f)", cmp.RPS(0)/cmp.RPS(1), cmp.RoundRatios(0, 1))
	if s := driver.Stats(); s.Spurious+s.GRPCErrors+s.Resets+s.LostBodyBytes != 0 {
		t.Errorf("protocol trouble under load: s.Spurious+s.GRPCErrors+s.Resets+s.LostBodyBytes = %v, want 0", s.Spurious+s.GRPCErrors+s.Resets+s.LostBodyBytes)
	}
}
