package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
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
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
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

type extprocFleet struct {
	t        *testing.T
	redis    *redisproc.Server
	sim      *llmsim.Running
	replicas []*extprocReplica
}

func startExtprocFleet(t *testing.T, n int, w llmsim.Workload) *extprocFleet {
	t.Helper()
	f := &extprocFleet{t: t, redis: redisproc.Start(t, redisproc.Options{}), sim: llmsim.Start("A", w)}
	t.Cleanup(f.sim.Close)
	for i := 0; i < n; i++ {
		f.replicas = append(f.replicas, f.startReplica())
	}
	return f
}

// startReplica starts one server. Its fleet's operation timeout is 250ms,
// not 50ms: on the shared 2-core test machine a claim can wait longer than
// 50ms for a core, and a request whose claim times out runs its own race
// (correct, but not what these tests count).
func (f *extprocFleet) startReplica() *extprocReplica {
	t := f.t
	t.Helper()
	path := filepath.Join(t.TempDir(), "extproc.yaml")
	cfg := `
grpc: {listen: "127.0.0.1:0"}
metrics: {listen: "127.0.0.1:0"}
log: {requests: false}
shutdown: {drain_timeout: 1s, health_grace: 0s}
fleet: {url: "` + f.redis.URL() + `", lease: 500ms, timeout: 250ms, retry_interval: 200ms}
routes:
  - name: chat
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: A, url: "` + f.sim.URL + `"}]
    max_attempts: 1
`
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

// kill9 kills replica i's process with SIGKILL and starts a fresh one in
// its place once the old one is gone.
func (f *extprocFleet) kill9(i int) {
	r := f.replicas[i]
	r.p.cmd.Process.Signal(syscall.SIGKILL)
	<-r.p.exited
}

func (r *extprocReplica) claims(t *testing.T) float64 {
	t.Helper()
	resp, err := http.Get(r.metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	v, _ := metricscheck.Value(metricscheck.Parse(t, string(body)), "llm_hedge_fleet_operation_duration_seconds", map[string]string{"op": "claim"})
	return v
}

// suiteRig is what the fleetsuite scenarios drive of this fleet: its
// replicas are reached as streams, restarted in place.
func (f *extprocFleet) suiteRig() fleetsuite.Rig {
	stream := func(ctx context.Context, i int, apiKey, key, prompt string, firstChunk func()) (string, error) {
		a := fleetAnswer(ctx, f.replicas[i], apiKey, key, prompt, firstChunk)
		return a.text, a.err
	}
	claims := func(t *testing.T, i int) float64 { return f.replicas[i].claims(t) }
	restart := func(i int) { f.replicas[i] = f.startReplica() }
	return fleetsuite.NewRig(f.sim, f.redis, len(f.replicas), stream, claims, f.kill9, restart)
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
	f := startExtprocFleet(t, 2, fleetsuite.JoinWorkload())
	ctx := fleetContext(t)
	n := fleetsuite.Count(20, 200)
	rig := f.suiteRig()
	for i := 0; i < n; i++ {
		key := "join-" + strconv.Itoa(i)
		got := fleetsuite.AtOnce(ctx, rig, "sk-alice", key)
		want := llmsim.ExpectedChatText(key, 8)
		if got[0].Err != nil || got[1].Err != nil || got[0].Text != want || got[1].Text != want {
			t.Fatalf("%s: answers %q (%v) and %q (%v), want both %q", key, got[0].Text, got[0].Err, got[1].Text, got[1].Err, want)
		}
		if gens := f.sim.Attempts(key); gens != 1 {
			t.Fatalf("%s: %d upstream generations, want 1", key, gens)
		}
		again := fleetAnswer(ctx, f.replicas[i%2], "sk-alice", key, "hello", nil)
		if again.err != nil || again.text != want || f.sim.Attempts(key) != 1 {
			t.Fatalf("%s: after completion %q, %v with %d generations; want the replay", key, again.text, again.err, f.sim.Attempts(key))
		}
	}
	t.Logf("%d keys sent to both servers at once: one generation each, identical answers, then replayed", n)
	fleetsuite.Conflicts(t, ctx, rig, "join-0")
}

// kill -9 of the leader's server before commit: the follower's server
// takes over and its client gets a complete answer; at most two
// generations. After commit: the follower's answer ends broken, and a
// retry with the same key gets a fresh complete answer.
func TestFleetExtprocLeaderKilled(t *testing.T) {
	w := llmsim.Workload{MedianTTFT: 400 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 20, TokenGap: 30 * time.Millisecond, PingEvery: 20 * time.Millisecond}
	f := startExtprocFleet(t, 2, w)
	ctx := fleetContext(t)
	n := fleetsuite.Count(3, 50)
	twoGens := fleetsuite.LeaderKilledBeforeCommit(t, ctx, n, 20, f.suiteRig())
	t.Logf("%d kills of the leader before commit: every follower complete, %d with two generations", n, twoGens)
	fleetsuite.LeaderKilledAfterCommit(t, ctx, fleetsuite.Count(2, 10), 20, f.suiteRig())
}

// Redis killed and restarted under 20 concurrent streams: zero failed
// requests, and joins work again within 2s of Redis' return.
func TestFleetExtprocRedisKilledUnderLoad(t *testing.T) {
	f := startExtprocFleet(t, 2, fleetsuite.LoadWorkload())
	ctx := fleetContext(t)
	fleetsuite.RedisKilledUnderLoad(t, ctx, time.Duration(fleetsuite.Count(3, 30))*time.Second, f.suiteRig())
}
