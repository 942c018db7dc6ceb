package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/envgate"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// Fleet benchmarks through real Caddy processes and a real Redis on
// loopback. They run with LLMHEDGE_FLEET_BENCH=1 only:
//
//	LLMHEDGE_FLEET_BENCH=1 go test -run 'TestFleetBench' -v ./caddymodule/e2e

// eventTimes streams one raw chat request and returns when each data line
// arrived.
func eventTimes(ctx context.Context, client *http.Client, url, key string, sent chan<- struct{}) ([]time.Time, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-bench")
	req.Header.Set("Idempotency-Key", key)
	if sent != nil {
		close(sent)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var times []time.Time
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") && strings.Contains(sc.Text(), `"content"`) {
			times = append(times, time.Now())
		}
	}
	return times, sc.Err()
}

func quantile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q * float64(len(s)-1))
	return s[i]
}

// A follower on another replica against the leader's own client: the
// added time to first byte (first content event) and the lag of every
// event.
func TestFleetBenchFollowerLag(t *testing.T) {
	envgate.FleetBench(t)
	w := llmsim.Workload{MedianTTFT: 50 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 20, TokenGap: 10 * time.Millisecond, PingEvery: 20 * time.Millisecond}
	r := startFleet(t, 2, w)
	ctx := testContext(t)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	var ttfb, lag []time.Duration
	trials := 100
	for i := 0; i < trials; i++ {
		key := "lag-" + strconv.Itoa(i)
		var leader, follower []time.Time
		var lerr, ferr error
		done := make(chan struct{})
		go func() {
			leader, lerr = eventTimes(ctx, client, r.Replicas[0].url(0), key, nil)
			close(done)
		}()
		if err := r.Sim.WaitFor(ctx, func() bool { return r.Sim.Attempts(key) == 1 }); err != nil {
			t.Fatal(err)
		}
		follower, ferr = eventTimes(ctx, client, r.Replicas[1].url(0), key, nil)
		<-done
		if lerr != nil || ferr != nil || len(leader) < 20 || len(follower) != len(leader) {
			t.Fatalf("%s: leader %d events (%v), follower %d (%v)", key, len(leader), lerr, len(follower), ferr)
		}
		if r.Sim.Attempts(key) != 1 {
			t.Fatalf("%s: %d generations", key, r.Sim.Attempts(key))
		}
		ttfb = append(ttfb, follower[0].Sub(leader[0]))
		for j := range leader {
			lag = append(lag, follower[j].Sub(leader[j]))
		}
	}
	t.Logf("follower on another replica, %d trials: added TTFB p50 %v p99 %v; per-event lag (%d events) p50 %v p99 %v",
		trials, quantile(ttfb, 0.5), quantile(ttfb, 0.99), len(lag), quantile(lag, 0.5), quantile(lag, 0.99))
	if quantile(lag, 0.5) > 2*time.Millisecond || quantile(lag, 0.99) > 10*time.Millisecond {
		t.Errorf("per-event lag p50 %v p99 %v, goal p50 <= 2ms and p99 <= 10ms", quantile(lag, 0.5), quantile(lag, 0.99))
	}
}

// commandCounts reads what Redis ran so far: the commands clients sent,
// and the calls the scripts made inside them.
func commandCounts(t *testing.T, m *redisproc.Monitor) [2]redisproc.Calls {
	sent, inScripts, err := m.Counts()
	if err != nil {
		t.Fatal(err)
	}
	return [2]redisproc.Calls{sent, inScripts}
}

// countsSince is what the commands after before cost, per request of n:
// "sent (scripts' calls)" and the commands of each.
func countsSince(before, after [2]redisproc.Calls, n int) string {
	sent := after[0].Since(before[0], "echo")
	inner := after[1].Since(before[1])
	return fmt.Sprintf("%.1f sent, %.1f with the scripts' calls (sent: %s; in scripts: %s)",
		float64(sent.Total())/float64(n), float64(sent.Total()+inner.Total())/float64(n), sent, inner)
}

// Redis commands per keyed request: a lone leader, a leader and a
// follower, a replay. "Sent" counts the commands the replicas send (a
// script call is one); the scripts' own calls are counted beside them, as
// INFO commandstats counts them.
func TestFleetBenchRedisCommands(t *testing.T) {
	envgate.FleetBench(t)
	w := llmsim.Workload{MedianTTFT: 30 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 20, TokenGap: 2 * time.Millisecond, PingEvery: 10 * time.Millisecond}
	r := startFleet(t, 2, w)
	ctx := testContext(t)
	mon, err := r.Redis.Monitor()
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close()
	const n = 50
	before := commandCounts(t, mon)
	for i := 0; i < n; i++ {
		if got := fleetStream(ctx, r.Replicas[0], "sk-alice", "alone-"+strconv.Itoa(i), "hello", nil); got.err != nil {
			t.Fatal(got.err)
		}
	}
	lone := countsSince(before, commandCounts(t, mon), n)
	before = commandCounts(t, mon)
	for i := 0; i < n; i++ {
		key := "pair-" + strconv.Itoa(i)
		leader := make(chan streamed, 1)
		go func() { leader <- fleetStream(ctx, r.Replicas[0], "sk-alice", key, "hello", nil) }()
		if err := r.Sim.WaitFor(ctx, func() bool { return r.Sim.Attempts(key) == 1 }); err != nil {
			t.Fatal(err)
		}
		fleetStream(ctx, r.Replicas[1], "sk-alice", key, "hello", nil)
		<-leader
	}
	pair := countsSince(before, commandCounts(t, mon), n)
	before = commandCounts(t, mon)
	for i := 0; i < n; i++ {
		fleetStream(ctx, r.Replicas[1], "sk-alice", "alone-"+strconv.Itoa(i), "hello", nil)
	}
	replay := countsSince(before, commandCounts(t, mon), n)
	t.Logf("Redis commands per lone leader: %s", lone)
	t.Logf("per leader and follower: %s", pair)
	t.Logf("per replay: %s", replay)
}
