// Package fleetsuite holds the fleet-mode scenarios that every adapter runs
// through its own real replicas sharing one real redis-server: each adapter
// passes a Rig that starts nothing itself, only reaches what its test set up.
package fleetsuite

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/loadloop"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// Count is n in CI and full under LLMHEDGE_FLEET=full (the acceptance counts).
func Count(n, full int) int {
	if os.Getenv("LLMHEDGE_FLEET") == "full" {
		return full
	}
	return n
}

// JoinWorkload is the upstream of the join and replay tests: 8 tokens
// after 30ms, 2ms apart.
func JoinWorkload() llmsim.Workload {
	return llmsim.Workload{MedianTTFT: 30 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 8, TokenGap: 2 * time.Millisecond, PingEvery: 5 * time.Millisecond}
}

// LoadWorkload is the upstream RedisKilledUnderLoad expects: 10 tokens
// after 20ms, 5ms apart.
func LoadWorkload() llmsim.Workload {
	return llmsim.Workload{MedianTTFT: 20 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 10, TokenGap: 5 * time.Millisecond, PingEvery: 5 * time.Millisecond}
}

// Rig is what a scenario needs of an adapter's fleet.
type Rig struct {
	// Replicas is how many replicas Stream can reach (indexes 0..Replicas-1).
	Replicas int
	// Stream sends one keyed streaming chat request of prompt with apiKey
	// through replica i and returns the text it got and its error;
	// firstChunk, when set, runs on the answer's first chunk.
	Stream func(ctx context.Context, replica int, apiKey, key, prompt string, firstChunk func()) (string, error)
	// Attempts is how many generations the simulated upstream ran for key.
	Attempts func(key string) int
	// Expected is the one complete answer of key (tokens long).
	Expected func(key string, tokens int) string
	// KillRedis and RestartRedis stop and bring back the shared redis-server.
	KillRedis, RestartRedis func()
	// WaitFor blocks until cond holds of the simulated upstream (or ctx ends).
	WaitFor func(ctx context.Context, cond func() bool) error
	// Claims is how many fleet claims replica i has sent (its metrics).
	Claims func(t *testing.T, replica int) float64
	// Kill9 kills replica i with SIGKILL and waits for its exit; Restart
	// starts it again in the same place.
	Kill9, Restart func(replica int)
	// OperationErrors, when set, sums the replicas' fleet operation
	// errors, for failure messages.
	OperationErrors func(t *testing.T) float64
	// Pause stops replica i (SIGSTOP) and Resume continues it (SIGCONT);
	// nil when the adapter's replicas cannot be paused alone.
	Pause, Resume func(replica int)
	// Metric, when set, sums a llm_hedge_* counter, gauge or histogram
	// count with these labels over the replicas' metrics.
	Metric func(t *testing.T, name string, labels map[string]string) float64
	// BaseURL is the OpenAI SDK base URL (".../v1/") of route on replica
	// i (RunFaults' routes).
	BaseURL func(replica int, route string) string
	// HoldToken, when set, holds token i (0 the first) of key's upstream
	// answers until release: reached is closed once one is held (see
	// llmsim.TokenHold.HoldToken).
	HoldToken func(key string, i int) (reached <-chan struct{}, release func())
}

// Upstream is the simulated upstream of a fleet test (an llmsim server).
type Upstream interface {
	Attempts(key string) int
	WaitFor(ctx context.Context, cond func() bool) error
}

// Redis is the fleet's shared redis-server (a redisproc server).
type Redis interface {
	Kill()
	Restart()
}

// NewRig is the Rig of an adapter's fleet test: its upstream, its Redis,
// and the adapter's own ways to reach, watch, kill and restart its
// replicas; the answers are llmsim's chat answers.
func NewRig(sim Upstream, redis Redis, replicas int,
	stream func(ctx context.Context, replica int, apiKey, key, prompt string, firstChunk func()) (string, error),
	claims func(t *testing.T, replica int) float64, kill9, restart func(replica int)) Rig {
	return Rig{Replicas: replicas, Stream: stream, Attempts: sim.Attempts, Expected: llmsim.ExpectedChatText,
		KillRedis: redis.Kill, RestartRedis: redis.Restart, WaitFor: sim.WaitFor,
		Claims: claims, Kill9: kill9, Restart: restart}
}

// Conflicts checks the keyed requests that must not join key's finished
// flight: the same caller with another body on replica 1 is a 422, and
// another caller with the same key has its own race (a second generation).
func Conflicts(t *testing.T, ctx context.Context, rig Rig, key string) {
	t.Helper()
	if _, err := rig.Stream(ctx, 1, "sk-alice", key, "another prompt", nil); statusOf(err) != http.StatusUnprocessableEntity {
		t.Errorf("same caller and key, other body, other replica: %v, want 422", err)
	}
	if _, err := rig.Stream(ctx, 1, "sk-bob", key, "hello", nil); err != nil || rig.Attempts(key) != 2 {
		t.Errorf("another caller, same key: err %v, generations %d; want its own race (2)", err, rig.Attempts(key))
	}
}

// statusOf is the HTTP status of an OpenAI SDK error, 0 for another error.
func statusOf(err error) int {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		return apiErr.StatusCode
	}
	return 0
}

// waitClaims polls replica's metrics (another process: there is no event
// to wait on) until it has sent more than before claims.
func waitClaims(t *testing.T, rig Rig, replica int, before float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for rig.Claims(t, replica) <= before {
		if time.Now().After(deadline) {
			t.Fatal("no claim on the follower's replica within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type streamResult struct {
	text string
	err  error
}

// LeaderKilledBeforeCommit kills (-9) the leader's replica 0 n times while
// the upstream is still before its first token (held there when the rig
// can hold it, else by a long TTFT) and the follower on replica 1 has
// claimed the key: the follower takes over when the lease expires and
// its client gets the complete answer (tokens long); at most two
// generations. It returns how many keys took two.
func LeaderKilledBeforeCommit(t *testing.T, ctx context.Context, n, tokens int, rig Rig) (twoGens int) {
	t.Helper()
	for i := 0; i < n; i++ {
		key := "kill-before-" + strconv.Itoa(i)
		release := func() {}
		var reached <-chan struct{}
		if rig.HoldToken != nil {
			// The upstream holds the leader's first token until the kill
			// landed: the leader cannot commit first, whatever the load.
			reached, release = rig.HoldToken(key, 0)
		}
		leader := make(chan streamResult, 1)
		go func() {
			text, err := rig.Stream(ctx, 0, "sk-alice", key, "hello", nil)
			leader <- streamResult{text, err}
		}()
		if err := rig.WaitFor(ctx, func() bool { return rig.Attempts(key) == 1 }); err != nil {
			t.Fatal(err)
		}
		if reached != nil {
			select {
			case <-reached:
			case <-ctx.Done():
				t.Fatalf("%s: the leader's upstream never reached its first token", key)
			}
		}
		before := rig.Claims(t, 1)
		follower := make(chan streamResult, 1)
		go func() {
			text, err := rig.Stream(ctx, 1, "sk-alice", key, "hello", nil)
			follower <- streamResult{text, err}
		}()
		waitClaims(t, rig, 1, before)
		rig.Kill9(0)
		release() // the takeover's generation is not held
		<-leader
		got := <-follower
		if got.err != nil || got.text != rig.Expected(key, tokens) {
			t.Fatalf("%s: follower after the leader's kill -9: %q, %v; want the complete answer", key, got.text, got.err)
		}
		if gens := rig.Attempts(key); gens > 2 {
			t.Fatalf("%s: %d generations, want at most 2", key, gens)
		}
		twoGens += rig.Attempts(key) - 1
		rig.Restart(0)
	}
	return twoGens
}

// LeaderKilledAfterCommit kills (-9) the leader's replica 0 n times once
// both the leader's and the follower's (replica 1) answers have started:
// the follower's answer ends broken, a strict prefix of the one generation
// (tokens long), and a retry with the same key gets a fresh complete answer.
func LeaderKilledAfterCommit(t *testing.T, ctx context.Context, n, tokens int, rig Rig) {
	t.Helper()
	for i := 0; i < n; i++ {
		key := "kill-after-" + strconv.Itoa(i)
		release := func() {}
		if rig.HoldToken != nil {
			// The upstream holds the second token until the kill landed:
			// the answer cannot end first, whatever the load.
			_, release = rig.HoldToken(key, 1)
		}
		leaderFirst := make(chan struct{})
		leader := make(chan streamResult, 1)
		go func() {
			text, err := rig.Stream(ctx, 0, "sk-alice", key, "hello", func() { close(leaderFirst) })
			leader <- streamResult{text, err}
		}()
		<-leaderFirst
		followerFirst := make(chan struct{})
		follower := make(chan streamResult, 1)
		go func() {
			text, err := rig.Stream(ctx, 1, "sk-alice", key, "hello", func() { close(followerFirst) })
			follower <- streamResult{text, err}
		}()
		<-followerFirst
		rig.Kill9(0)
		release()
		<-leader
		got := <-follower
		want := rig.Expected(key, tokens)
		if got.err == nil {
			t.Fatalf("%s: follower's answer ended cleanly after the leader's kill -9 (%q), want broken", key, got.text)
		}
		if !strings.HasPrefix(want, got.text) || got.text == want {
			t.Fatalf("%s: follower got %q, want a strict prefix of the one generation %q", key, got.text, want)
		}
		if gens := rig.Attempts(key); gens != 1 {
			t.Fatalf("%s: %d generations before the retry, want 1", key, gens)
		}
		text, err := rig.Stream(ctx, 1, "sk-alice", key, "hello", nil)
		if err != nil || text != want || rig.Attempts(key) != 2 {
			t.Fatalf("%s: retry got %q, %v with %d generations; want a fresh complete answer (2)", key, text, err, rig.Attempts(key))
		}
		rig.Restart(0)
	}
}

// RedisKilledUnderLoad runs 20 concurrent streams (answers of 10 tokens)
// across the replicas for total; Redis is killed after a third and
// restarted after two thirds. It fails on any failed request, and unless
// joins across replicas 0 and 1 work again after Redis' return (an event:
// how long that took is logged, not judged).
func RedisKilledUnderLoad(t *testing.T, ctx context.Context, total time.Duration, rig Rig) {
	t.Helper()
	var done, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	wait := loadloop.Workers(20, stop, func(g, i int) {
		key := fmt.Sprintf("load-%d-%d", g, i)
		text, err := rig.Stream(ctx, (g+i)%rig.Replicas, "sk-alice", key, "hello", nil)
		if err != nil || text != rig.Expected(key, 10) {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, fmt.Sprintf("%s: %q, %v", key, text, err))
		}
		done.Add(1)
	})
	// wall clock: the load's phases (before the kill, Redis away, after
	// its return) are spans of time by design; nothing is judged by them.
	timer := time.NewTimer(total / 3)
	<-timer.C
	rig.KillRedis()
	timer.Reset(total / 3)
	<-timer.C
	rig.RestartRedis()
	back := time.Now()
	// Polling pairs for the event (one generation for a key sent to both
	// replicas at once), bounded by a deadline that only guards against a
	// fleet that never comes back.
	joined, tries := time.Duration(-1), 0
	for ; joined < 0 && time.Since(back) < rejoinGuard && ctx.Err() == nil; tries++ {
		key := "rejoin-" + strconv.Itoa(tries)
		AtOnce(ctx, rig, "sk-carol", key)
		if rig.Attempts(key) == 1 {
			joined = time.Since(back)
		}
	}
	timer.Reset(total / 3)
	<-timer.C
	close(stop)
	wait()
	t.Logf("%d requests under load, %d failed; joins again %v after Redis' return (pair %d)", done.Load(), failed.Load(), joined, tries)
	if failed.Load() != 0 {
		t.Errorf("%d of %d requests failed while Redis was killed and restarted; first: %v", failed.Load(), done.Load(), firstErr.Load())
	}
	if joined < 0 {
		t.Errorf("joins never worked again after Redis' return: %d pairs in %v each got two generations", tries, rejoinGuard)
	}
}

// rejoinGuard bounds the polling for joins after Redis' return: far above
// the retry interval that brings a replica's fleet up again, a guard
// against a fleet that never does, not a judgement of how fast.
const rejoinGuard = 60 * time.Second

// Answer is what one streaming request got.
type Answer struct {
	Text string
	Err  error
}

// AtOnce sends key as apiKey through replicas 0 and 1 at the same time
// and returns both answers.
func AtOnce(ctx context.Context, rig Rig, apiKey, key string) [2]Answer {
	var got [2]Answer
	var wg sync.WaitGroup
	for j := 0; j < 2; j++ {
		j := j
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[j].Text, got[j].Err = rig.Stream(ctx, j, apiKey, key, "hello", nil)
		}()
	}
	wg.Wait()
	return got
}

// Start starts replicas of the adapter's proxy over one simulated upstream
// answering workload w, sharing one redis-server, all stopped at the end of
// the test, and returns their Rig and the test's context.
type Start func(t *testing.T, replicas int, w llmsim.Workload) (context.Context, Rig)

// RunJoinReplayConflict starts a fleet of replicas over JoinWorkload and
// sends keys (20, 200 under LLMHEDGE_FLEET=full) to replicas 0 and 1 at
// once: each key is one generation, both answers complete and identical;
// the key again through replica replayFrom(i) (the key's number) is
// replayed, no new generation. Then Conflicts on the first key. It
// returns the test's context, for an adapter's own checks.
func RunJoinReplayConflict(t *testing.T, start Start, replicas int, replayFrom func(i int) int) context.Context {
	ctx, rig := start(t, replicas, JoinWorkload())
	n := Count(20, 200)
	for i := 0; i < n; i++ {
		key := "join-" + strconv.Itoa(i)
		got := AtOnce(ctx, rig, "sk-alice", key)
		want := rig.Expected(key, 8)
		for j := range got {
			if got[j].Err != nil || got[j].Text != want {
				t.Fatalf("%s: replica %d answered %q (%v), want %q", key, j, got[j].Text, got[j].Err, want)
			}
		}
		if gens := rig.Attempts(key); gens != 1 {
			t.Fatalf("%s: %d upstream generations, want 1%s", key, gens, operationErrors(t, rig))
		}
		r := replayFrom(i)
		again, err := rig.Stream(ctx, r, "sk-alice", key, "hello", nil)
		if err != nil || again != want {
			t.Fatalf("%s: replica %d after completion got %q, %v; want the replay", key, r, again, err)
		}
		if gens := rig.Attempts(key); gens != 1 {
			t.Fatalf("%s: %d upstream generations after replica %d's request, want 1 (a replay)", key, gens, r)
		}
	}
	t.Logf("%d keys sent to two replicas at once: one generation each, identical answers, then replayed", n)
	Conflicts(t, ctx, rig, "join-0")
	return ctx
}

// operationErrors is the rig's fleet operation errors for a failure
// message ("" when the rig does not count them).
func operationErrors(t *testing.T, rig Rig) string {
	if rig.OperationErrors == nil {
		return ""
	}
	return fmt.Sprintf(" (fleet operation errors so far: %v)", rig.OperationErrors(t))
}

// RunLeaderKilled runs the leader-killed scenarios on one fleet of two
// replicas over w (w.Tokens long answers): before keys whose leader is
// killed before commit (LeaderKilledBeforeCommit), then after keys whose
// leader is killed after it (LeaderKilledAfterCommit); 0 skips either.
func RunLeaderKilled(t *testing.T, start Start, w llmsim.Workload, before, after int) {
	ctx, rig := start(t, 2, w)
	if before > 0 {
		twoGens := LeaderKilledBeforeCommit(t, ctx, before, w.Tokens, rig)
		t.Logf("%d kills of the leader before commit: every follower complete, %d with two generations, %d with one", before, twoGens, before-twoGens)
	}
	if after > 0 {
		LeaderKilledAfterCommit(t, ctx, after, w.Tokens, rig)
	}
}

// Fleet is an adapter's replicas (R: how its test reaches one) over one
// simulated upstream, named A, and one redis-server on loopback, all
// stopped at the end of the test.
type Fleet[R any] struct {
	T        *testing.T
	Redis    *redisproc.Server
	Sim      *llmsim.Running
	Hold     llmsim.TokenHold // holds chosen tokens of Sim's answers
	Replicas []R
}

// StartFleet starts the upstream answering w, the redis-server, and n
// replicas, each by startReplica (which Restart uses too).
func StartFleet[R any](t *testing.T, n int, w llmsim.Workload, startReplica func(*Fleet[R]) R) *Fleet[R] {
	t.Helper()
	f := &Fleet[R]{T: t, Redis: redisproc.Start(t, redisproc.Options{})}
	f.Sim = f.Hold.Start(&llmsim.Server{Name: "A", Workload: w})
	t.Cleanup(f.Sim.Close)
	for i := 0; i < n; i++ {
		f.Replicas = append(f.Replicas, startReplica(f))
	}
	return f
}
