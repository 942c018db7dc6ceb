package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3/option"

	"github.com/llmhedge/llmhedge/internal/metricscheck"
	"github.com/llmhedge/llmhedge/internal/testkit/fleetsuite"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/loadloop"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
	"github.com/llmhedge/llmhedge/resp"
)

// Fleet mode through real Traefik processes (the plugin interpreted by
// Yaegi in each) sharing one real redis-server. The short forms run in CI;
// LLMHEDGE_FLEET=full runs the acceptance counts.

// fleetAnswer is one raw streaming answer through a replica, so that
// answers can be compared byte for byte.
type fleetAnswer struct {
	status   int
	replayed bool
	body     []byte
	err      error
}

func fleetPost(ctx context.Context, url, key, id, content, behavior string) fleetAnswer {
	body := `{"model":"` + llmsim.DefaultModel + `","stream":true,"messages":[{"role":"user","content":"` + content + `"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return fleetAnswer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-client")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set(llmsim.HeaderRequest, id)
	if behavior != "" {
		req.Header.Set(llmsim.HeaderBehavior, behavior)
	}
	resp, err := (&http.Client{Transport: clientTransport}).Do(req)
	if err != nil {
		return fleetAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return fleetAnswer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", body: b, err: err}
}

// complete reports whether a is the whole answer of upstream A to id.
func (a fleetAnswer) complete(id string, tokens int) bool {
	want := llmsim.ExpectedStream("A", llmsim.DefaultModel, id, tokens)
	return a.err == nil && a.status == http.StatusOK && bytes.Equal(llmsim.StripPings(a.body), want)
}

// fleetDynamic is a route /fleet/ through the plugin to upstream A alone
// (no hedge), its keyed requests shared through srv, with extra fleet
// option lines.
func fleetDynamic(srv *redisproc.Server, upstreamURL string, fleetOptions ...string) *dynamic {
	lines := []string{"delay: 30s", "log: stderr", "fleet:", "  url: " + srv.URL(), "  timeout: 500ms"}
	for _, o := range fleetOptions {
		lines = append(lines, "  "+o)
	}
	return newDynamic("fleet").
		hedge("hedge-fleet", pluginConfig([][2]string{{"A", upstreamURL}}, lines...)).
		route("fleet", "noop@internal", "hedge-fleet")
}

// twoFleetReplicas starts two Traefik processes whose plugin shares srv.
func twoFleetReplicas(t *testing.T, srv *redisproc.Server, upstreamURL string) (*traefik, *traefik) {
	d := fleetDynamic(srv, upstreamURL)
	one := startTraefik(t, "INFO", d)
	two := startTraefik(t, "INFO", d)
	return one, two
}

// kill9 kills a Traefik process with SIGKILL and waits for its end.
func kill9(tr *traefik) {
	tr.cmd.Process.Signal(syscall.SIGKILL)
	<-tr.exited
}

// fleetSDKStream is one streaming chat completion through the OpenAI SDK
// at replica url with an idempotency key; onFirst, when set, is called on
// the first chunk with content.
func fleetSDKStream(ctx context.Context, url, key, id string, onFirst func()) streamed {
	first := onFirst
	return streamChat(ctx, sdk(url+"/v1/"), id, "", func(int) {
		if first != nil {
			first()
			first = nil
		}
	}, option.WithHeader("Idempotency-Key", key))
}

// waitFollowing polls Redis (an external process: no event to wait on)
// until n clients wait in a blocking read, i.e. n followers follow.
func waitFollowing(t *testing.T, srv *redisproc.Server, n int) {
	t.Helper()
	c, err := resp.New(resp.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := "blocked_clients:" + strconv.Itoa(n) + "\r\n"
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		v, err := c.Do(ctx, "INFO", "clients")
		cancel()
		if err == nil && strings.Contains(v.Str, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis never had %d blocked followers (err %v): %q", n, err, v.Str)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// kill -9 of the leader's Traefik before commit: the follower on the other
// replica takes over once the lease expires and its client gets a complete
// answer from a second generation. The upstream holds the leader's first
// token until the kill has landed (then releases it), so every trial is
// before commit whatever the machine's load: no TTFT has to outlast the
// test's steps.
func TestFleetTraefikLeaderKilledBeforeCommit(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	w := llmsim.Workload{MedianTTFT: 20 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 5, TokenGap: 2 * time.Millisecond, PingEvery: 5 * time.Millisecond}
	var hold llmsim.TokenHold
	a := hold.Start(&llmsim.Server{Name: "A", Workload: w})
	defer a.Close()
	d := fleetDynamic(srv, a.URL, "lease: 500ms", "retryInterval: 200ms")
	replicas := []*traefik{startTraefik(t, "INFO", d), startTraefik(t, "INFO", d)}
	ctx := context.Background()
	n := fleetsuite.Count(3, 50)
	for i := 0; i < n; i++ {
		id := "kill-before-" + strconv.Itoa(i)
		reached, release := hold.Hold(id)
		leader := make(chan streamed, 1)
		go func() { leader <- fleetSDKStream(ctx, replicas[0].URL+"/fleet", "k-"+id, id, nil) }()
		// The leader's upstream answer is under way, its first token held:
		// the leader has not committed.
		awaitClosed(t, reached, id+": the leader's upstream reaching its first token")
		follower := make(chan streamed, 1)
		go func() { follower <- fleetSDKStream(ctx, replicas[1].URL+"/fleet", "k-"+id, id, nil) }()
		waitFollowing(t, srv, 1)
		kill9(replicas[0])
		release() // the kill landed; the takeover's generation is not held
		<-leader
		got := <-follower
		if up, ok := got.whole(id, 5); !ok || up != "A" {
			t.Fatalf("%s: the follower's client after the leader's kill -9: %s", id, got.notWhole(id, 5))
		}
		// The dead leader wrote no byte to its generation, so the
		// follower's answer can only come from a generation of its own.
		if gens := a.Attempts(id); gens != 2 {
			t.Fatalf("%s: %d upstream generations, want 2 (the killed leader's and the takeover's)", id, gens)
		}
		replicas[0] = startTraefik(t, "INFO", d)
	}
	t.Logf("%d leaders killed before commit, at their first token: every follower's client got the complete answer of a second generation", n)
}

// awaitClosed waits for ch to be closed: an event the test is sure to
// get, the deadline only a guard against a hang.
func awaitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s within 30s", what)
	}
}

// kill -9 of the leader's Traefik after commit: the follower's answer ends
// broken, a strict prefix of the one generation (never spliced), and a
// retry with the same key gets a fresh complete answer. The upstream holds
// the leader's second token until the kill has landed, so the follower has
// the first token and not the whole answer whatever the machine's load.
func TestFleetTraefikLeaderKilledAfterCommit(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	const tokens = 40
	w := llmsim.Workload{MedianTTFT: 20 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: tokens, TokenGap: 2 * time.Millisecond, PingEvery: 5 * time.Millisecond}
	var hold llmsim.TokenHold
	a := hold.Start(&llmsim.Server{Name: "A", Workload: w})
	defer a.Close()
	d := fleetDynamic(srv, a.URL, "lease: 500ms", "retryInterval: 200ms")
	replicas := []*traefik{startTraefik(t, "INFO", d), startTraefik(t, "INFO", d)}
	ctx := context.Background()
	n := fleetsuite.Count(2, 10)
	for i := 0; i < n; i++ {
		id := "kill-after-" + strconv.Itoa(i)
		_, release := hold.HoldToken(id, 1)
		leaderFirst := make(chan struct{})
		leader := make(chan streamed, 1)
		go func() {
			leader <- fleetSDKStream(ctx, replicas[0].URL+"/fleet", "k-"+id, id, func() { close(leaderFirst) })
		}()
		<-leaderFirst
		followerFirst := make(chan struct{})
		follower := make(chan streamed, 1)
		go func() {
			follower <- fleetSDKStream(ctx, replicas[1].URL+"/fleet", "k-"+id, id, func() { close(followerFirst) })
		}()
		<-followerFirst
		kill9(replicas[0])
		release() // the kill landed; the retry's generation is not held
		<-leader
		got := <-follower
		want := llmsim.ExpectedChatText(id, tokens)
		if got.err == nil {
			t.Fatalf("%s: the follower's answer ended cleanly after the leader's kill -9 (%d of %d bytes), want broken", id, len(got.content), len(want))
		}
		if !strings.HasPrefix(want, got.content) || got.content == want {
			t.Fatalf("%s: the follower got %q, want a strict prefix of the one generation %q", id, got.content, want)
		}
		if gens := a.Attempts(id); gens != 1 {
			t.Fatalf("%s: %d generations before the retry, want 1", id, gens)
		}
		retry := fleetSDKStream(ctx, replicas[1].URL+"/fleet", "k-"+id, id, nil)
		if _, ok := retry.whole(id, tokens); !ok {
			t.Fatalf("%s: the retry: %s", id, retry.notWhole(id, tokens))
		}
		if gens := a.Attempts(id); gens != 2 {
			t.Fatalf("%s: %d generations after the retry, want 2 (a fresh race)", id, gens)
		}
		replicas[0] = startTraefik(t, "INFO", d)
	}
	t.Logf("%d leaders killed after commit: every follower's answer broken, a prefix of one generation; every retry a fresh complete answer", n)
}

// The fleet across two real Traefik replicas (the plugin interpreted by
// Yaegi in each) sharing one redis-server.
func TestFleetAcrossTwoTraefikReplicas(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	wl := functionalWorkload()
	tokens := wl.WithDefaults().Tokens
	a := llmsim.Start("A", wl)
	defer a.Close()
	one, two := twoFleetReplicas(t, srv, a.URL)
	replicas := []string{one.URL + "/fleet", two.URL + "/fleet"}
	ctx := context.Background()

	pairs := fleetsuite.Count(20, 200)
	t.Run("same key at both replicas at once: one generation, identical bytes", func(t *testing.T) {
		for i := 0; i < pairs; i++ {
			id := fmt.Sprintf("pair-%d", i)
			var wg sync.WaitGroup
			answers := make([]fleetAnswer, 2)
			for r := range replicas {
				wg.Add(1)
				go func() {
					defer wg.Done()
					answers[r] = fleetPost(ctx, replicas[r], "k-"+id, id, "hi", "A=ttft:200ms")
				}()
			}
			wg.Wait()
			for r, ans := range answers {
				if !ans.complete(id, tokens) {
					t.Fatalf("%s at replica %d: status %d, err %v, body %q", id, r+1, ans.status, ans.err, ans.body)
				}
			}
			if !bytes.Equal(answers[0].body, answers[1].body) {
				t.Fatalf("%s: the replicas' answers differ:\n%q\n%q", id, answers[0].body, answers[1].body)
			}
			if n := a.Attempts(id); n != 1 {
				t.Fatalf("%s: %d upstream generations, want 1", id, n)
			}
			// Replayed on the other replica than the first answer's.
			rep := fleetPost(ctx, replicas[(i+1)%2], "k-"+id, id, "hi", "")
			if !rep.replayed || !bytes.Equal(rep.body, answers[0].body) {
				t.Fatalf("%s: replay on the other replica: replayed %v, same bytes %v", id, rep.replayed, bytes.Equal(rep.body, answers[0].body))
			}
			if n := a.Attempts(id); n != 1 {
				t.Fatalf("%s after the replay: %d upstream generations, want 1", id, n)
			}
		}
		t.Logf("%d keys sent to both replicas at once: one generation each, byte-identical answers, replayed on the other replica", pairs)
	})

	t.Run("same key, another body, on the other replica: 422", func(t *testing.T) {
		first := fleetPost(ctx, replicas[0], "k-conflict", "conflict", "hi", "")
		if !first.complete("conflict", tokens) {
			t.Fatalf("first request: status %d, err %v", first.status, first.err)
		}
		other := fleetPost(ctx, replicas[1], "k-conflict", "conflict", "something else", "")
		if other.status != http.StatusUnprocessableEntity {
			t.Fatalf("another body under the key at the other replica: status %d, want 422", other.status)
		}
	})

	t.Run("Redis killed and restarted under load: no failed request", func(t *testing.T) {
		const streams = 20
		loadFor := time.Duration(fleetsuite.Count(6, 30)) * time.Second
		var sent, failed atomic.Int64
		var firstFailure atomic.Value
		stop := make(chan struct{})
		wait := loadloop.Workers(streams, stop, func(s, n int) {
			id := fmt.Sprintf("load-%d-%d", s, n)
			ans := fleetPost(ctx, replicas[(s+n)%2], "k-"+id, id, "hi", "")
			sent.Add(1)
			if !ans.complete(id, tokens) {
				failed.Add(1)
				firstFailure.CompareAndSwap(nil, fmt.Sprintf("%s: status %d, err %v, body %q", id, ans.status, ans.err, proc.Tail(string(ans.body), 300)))
			}
		})
		// wall clock: the phases of a load test (load before the kill,
		// Redis away, load after its return) are spans of time by design;
		// nothing is asserted about how long anything took.
		time.Sleep(loadFor / 3)
		srv.Kill()
		time.Sleep(loadFor / 3)
		srv.Restart()
		back := time.Now()
		// Joins work again after Redis' return: pairs with one key at both
		// replicas until one pair shares one generation (polling for an
		// event of two other processes, bounded by a deadline that only
		// guards against a fleet that never comes back).
		joinedAfter, tries := time.Duration(-1), 0
		for deadline := back.Add(60 * time.Second); joinedAfter < 0 && time.Now().Before(deadline); tries++ {
			id := fmt.Sprintf("rejoin-%d", tries)
			var wg2 sync.WaitGroup
			answers := make([]fleetAnswer, 2)
			for r := range replicas {
				wg2.Add(1)
				go func() {
					defer wg2.Done()
					answers[r] = fleetPost(ctx, replicas[r], "k-"+id, id, "hi", "A=ttft:200ms")
				}()
			}
			wg2.Wait()
			if answers[0].complete(id, tokens) && answers[1].complete(id, tokens) && a.Attempts(id) == 1 {
				joinedAfter = time.Since(back)
			}
		}
		time.Sleep(loadFor / 3)
		close(stop)
		wait()
		t.Logf("%d streams for %v, Redis killed for %v: %d requests, %d failed; joins again %v after Redis' return (pair %d)",
			streams, loadFor, loadFor/3, sent.Load(), failed.Load(), joinedAfter.Round(time.Millisecond), tries)
		if failed.Load() != 0 {
			t.Fatalf("%d of %d requests failed while Redis was killed and restarted; first: %v", failed.Load(), sent.Load(), firstFailure.Load())
		}
		if joinedAfter < 0 {
			t.Fatalf("joins never worked again after Redis' return: %d pairs in 60s, each with two generations or a failed answer", tries)
		}
		for _, tr := range []*traefik{one, two} {
			logs := tr.logs.String()
			if strings.Contains(logs, "panic") {
				t.Fatalf("Traefik logged a panic:\n%s", proc.Tail(logs, 3000))
			}
			if !strings.Contains(logs, "llmhedge fleet down") || !strings.Contains(logs, "llmhedge fleet up") {
				t.Fatalf("a replica did not log the fleet going down and up:\n%s", proc.Tail(logs, 3000))
			}
		}
	})
}

// The fault suite through 2 real Traefik replicas, each serving both of
// the suite's routes (/faults/ and /faults-b/, each its own plugin
// middleware and route name): FLUSHALL, Redis restarted empty, eviction,
// a leader's Traefik paused (SIGSTOP) past its lease before and after
// commit, a follower storm, and the second route with the same caller,
// key and body, under keyed load. Its ACCEPTANCE line has the counts.
func TestFleetTraefikFaults(t *testing.T) {
	fleetsuite.RunFaults(t, "traefik", startFaultTraefiks)
}

// The fault suite on a real Redis Cluster (3 masters, a replica each)
// through redis+cluster://: a master's failover under keyed load, FLUSHALL
// on every master, a follower storm and the leader's pause; the same judge.
func TestFleetTraefikClusterFaults(t *testing.T) {
	fleetsuite.RunClusterFaults(t, "traefik", startFaultTraefiks)
}

// A claim that timed out on a paused Redis but landed once it resumed:
// see fleetsuite.RunClaimTimedOut: one generation, the timed-out claim's
// request leads.
func TestFleetTraefikClaimTimedOut(t *testing.T) {
	fleetsuite.RunClaimTimedOut(t, "traefik claim-timed-out", startFaultTraefiks, 3)
}

// startFaultTraefiks is the fault suite's fleet of 2 Traefik replicas.
func startFaultTraefiks(t *testing.T, spec fleetsuite.FaultSpec) fleetsuite.Rig {
	d := newDynamic("faults")
	for _, route := range spec.Routes {
		d.hedge("hedge-"+route.Path, pluginConfig([][2]string{{"A", route.UpstreamURL}},
			"route: "+route.Name, "maxAttempts: 1", "delay: 30s", "log: stderr", "fleet:", "  url: "+spec.RedisURL,
			"  lease: "+spec.Lease, "  timeout: "+spec.Timeout, "  retryInterval: "+spec.RetryInterval,
			"metricsPath: /llmhedge/metrics")).
			route(route.Path, "noop@internal", "hedge-"+route.Path)
	}
	replicas := []*traefik{startTraefik(t, "INFO", d), startTraefik(t, "INFO", d)}
	pause, resume := fleetsuite.Signals(t, func(i int) *os.Process { return replicas[i].cmd.Process })
	return fleetsuite.Rig{Replicas: len(replicas),
		BaseURL: func(i int, route string) string { return replicas[i].URL + "/" + route + "/v1/" },
		Pause:   pause, Resume: resume,
		// The plugin's counts are process-wide: one route's metricsPath
		// has both.
		Metric: func(t *testing.T, name string, labels map[string]string) float64 {
			sum := 0.0
			for _, tr := range replicas {
				res, err := http.Get(tr.URL + "/" + spec.Routes[0].Path + "/llmhedge/metrics")
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				v, _ := metricscheck.Value(metricscheck.Parse(t, string(body)), name, labels)
				sum += v
			}
			return sum
		}}
}
