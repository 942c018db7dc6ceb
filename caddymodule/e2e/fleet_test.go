package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmhedge/llmhedge/internal/testkit/fleetsuite"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// Fleet mode through real Caddy processes sharing one real redis-server,
// with the official OpenAI Go SDK as the client. The short forms run in
// CI; LLMHEDGE_FLEET=full runs the acceptance counts.

// fleetSite hedges nothing (one attempt to upstream A) and shares keyed
// requests through the fleet at redisURL with a short lease. The operation
// timeout is 250ms, not 50ms: on the shared 2-core test machine a claim can
// wait longer than 50ms for a core, and a request whose claim times out
// runs its own race (correct, but not what these tests count).
func fleetSite(a *llmsim.Running, redisURL string) string {
	return fmt.Sprintf(`	llm_hedge {
		route fleet
		upstream %s {
			name A
		}
		max_attempts 1
		fleet %s {
			lease 500ms
			timeout 250ms
			retry_interval 200ms
		}
	}`, a.URL, redisURL)
}

// fleetErrors sums the fleet operation errors of the replicas, for
// failure messages.
func (r *fleetRig) fleetErrors(t *testing.T) float64 {
	sum := 0.0
	for _, c := range r.Replicas {
		sum += fleetMetric(t, c, "llm_hedge_fleet_operation_errors_total", nil)
	}
	return sum
}

// fleetRig is n Caddy replicas, one upstream, one Redis.
type fleetRig struct {
	*fleetsuite.Fleet[*caddyProc]
}

func startFleet(t *testing.T, n int, w llmsim.Workload) *fleetRig {
	t.Helper()
	return &fleetRig{fleetsuite.StartFleet(t, n, w, startFleetCaddy)}
}

// startFleetCaddy starts one replica: Caddy serving fleetSite.
func startFleetCaddy(f *fleetsuite.Fleet[*caddyProc]) *caddyProc {
	return startCaddy(f.T, "", fleetSite(f.Sim, f.Redis.URL()))
}

// restart replaces replica i by a fresh process (after a kill -9).
func (r *fleetRig) restart(i int) {
	r.Replicas[i] = startFleetCaddy(r.Fleet)
}

// kill9 kills replica i's process with SIGKILL.
func (r *fleetRig) kill9(i int) {
	c := r.Replicas[i]
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
}

// fleetClient is the SDK at replica c as caller apiKey.
func fleetClient(c *caddyProc, apiKey string) openai.Client {
	return openai.NewClient(option.WithBaseURL(c.url(0)+"/v1/"), option.WithAPIKey(apiKey), option.WithMaxRetries(0))
}

// fleetStream is one streaming chat completion with an idempotency key;
// firstChunk, when set, is called on the first chunk.
func fleetStream(ctx context.Context, c *caddyProc, apiKey, key, prompt string, firstChunk func()) streamed {
	out := streamed{ids: map[string]bool{}, models: map[string]bool{}}
	out.text, out.err = fleetsuite.StreamChat(ctx, fleetClient(c, apiKey), key, prompt, firstChunk, func(chunk openai.ChatCompletionChunk) {
		out.ids[chunk.ID] = true
	})
	return out
}

// fleetMetric reads a counter or histogram count from replica c.
func fleetMetric(t *testing.T, c *caddyProc, name string, labels map[string]string) float64 {
	v, _ := metricValue(t, c.metrics(), name, labels)
	return v
}

// suiteFleet is the fleetsuite.Start of Caddy's fleet.
func suiteFleet(t *testing.T, replicas int, w llmsim.Workload) (context.Context, fleetsuite.Rig) {
	return (&fleetRig{}).start(t, replicas, w)
}

// start is a fleetsuite.Start that keeps the fleet in r.
func (r *fleetRig) start(t *testing.T, replicas int, w llmsim.Workload) (context.Context, fleetsuite.Rig) {
	r.Fleet = startFleet(t, replicas, w).Fleet
	return testContext(t), r.suiteRig()
}

// suiteRig is what the fleetsuite scenarios drive of this rig.
func (r *fleetRig) suiteRig() fleetsuite.Rig {
	rig := fleetsuite.NewRig(r.Sim, r.Redis, len(r.Replicas), r.stream, r.claims, r.kill9, r.restart)
	rig.OperationErrors = r.fleetErrors
	rig.HoldToken = r.Hold.HoldToken
	return rig
}

// stream is fleetStream through replica i.
func (r *fleetRig) stream(ctx context.Context, i int, apiKey, key, prompt string, firstChunk func()) (string, error) {
	got := fleetStream(ctx, r.Replicas[i], apiKey, key, prompt, firstChunk)
	return got.text, got.err
}

// claims is how many fleet claims replica i has sent.
func (r *fleetRig) claims(t *testing.T, i int) float64 {
	return fleetMetric(t, r.Replicas[i], "llm_hedge_fleet_operation_duration_seconds", map[string]string{"op": "claim"})
}

// The same key at two replicas at once: one generation, byte-identical
// answers; a third replica afterwards gets the replay. Then the same
// caller and key with another body on another replica is a 422, and
// another caller with the same key has its own race.
func TestFleetCaddyJoinReplayConflict(t *testing.T) {
	r := &fleetRig{}
	// The replay goes through a third replica.
	ctx := fleetsuite.RunJoinReplayConflict(t, r.start, 3, func(int) int { return 2 })
	joined, replayed := 0.0, 0.0
	for _, c := range r.Replicas {
		joined += fleetMetric(t, c, "llm_hedge_idempotent_requests_total", map[string]string{"result": "joined"})
		replayed += fleetMetric(t, c, "llm_hedge_idempotent_requests_total", map[string]string{"result": "replayed"})
	}
	t.Logf("%v requests joined a flight, %v were replayed (a third replica's request that comes before the leader's end is in Redis follows the finished stream)", joined, replayed)
	// The replay says so (a header the SDK shows through the response).
	var resp *http.Response
	client := fleetClient(r.Replicas[2], "sk-alice")
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}}, option.WithHeader("Idempotency-Key", "join-0"), option.WithResponseInto(&resp))
	for stream.Next() {
	}
	stream.Close()
	if resp == nil || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("third replica's answer: Idempotent-Replayed missing")
	}
}

// kill -9 of the leader's Caddy before commit: the follower on another
// replica takes over when the lease expires and its client gets a complete
// answer; at most two generations.
func TestFleetCaddyLeaderKilledBeforeCommit(t *testing.T) {
	// The upstream holds the leader's first token until the kill landed.
	w := llmsim.Workload{MedianTTFT: 20 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 5, TokenGap: 2 * time.Millisecond, PingEvery: 20 * time.Millisecond}
	fleetsuite.RunLeaderKilled(t, suiteFleet, w, fleetsuite.Count(4, 50), 0)
}

// kill -9 of the leader's Caddy after commit: the follower's answer ends
// broken (never finished with another generation's bytes), and a retry
// with the same key gets a fresh complete answer.
func TestFleetCaddyLeaderKilledAfterCommit(t *testing.T) {
	w := llmsim.Workload{MedianTTFT: 20 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 40, TokenGap: 2 * time.Millisecond, PingEvery: 5 * time.Millisecond}
	fleetsuite.RunLeaderKilled(t, suiteFleet, w, 0, fleetsuite.Count(2, 10))
}

// Redis killed and restarted under load: 20 concurrent streams keep
// going with zero failed requests, and joins across replicas work again
// within 2s of Redis' return.
func TestFleetCaddyRedisKilledUnderLoad(t *testing.T) {
	r := startFleet(t, 3, fleetsuite.LoadWorkload())
	ctx := testContext(t)
	fleetsuite.RedisKilledUnderLoad(t, ctx, time.Duration(fleetsuite.Count(3, 30))*time.Second, r.suiteRig())
	if up := fleetMetric(t, r.Replicas[0], "llm_hedge_fleet_up", nil); up != 1 {
		t.Errorf("llm_hedge_fleet_up = %v after Redis' return, want 1", up)
	}
}

// faultSite is one route of the fault suite: upstream alone (one attempt),
// keyed requests shared through the fleet with spec's options.
func faultSite(route fleetsuite.FaultRouteSpec, spec fleetsuite.FaultSpec) string {
	return fmt.Sprintf(`	llm_hedge {
		route %s
		upstream %s {
			name A
		}
		max_attempts 1
		fleet %s {
			lease %s
			timeout %s
			retry_interval %s
		}
	}`, route.Name, route.UpstreamURL, spec.RedisURL, spec.Lease, spec.Timeout, spec.RetryInterval)
}

// The fault suite through 3 real Caddy replicas, each serving both of the
// suite's routes (one site each): FLUSHALL, Redis restarted empty,
// eviction, a leader's Caddy paused (SIGSTOP) past its lease before and
// after commit, a follower storm, and the second route with the same
// caller, key and body, under keyed load. Its ACCEPTANCE line has the
// counts.
func TestFleetCaddyFaults(t *testing.T) {
	fleetsuite.RunFaults(t, "caddy", startFaultCaddies)
}

// The fault suite on a real Redis Cluster (3 masters, a replica each)
// through redis+cluster://: a master's failover under keyed load, FLUSHALL
// on every master, a follower storm and the leader's pause; the same judge.
func TestFleetCaddyClusterFaults(t *testing.T) {
	fleetsuite.RunClusterFaults(t, "caddy", startFaultCaddies)
}

// A claim that timed out on a paused Redis but landed once it resumed:
// see fleetsuite.RunClaimTimedOut: one generation, the timed-out claim's
// request leads.
func TestFleetCaddyClaimTimedOut(t *testing.T) {
	fleetsuite.RunClaimTimedOut(t, "caddy claim-timed-out", startFaultCaddies, 3)
}

// startFaultCaddies is the fault suite's fleet of 3 Caddy replicas.
func startFaultCaddies(t *testing.T, spec fleetsuite.FaultSpec) fleetsuite.Rig {
	var sites []string
	for _, route := range spec.Routes {
		sites = append(sites, faultSite(route, spec))
	}
	var replicas []*caddyProc
	for i := 0; i < 3; i++ {
		replicas = append(replicas, startCaddy(t, "", sites...))
	}
	pause, resume := fleetsuite.Signals(t, func(i int) *os.Process { return replicas[i].cmd.Process })
	return fleetsuite.Rig{Replicas: len(replicas),
		BaseURL: func(i int, route string) string {
			for j, r := range spec.Routes {
				if r.Path == route {
					return replicas[i].url(j) + "/v1/"
				}
			}
			t.Fatalf("no route %q", route)
			return ""
		},
		Pause: pause, Resume: resume,
		Metric: func(t *testing.T, name string, labels map[string]string) float64 {
			sum := 0.0
			for _, c := range replicas {
				sum += fleetMetric(t, c, name, labels)
			}
			return sum
		}}
}
