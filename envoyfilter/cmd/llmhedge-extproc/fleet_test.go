package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmhedge/llmhedge/internal/metricscheck"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/fleetsuite"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// Fleet mode through two real ext_proc server processes (this command,
// each behind its own envoydriver front, which plays Envoy's filter over
// real gRPC) sharing one real redis-server, with the OpenAI Go SDK as the
// client. Short forms in CI; LLMHEDGE_FLEET=full runs the acceptance counts.

// extprocReplica is one server process and the front that drives it.
type extprocReplica struct {
	p       *process
	conn    *grpc.ClientConn
	front   *httptest.Server
	metrics string // http://host:port/metrics
}

// extprocFleet is n server processes, one upstream, one Redis.
type extprocFleet struct {
	*fleetsuite.Fleet[*extprocReplica]
}

func startExtprocFleet(t *testing.T, n int, w llmsim.Workload) *extprocFleet {
	t.Helper()
	return &extprocFleet{fleetsuite.StartFleet(t, n, w, startReplica)}
}

// startReplica starts one server. Its fleet's operation timeout is 250ms,
// not 50ms: on the shared 2-core test machine a claim can wait longer than
// 50ms for a core, and a request whose claim times out runs its own race
// (correct, but not what these tests count).
func startReplica(f *fleetsuite.Fleet[*extprocReplica]) *extprocReplica {
	t := f.T
	t.Helper()
	path := filepath.Join(t.TempDir(), "extproc.yaml")
	cfg := replicaHead + `fleet: {url: "` + f.Redis.URL() + `", lease: 500ms, timeout: 250ms, retry_interval: 200ms}
routes:
  - name: chat
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: A, url: "` + f.Sim.URL + `"}]
    max_attempts: 1
`
	return launchReplica(t, path, cfg)
}

// launchReplica writes cfg to path, starts a server on it, and puts an
// envoydriver front before it; all stopped at the end of the test.
func launchReplica(t *testing.T, path, cfg string) *extprocReplica {
	t.Helper()
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "-config", path)
	serving := p.waitLog(t, "llmhedge-extproc serving")
	go func() {
		for range p.logs { // keep the process's stderr flowing
		}
	}()
	conn, err := grpc.NewClient(serving["grpc"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r := &extprocReplica{p: p, conn: conn, front: httptest.NewServer(envoydriver.New(conn, envoydriver.Config{})),
		metrics: "http://" + serving["metrics"].(string) + "/metrics"}
	t.Cleanup(func() {
		r.front.Close()
		conn.Close()
	})
	return r
}

// replicaHead is the start of a replica's configuration: listeners on
// free loopback ports, no request log, a quick shutdown.
const replicaHead = `
grpc: {listen: "127.0.0.1:0"}
metrics: {listen: "127.0.0.1:0"}
log: {requests: false}
shutdown: {drain_timeout: 1s, health_grace: 0s}
`

// kill9 kills replica i's process with SIGKILL and starts a fresh one in
// its place once the old one is gone.
func (f *extprocFleet) kill9(i int) {
	r := f.Replicas[i]
	r.p.cmd.Process.Signal(syscall.SIGKILL)
	<-r.p.exited
}

func (r *extprocReplica) claims(t *testing.T) float64 {
	return r.metric(t, "llm_hedge_fleet_operation_duration_seconds", map[string]string{"op": "claim"})
}

// metric reads a counter or histogram count from the server's metrics.
func (r *extprocReplica) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	resp, err := http.Get(r.metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	v, _ := metricscheck.Value(metricscheck.Parse(t, string(body)), name, labels)
	return v
}

// suiteFleet is the fleetsuite.Start of the ext_proc servers' fleet.
func suiteFleet(t *testing.T, replicas int, w llmsim.Workload) (context.Context, fleetsuite.Rig) {
	return fleetContext(t), startExtprocFleet(t, replicas, w).suiteRig()
}

// suiteRig is what the fleetsuite scenarios drive of this fleet: its
// replicas are reached as streams, restarted in place.
func (f *extprocFleet) suiteRig() fleetsuite.Rig {
	stream := func(ctx context.Context, i int, apiKey, key, prompt string, firstChunk func()) (string, error) {
		a := fleetAnswer(ctx, f.Replicas[i], apiKey, key, prompt, firstChunk)
		return a.text, a.err
	}
	claims := func(t *testing.T, i int) float64 { return f.Replicas[i].claims(t) }
	restart := func(i int) { f.Replicas[i] = startReplica(f.Fleet) }
	rig := fleetsuite.NewRig(f.Sim, f.Redis, len(f.Replicas), stream, claims, f.kill9, restart)
	rig.HoldToken = f.Hold.HoldToken
	return rig
}

// fleetAnswer streams one chat completion with an idempotency key through
// replica r as caller apiKey; firstChunk, when set, runs on the first chunk.
func fleetAnswer(ctx context.Context, r *extprocReplica, apiKey, key, prompt string, firstChunk func()) answer {
	c := openai.NewClient(option.WithBaseURL(r.front.URL+"/v1/"), option.WithAPIKey(apiKey), option.WithMaxRetries(0))
	a := answer{from: map[string]bool{}}
	a.text, a.err = fleetsuite.StreamChat(ctx, c, key, prompt, firstChunk, func(ch openai.ChatCompletionChunk) {
		a.from[ch.SystemFingerprint] = true
	})
	return a
}

func fleetContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// The same key at both servers at once: one generation, identical
// answers; afterwards a replay from either; another body 422, another
// caller its own race.
func TestFleetExtprocJoinReplayConflict(t *testing.T) {
	// The replay alternates between the two servers.
	fleetsuite.RunJoinReplayConflict(t, suiteFleet, 2, func(i int) int { return i % 2 })
}

// kill -9 of the leader's server before commit: the follower's server
// takes over and its client gets a complete answer; at most two
// generations. After commit: the follower's answer ends broken, and a
// retry with the same key gets a fresh complete answer.
func TestFleetExtprocLeaderKilled(t *testing.T) {
	// The upstream holds the leader's first token (before commit) or its
	// second (after) until the kill landed.
	w := llmsim.Workload{MedianTTFT: 20 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 20, TokenGap: 2 * time.Millisecond, PingEvery: 5 * time.Millisecond}
	fleetsuite.RunLeaderKilled(t, suiteFleet, w, fleetsuite.Count(3, 50), fleetsuite.Count(2, 10))
}

// Redis killed and restarted under 20 concurrent streams: zero failed
// requests, and joins work again within 2s of Redis' return.
func TestFleetExtprocRedisKilledUnderLoad(t *testing.T) {
	f := startExtprocFleet(t, 2, fleetsuite.LoadWorkload())
	ctx := fleetContext(t)
	fleetsuite.RedisKilledUnderLoad(t, ctx, time.Duration(fleetsuite.Count(3, 30))*time.Second, f.suiteRig())
}

// startFaultReplica starts one server serving the fault suite's routes,
// each on its own path prefix (/<route>/v1/), for spec.
func startFaultReplica(t *testing.T, spec fleetsuite.FaultSpec) *extprocReplica {
	t.Helper()
	path := filepath.Join(t.TempDir(), "extproc.yaml")
	cfg := replicaHead + `fleet: {url: "` + spec.RedisURL + `", lease: ` + spec.Lease + `, timeout: ` + spec.Timeout + `, retry_interval: ` + spec.RetryInterval + `}
routes:
`
	for _, route := range spec.Routes {
		cfg += `  - name: ` + route.Name + `
    match: {path_prefixes: [/` + route.Path + `/v1/]}
    upstreams: [{name: A, url: "` + route.UpstreamURL + `"}]
    max_attempts: 1
`
	}
	return launchReplica(t, path, cfg)
}

// The fault suite through 2 ext_proc server processes (each behind its
// own envoydriver front), each serving both of the suite's routes:
// FLUSHALL, Redis restarted empty, eviction, a leader's server paused
// (SIGSTOP; its front, in the test, waits on it as Envoy would) past its
// lease before and after commit, a follower storm, and the second route
// with the same caller, key and body, under keyed load. Its ACCEPTANCE
// line has the counts.
func TestFleetExtprocFaults(t *testing.T) {
	fleetsuite.RunFaults(t, "envoy-extproc", startFaultServers)
}

// The fault suite on a real Redis Cluster (3 masters, a replica each)
// through redis+cluster://: a master's failover under keyed load, FLUSHALL
// on every master, a follower storm and the leader's pause; the same judge.
func TestFleetExtprocClusterFaults(t *testing.T) {
	fleetsuite.RunClusterFaults(t, "envoy-extproc", startFaultServers)
}

// A claim that timed out on a paused Redis but landed once it resumed:
// see fleetsuite.RunClaimTimedOut: one generation, the timed-out claim's
// request leads.
func TestFleetExtprocClaimTimedOut(t *testing.T) {
	fleetsuite.RunClaimTimedOut(t, "envoy-extproc claim-timed-out", startFaultServers, 3)
}

// startFaultServers is the fault suite's fleet of 2 servers; a route whose
// name another route has (a second deployment: route names are unique in
// one server's configuration) is served by 2 servers of its own.
func startFaultServers(t *testing.T, spec fleetsuite.FaultSpec) fleetsuite.Rig {
	own, second := spec, spec
	own.Routes, second.Routes = nil, nil
	named := map[string]bool{}
	for _, r := range spec.Routes {
		if named[r.Name] {
			second.Routes = append(second.Routes, r)
		} else {
			own.Routes = append(own.Routes, r)
		}
		named[r.Name] = true
	}
	replicas := []*extprocReplica{startFaultReplica(t, own), startFaultReplica(t, own)}
	servedBy := map[string][]*extprocReplica{}
	for _, r := range own.Routes {
		servedBy[r.Path] = replicas
	}
	if len(second.Routes) > 0 {
		deployment := []*extprocReplica{startFaultReplica(t, second), startFaultReplica(t, second)}
		for _, r := range second.Routes {
			servedBy[r.Path] = deployment
		}
	}
	pause, resume := fleetsuite.Signals(t, func(i int) *os.Process { return replicas[i].p.cmd.Process })
	return fleetsuite.Rig{Replicas: len(replicas),
		BaseURL: func(i int, route string) string { return servedBy[route][i].front.URL + "/" + route + "/v1/" },
		Pause:   pause, Resume: resume,
		Metric: func(t *testing.T, name string, labels map[string]string) float64 {
			return replicas[0].metric(t, name, labels) + replicas[1].metric(t, name, labels)
		}}
}
