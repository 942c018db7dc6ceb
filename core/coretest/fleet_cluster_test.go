package coretest

// The keyed-request protocol on a real Redis Cluster (3 masters, 3
// replicas, Debian's redis-server started by the test) through the
// cluster-aware go-redis adapter (redis+cluster://) and, for joins and
// replays, the Traefik plugin's client. Route-level features
// (budget, switches, health) are not tested here: their keys get their
// hash tags elsewhere.

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// doneKeys are the <prefix>{<id>}:done keys on every master, each with the
// master that holds it.
func doneKeys(t *testing.T, cl *redisproc.Cluster) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range cl.Masters() {
		list, err := cl.Do(m.Addr(), "KEYS", "llmhedge:{*}:done")
		if err != nil {
			t.Fatalf("KEYS on %s: %v", m.Addr(), err)
		}
		for _, k := range strings.Split(list, "\n") {
			if k != "" {
				out[k] = m.Addr()
			}
		}
	}
	return out
}

// Joins and replays across two replicas on a cluster, for keys whose
// identities land on each of the three masters, through the Redis client of
// the Caddy module and the Envoy server (go-redis: one pipeline may span
// slots) and the Traefik plugin's (resp: a pipeline stays on one slot, so
// an answer's end and its admission to the store go one after the other);
// then answers the store's budget refuses, which must not stay stored.
func TestFleetClusterJoinAndReplay(t *testing.T) {
	cl := redisproc.StartCluster(t, redisproc.ClusterOptions{Masters: 3, Replicas: 1})
	for _, client := range []string{"go-redis", "resp"} {
		t.Run(client, func(t *testing.T) {
			clusterJoinAndReplay(t, cl, client)
			clusterStoreRefuses(t, cl, client)
		})
	}
}

// clusterStoreRefuses: with a store budget below any answer, answers end
// whole, none stays stored, and the same key runs anew.
func clusterStoreRefuses(t *testing.T, cl *redisproc.Cluster, client string) {
	rig := newFleetRigOn(t, cl.URL(), make([]core.Clock, 1), client, func(cfg *config.Config) {
		cfg.Idempotency.MaxBytes, cfg.Idempotency.MaxBytesPerCaller = 64, 64
	})
	a := rig.replicas[0]
	before := doneKeys(t, cl)
	for i := 0; i < 6; i++ {
		key := client + "-full" + strconv.Itoa(i)
		for n := 1; n <= 2; n++ {
			r := a.send(t, key, "alice", chatBody)
			if !r.complete || r.status != 200 {
				t.Fatalf("%s, request %d: status %d complete %v, want 200 and complete", key, n, r.status, r.complete)
			}
			for k := range doneKeys(t, cl) {
				if _, ok := before[k]; !ok {
					t.Fatalf("%s, request %d: stored answer %s left in Redis, want none (the store's budget is 64 bytes)", key, n, k)
				}
			}
		}
		if got := rig.upstream.generations(key); got != 2 {
			t.Fatalf("%s: generations = %d, want 2 (nothing stored to replay)", key, got)
		}
	}
}

func clusterJoinAndReplay(t *testing.T, cl *redisproc.Cluster, client string) {
	rig := newFleetRigOn(t, cl.URL(), make([]core.Clock, 2), client, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	covered := map[string]int{}
	for i := 0; len(covered) < 3; i++ {
		if i == 40 {
			t.Fatalf("40 keys landed on %d masters only (%v), want all 3", len(covered), covered)
		}
		key := client + "-ck" + strconv.Itoa(i)
		before := doneKeys(t, cl)
		release := rig.upstream.hold(key, true) // b joins mid-answer
		first := a.sendAsync(t, key, "alice", chatBody)
		rig.upstream.waitStarted(t, key)
		second := b.sendAsync(t, key, "alice", chatBody)
		b.sink.waitClaim(t)
		release()
		ra, rb := recvAnswer(t, first), recvAnswer(t, second)
		if !ra.complete || !rb.complete || ra.status != 200 || rb.status != 200 {
			t.Fatalf("%s: leader %d complete=%v, follower %d complete=%v, want 200 and complete", key, ra.status, ra.complete, rb.status, rb.complete)
		}
		if got := rig.upstream.generations(key); got != 1 {
			t.Fatalf("%s: generations = %d, want 1 (the follower joined)", key, got)
		}
		if ra.body != rb.body || !strings.Contains(ra.body, "[DONE]") {
			t.Fatalf("%s: follower's body %q, leader's %q, want one whole answer", key, rb.body, ra.body)
		}
		rc := b.send(t, key, "alice", chatBody)
		if rc.body != ra.body || rc.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: replay on the other replica: replayed %q, body %q, want the stored answer", key, rc.header.Get("Idempotent-Replayed"), rc.body)
		}
		var master string
		for k, m := range doneKeys(t, cl) {
			if _, ok := before[k]; !ok {
				master = m
			}
		}
		if master == "" {
			t.Fatalf("%s: no new :done key on any master", key)
		}
		covered[master]++
	}
	for _, rep := range rig.replicas {
		if !rep.fleet.Up() {
			t.Errorf("a replica's fleet is down after the joins, want up; log %q", rep.logs)
		}
	}
}

// pacedUpstream answers each request with events that name its key, its
// generation and their index, paced so that flights are in progress when a
// master fails.
type pacedUpstream struct {
	srv    *httptest.Server
	events int
	mu     sync.Mutex
	gens   map[string]int
}

func newPacedUpstream(t *testing.T, events int) *pacedUpstream {
	u := &pacedUpstream{events: events, gens: map[string]int{}}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *pacedUpstream) serve(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.gens[key]++
	gen := u.gens[key]
	u.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	flusher := w.(http.Flusher)
	for i := 0; i < u.events; i++ {
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"%s/g%d/t%d \"}}]}\n\n", key, gen, i)
		flusher.Flush()
		// Load shape only (answers last a while, so that flights
		// straddle the failover); no assertion waits on it.
		time.Sleep(3 * time.Millisecond)
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

func (u *pacedUpstream) generations(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.gens[key]
}

var pacedToken = regexp.MustCompile(`([A-Za-z0-9-]+)/g([0-9]+)/t([0-9]+) `)

// judge classifies an answer to key: "whole" (200, one generation of key,
// every event in order, [DONE], a clean end), "broken" (a prefix of one
// generation of key, or all of it, that ends with a read error), "refused"
// (a 409 or 503 without an answer's bytes), or a description of what is
// wrong with it (another key's bytes, two generations spliced, a hole, a
// clean end without [DONE]).
func judge(key string, a answer, events int) (string, int) {
	if a.status != 200 {
		// A documented refusal to retry: the key's flight could not be
		// joined (409) or its leader lost its lease before commit (503).
		if (a.status == 409 || a.status == 503) && !pacedToken.MatchString(a.body) {
			return "refused", 0
		}
		return fmt.Sprintf("status %d with body %q", a.status, a.body), 0
	}
	gen := 0
	next := 0
	for _, m := range pacedToken.FindAllStringSubmatch(a.body, -1) {
		g, _ := strconv.Atoi(m[2])
		i, _ := strconv.Atoi(m[3])
		if m[1] != key {
			return fmt.Sprintf("wrong: %s's answer has %s's bytes", key, m[1]), 0
		}
		if gen == 0 {
			gen = g
		}
		if g != gen {
			return fmt.Sprintf("spliced: generations %d and %d in one answer", gen, g), 0
		}
		if i != next {
			return fmt.Sprintf("hole: event %d where %d belongs", i, next), 0
		}
		next++
	}
	done := strings.Contains(a.body, "[DONE]")
	switch {
	case a.complete && done && next == events:
		return "whole", gen
	case !a.complete:
		// Even after all the bytes and [DONE]: the follower could not read
		// the generation's end (its master died), so it cuts the transfer.
		return "broken", gen
	}
	return fmt.Sprintf("clean end with %d of %d events, [DONE] %v", next, events, done), 0
}

// A master fails over (SIGKILL, its replica promoted) under keyed load on
// two replicas, every key sent to both at once (one leads, the other joins)
// and every third replayed: 0 wrong, spliced or silently incomplete
// answers; each answer whole, visibly broken or a documented refusal to
// retry (409, 503); no request blocked longer
// than the failover itself plus the fleet's bound for a Redis away (the
// breaker's three operations, each within timeout + twice the block time,
// and one lease); joins and replays work again after it.
func TestFleetClusterFailoverUnderKeyedLoad(t *testing.T) {
	cl := redisproc.StartCluster(t, redisproc.ClusterOptions{Masters: 3, Replicas: 1})
	const events = 20
	up := newPacedUpstream(t, events)
	rig := newFleetRigOn(t, cl.URL(), make([]core.Clock, 2), "go-redis", func(cfg *config.Config) {
		cfg.Upstreams[0].URL = up.srv.URL
	})
	a, b := rig.replicas[0], rig.replicas[1]
	cfg := config.FleetConfig{Lease: config.Duration(300 * time.Millisecond)}.WithDefaults()
	block := time.Duration(cfg.Lease) / 2
	perOp := time.Duration(cfg.Timeout) + 2*block

	type result struct {
		key, verdict string
		who          string // "a", "b" or "replay"
		answer       answer
		gen          int
		took         time.Duration
		end          time.Time
		replay       bool
		afterFO      bool
	}
	var (
		mu        sync.Mutex
		results   []result
		failedAt  time.Time // zero before the failover
		recovered time.Time // zero until Failover returned
	)
	pairs := make(chan bool, 10000) // one per finished key: after the failover?
	stop := make(chan struct{})
	var wg sync.WaitGroup
	send := func(rep *replica, key string) (answer, time.Duration) {
		start := time.Now()
		r := rep.send(t, key, "alice", chatBody)
		return r, time.Since(start)
	}
	// The answers' ends are taken after the pair: a bound on each.
	for w := 0; w < 6; w++ {
		w := w
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				key := "load-" + strconv.Itoa(w) + "-" + strconv.Itoa(n)
				mu.Lock()
				after := !recovered.IsZero()
				mu.Unlock()
				var ra, rb answer
				var da, db time.Duration
				var pair sync.WaitGroup
				pair.Add(1)
				go func() { defer pair.Done(); ra, da = send(a, key) }()
				rb, db = send(b, key)
				pair.Wait()
				va, ga := judge(key, ra, events)
				vb, gb := judge(key, rb, events)
				end := time.Now()
				rs := []result{{key: key, who: "a", answer: ra, verdict: va, gen: ga, took: da, end: end, afterFO: after}, {key: key, who: "b", answer: rb, verdict: vb, gen: gb, took: db, end: end, afterFO: after}}
				if n%3 == 0 {
					rr, dr := send([]*replica{a, b}[n%2], key)
					vr, gr := judge(key, rr, events)
					rs = append(rs, result{key: key, who: "replay", answer: rr, verdict: vr, gen: gr, took: dr, end: time.Now(), replay: rr.header.Get("Idempotent-Replayed") == "true", afterFO: after})
				}
				mu.Lock()
				results = append(results, rs...)
				mu.Unlock()
				pairs <- after
			}
		}()
	}
	waitPairs := func(n int, after bool) {
		t.Helper()
		deadline := time.After(120 * time.Second)
		for got := 0; got < n; {
			select {
			case p := <-pairs:
				if p == after {
					got++
				}
			case <-deadline:
				t.Fatalf("only %d of %d keys finished (after the failover: %v) within 120s", got, n, after)
			}
		}
	}
	waitPairs(30, false)
	master := cl.Masters()[0]
	mu.Lock()
	failedAt = time.Now()
	mu.Unlock()
	promoted := cl.Failover(master)
	mu.Lock()
	recovered = time.Now()
	failover := recovered.Sub(failedAt)
	mu.Unlock()
	waitPairs(60, true)
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	var baseline time.Duration // the slowest answer that ended before the kill
	counts := map[string]int{}
	joinedAfter, replayedAfter := 0, 0
	gens := map[string]map[int]bool{}
	for _, r := range results {
		switch r.verdict {
		case "whole", "broken", "refused":
			counts[r.verdict]++
		default:
			t.Errorf("%s (%s, replayed %v, after the failover %v, %d generations): %s; took %v, headers %v, body %q",
				r.key, r.who, r.replay, r.afterFO, up.generations(r.key), r.verdict, r.took, r.answer.header, r.answer.body)
			counts["bad"]++
		}
		if r.end.Before(failedAt) && r.took > baseline {
			baseline = r.took
		}
		if r.verdict == "whole" {
			if gens[r.key] == nil {
				gens[r.key] = map[int]bool{}
			}
			gens[r.key][r.gen] = true
		}
		if r.afterFO && r.replay && r.verdict == "whole" {
			replayedAfter++
		}
	}
	for key, g := range gens {
		if strings.HasPrefix(key, "load-") && len(g) == 1 && up.generations(key) == 1 {
			for _, r := range results {
				if r.key == key && r.afterFO {
					joinedAfter++
					break
				}
			}
		}
	}
	bound := failover + 3*perOp + time.Duration(cfg.Lease) + baseline
	var slowest result
	for _, r := range results {
		if r.took > slowest.took {
			slowest = r
		}
	}
	t.Logf("%d answers: %d whole, %d visibly broken, %d refused (409/503), %d bad; failover of %s to %s took %v; slowest answer %v (%s, %s), bound %v (baseline %v); after the failover %d keys joined, %d replays",
		len(results), counts["whole"], counts["broken"], counts["refused"], counts["bad"], master.Addr(), promoted.Addr(), failover,
		slowest.took, slowest.key, slowest.verdict, bound, baseline, joinedAfter, replayedAfter)
	// wall clock: a request's latency through a failover is the thing under
	// test; the bound grows with the slowest answer before the failover, so
	// a loaded machine raises it too.
	if slowest.took > bound {
		t.Errorf("answer to %s took %v, want at most %v (failover %v + 3 × %v + lease + the slowest answer before it %v)", slowest.key, slowest.took, bound, failover, perOp, baseline)
	}
	if joinedAfter == 0 || replayedAfter == 0 {
		t.Errorf("after the failover %d keys joined across replicas and %d replays, want some of each", joinedAfter, replayedAfter)
	}
}
