package coretest

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/internal/testkit/loopclock"

	"github.com/llmhedge/llmhedge/core"
)

// The fleet's integrity under Redis faults and paused leaders: one key,
// one generation, every answer whole or visibly broken.

// Continuity: the stream vanishes (FLUSHALL: a restart empty, an eviction
// or a failover to a lagging replica look the same) while a follower has
// read part of it. The leader's next append must not re-create it, and the
// follower's answer must end broken, never clean with a hole. The leader,
// whose lease went with the data, ends its own answer broken too.
func TestFleetVanishedStreamEndsFollowersBroken(t *testing.T) {
	rig := newFleetRig(t, 2, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	release := rig.upstream.hold("v1", true)
	defer release()
	leader := a.open(t, "v1", "alice", chatBody)
	defer leader.Body.Close()
	leaderGot := readUntil(t, leader.Body, "gen1-tok0")
	follower := b.open(t, "v1", "alice", chatBody)
	defer follower.Body.Close()
	got := readUntil(t, follower.Body, "gen1-tok0")
	redisDo(t, rig.redis, "FLUSHALL")
	release()
	rest, err := io.ReadAll(follower.Body)
	body := got + string(rest)
	if err == nil {
		t.Errorf("follower's answer after the stream vanished ended cleanly: %q, want broken", body)
	}
	if strings.Contains(body, "[DONE]") {
		t.Errorf("follower's answer %q has the end of an answer whose middle it missed", body)
	}
	leaderRest, leaderErr := io.ReadAll(leader.Body)
	if leaderErr == nil {
		t.Errorf("leader's answer after its lease vanished ended cleanly: %q, want broken (a new leader may answer the key)", leaderGot+string(leaderRest))
	}
	for _, k := range redisArray(t, rig.redis, "KEYS", "*:s:*") {
		t.Errorf("stream %q exists after FLUSHALL: an append re-created it", k)
	}
}

// Fencing: a leader cut off from Redis past its lease (a GC pause, a
// frozen VM) before commit; a follower takes over and completes
// generation 2. When the old leader comes back it must not commit, store
// or replay generation 1: its client gets a 503 to retry, and replays are
// generation 2.
func TestFleetPausedLeaderCannotCommitAfterTakeover(t *testing.T) {
	rig := newFleetRig(t, 3, nil)
	a, b, c := rig.replicas[0], rig.replicas[1], rig.replicas[2]
	release := rig.upstream.holdGen("p1", 1, false)
	defer release()
	first := a.sendAsync(t, "p1", "alice", chatBody)
	rig.upstream.waitStarted(t, "p1")
	second := b.sendAsync(t, "p1", "alice", chatBody)
	b.sink.waitClaim(t)
	a.client.dead.Store(true) // a is paused as far as Redis can tell
	if started := rig.upstream.waitStarted(t, "p1"); started != "p1#2" {
		t.Fatalf("takeover started %s, want p1#2", started)
	}
	rb := recvAnswer(t, second)
	if !rb.complete || rb.status != 200 || !strings.Contains(rb.body, "gen2-tok4") {
		t.Fatalf("follower that took over: status %d complete %v body %q, want generation 2 whole", rb.status, rb.complete, rb.body)
	}
	a.client.dead.Store(false) // a resumes
	release()
	ra := recvAnswer(t, first)
	if ra.status != 503 || strings.Contains(ra.body, "gen1-") || ra.header.Get("Retry-After") == "" {
		t.Errorf("old leader after the takeover: status %d Retry-After %q body %q, want a 503 to retry without generation 1",
			ra.status, ra.header.Get("Retry-After"), ra.body)
	}
	// Generation 2 is stored (unless its store failed on a loaded
	// machine: then a later request runs afresh); generation 1 never is.
	for i := 0; i < 2; i++ {
		rc := c.send(t, "p1", "alice", chatBody)
		replayed := rc.header.Get("Idempotent-Replayed") == "true"
		if strings.Contains(rc.body, "gen1-") || replayed && rc.body != rb.body {
			t.Errorf("request %d at a third replica: replayed %v body %q, want generation 2's stored answer %q (or a fresh one)",
				i, replayed, rc.body, rb.body)
		}
	}
}

// Fencing after commit: the leader is cut off past its lease mid-answer;
// its follower's answer ends cut, a new request leads generation 2 and
// completes. The old leader, back, must end its own answer broken (it may
// not pass for a whole answer of the key) and store nothing.
func TestFleetPausedLeaderAfterCommitEndsBroken(t *testing.T) {
	rig := newFleetRig(t, 3, nil)
	a, c := rig.replicas[0], rig.replicas[2]
	release := rig.upstream.holdGen("p2", 1, true)
	defer release()
	leader := a.open(t, "p2", "alice", chatBody)
	defer leader.Body.Close()
	got := readUntil(t, leader.Body, "gen1-tok0")
	a.client.dead.Store(true)
	// Once a's lease expired a new request leads generation 2.
	// Until then a request follows generation 1 and is cut with it.
	var rc answer
	for i := 0; ; i++ {
		rc = c.send(t, "p2", "alice", chatBody)
		if rc.complete && rc.status == 200 && strings.Contains(rc.body, "gen2-tok4") {
			break
		}
		if rc.complete || strings.Contains(rc.body, "gen2-") || i == 20 {
			t.Fatalf("request %d while a is paused: status %d complete %v body %q, want generation 1 cut or generation 2 whole",
				i, rc.status, rc.complete, rc.body)
		}
	}
	a.client.dead.Store(false)
	release()
	rest, err := io.ReadAll(leader.Body)
	if err == nil {
		t.Errorf("old leader's answer ended cleanly after it lost its lease: %q, want broken", got+string(rest))
	}
	replay := c.send(t, "p2", "alice", chatBody)
	if replay.header.Get("Idempotent-Replayed") != "true" || replay.body != rc.body {
		t.Errorf("replay: replayed %q body %q, want generation 2's %q", replay.header.Get("Idempotent-Replayed"), replay.body, rc.body)
	}
}

// A late follower that finds a stream without its start (its first
// entries trimmed or evicted) has written nothing: it gets a 409 to retry,
// not a connection closed on it.
func TestFleetHeadlessStreamIsAConflict(t *testing.T) {
	rig := newFleetRig(t, 2, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	release := rig.upstream.hold("h1", true)
	defer release()
	leader := a.sendAsync(t, "h1", "alice", chatBody)
	rig.upstream.waitStarted(t, "h1")
	stream := waitEntries(t, rig, 2)                      // the head and the first event
	redisDo(t, rig.redis, "XTRIM", stream, "MAXLEN", "1") // only the first event stays
	rb := b.send(t, "h1", "alice", chatBody)
	if rb.status != 409 || !rb.complete || !strings.Contains(rb.body, "idempotency_key_in_use") {
		t.Errorf("follower of a headless stream: status %d complete %v body %q, want a whole 409", rb.status, rb.complete, rb.body)
	}
	release()
	if ra := recvAnswer(t, leader); !ra.complete || ra.status != 200 {
		t.Errorf("leader: status %d complete %v, want 200 whole", ra.status, ra.complete)
	}
}

// waitEntries waits until the one stream in Redis holds n entries (the
// leader appends its events as they come) and returns its key.
func waitEntries(t *testing.T, rig *fleetRig, n int64) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if keys := redisArray(t, rig.redis, "KEYS", "*:s:*"); len(keys) == 1 && redisInt(t, rig.redis, "XLEN", keys[0]) >= n {
			return keys[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stream with %d entries within 10s", n)
		}
		time.Sleep(5 * time.Millisecond) // polling Redis for the event, not a margin
	}
}

// Identity: two routes on one Redis with the same caller, key and body
// never share an answer.
func TestFleetRoutesDoNotShareAnswers(t *testing.T) {
	n := 0
	rig := newFleetRig(t, 2, func(cfg *config.Config) {
		cfg.Route = []string{"gpt", "claude"}[n]
		n++
	})
	a, b := rig.replicas[0], rig.replicas[1]
	if ra := a.send(t, "r1", "alice", chatBody); !ra.complete || ra.status != 200 {
		t.Fatalf("route gpt: status %d complete %v", ra.status, ra.complete)
	}
	rb := b.send(t, "r1", "alice", chatBody)
	if rb.header.Get("Idempotent-Replayed") != "" || rb.status != 200 {
		t.Errorf("route claude got status %d replayed %q, want its own answer, not route gpt's replay", rb.status, rb.header.Get("Idempotent-Replayed"))
	}
	if got := rig.upstream.generations("r1"); got != 2 {
		t.Errorf("generations = %d, want 2 (one per route)", got)
	}
}

// A remote follower that leaves is uncounted: when the leader's client
// left and the last follower anywhere leaves, the leader cancels its race
// (the tokens are not paid for nobody).
func TestFleetAbandonedGenerationIsCancelled(t *testing.T) {
	rig := newFleetRig(t, 2, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	release := rig.upstream.hold("g1", true)
	defer release()
	leader := a.open(t, "g1", "alice", chatBody)
	readUntil(t, leader.Body, "gen1-tok0")
	follower := b.open(t, "g1", "alice", chatBody)
	readUntil(t, follower.Body, "gen1-tok0")
	leader.Body.Close()
	follower.Body.Close()
	select {
	case key := <-rig.upstream.cancelled:
		if key != "g1" {
			t.Errorf("cancelled %q, want g1", key)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the generation nobody reads was not cancelled within 10s (the follower that left is still counted)")
	}
}

// A follower whose stream vanished while the leader still holds its lease
// (evicted, or lingered out after the answer was stored) finishes from
// the stored answer of the same generation: whole, without a hole.
func TestFleetFollowerFinishesFromTheStoredAnswer(t *testing.T) {
	rig := newFleetRig(t, 2, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	release := rig.upstream.hold("s1", true)
	defer release()
	leader := a.sendAsync(t, "s1", "alice", chatBody)
	rig.upstream.waitStarted(t, "s1")
	stream := waitEntries(t, rig, 2)
	follower := b.open(t, "s1", "alice", chatBody)
	defer follower.Body.Close()
	got := readUntil(t, follower.Body, "gen1-tok0")
	redisDo(t, rig.redis, "DEL", stream)
	release()
	ra := recvAnswer(t, leader)
	rest, err := io.ReadAll(follower.Body)
	body := got + string(rest)
	if !ra.complete || err != nil || body != ra.body {
		t.Errorf("follower of a vanished stream: complete %v (%v), body %q; want the leader's whole answer %q", err == nil, err, body, ra.body)
	}
	if got := rig.upstream.generations("s1"); got != 1 {
		t.Errorf("generations = %d, want 1", got)
	}
}

// Memory: a stored answer is held once (its stream lingers a second), and
// the route's byte budget bounds what the fleet stores: answers past it
// are not stored. LLMHEDGE_FLEET_MEMORY=full runs the scale (400
// unique 1 MiB answers against 16 MiB); the default a smaller one. Redis
// charges an answer its allocation (up to 1.25x its bytes).
func TestFleetStoreHoldsAnswersOnceWithinItsBudget(t *testing.T) {
	answers, eventSize, budget := 60, 32<<10, int64(4<<20) // 512 KiB answers
	if os.Getenv("LLMHEDGE_FLEET_MEMORY") == "full" {
		answers, eventSize, budget = 400, 64<<10, 16<<20 // 1 MiB answers
	}
	rig := newFleetRig(t, 1, func(cfg *config.Config) {
		cfg.Idempotency.MaxBytes = config.ByteSize(budget)
		cfg.Idempotency.MaxBytesPerCaller = config.ByteSize(budget)
		cfg.Idempotency.MaxResponseBytes = 2 << 20
		// About memory, not Redis faults: an end that timed out would
		// leave its stream for the in-flight linger.
		cfg.Fleet.Timeout = config.Duration(5 * time.Second)
		// wall clock: Redis expires a lease in real time (no clock to
		// inject there); nor takeovers: the rig's 300ms lease ran out
		// while a loaded machine delayed a renewal (an answer cut).
		cfg.Fleet.Lease = config.Duration(time.Minute)
	})
	rig.upstream.mu.Lock()
	rig.upstream.events, rig.upstream.size = 16, eventSize
	rig.upstream.mu.Unlock()
	a := rig.replicas[0]
	before := keysMemory(t, rig)
	redisDo(t, rig.redis, "CONFIG", "RESETSTAT")
	answerSize := 0
	for i := 0; i < answers; i++ {
		r := a.send(t, "m"+strconv.Itoa(i), "alice", chatBody)
		if !r.complete || r.status != 200 {
			t.Fatalf("answer %d: status %d complete %v", i, r.status, r.complete)
		}
		answerSize = len(r.body)
	}
	// The streams of stored answers linger a second; the rest expire later.
	deadline := time.Now().Add(30 * time.Second)
	for len(redisArray(t, rig.redis, "KEYS", "*:s:*")) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("streams still in Redis 30s after their answers: %q", redisArray(t, rig.redis, "KEYS", "*:s:*"))
		}
		time.Sleep(50 * time.Millisecond) // polling Redis for the expiry, not a margin
	}
	stored, storedBytes := 0, int64(0)
	for _, k := range redisArray(t, rig.redis, "KEYS", "*:done") {
		stored++
		storedBytes += redisInt(t, rig.redis, "STRLEN", k)
	}
	grown := keysMemory(t, rig) - before
	t.Logf("%d answers of %d bytes, budget %d: %d stored (%d bytes), Redis grew %d bytes (%.3f of the budget plus one answer)",
		answers, answerSize, budget, stored, storedBytes, grown, float64(grown)/float64(budget+int64(answerSize)))
	if storedBytes > budget {
		t.Errorf("stored %d bytes, over the route's budget %d", storedBytes, budget)
	}
	if stored == 0 || stored == answers {
		t.Errorf("stored %d of %d answers, want the budget to admit some and refuse the rest", stored, answers)
	}
	if grown > budget+int64(answerSize) {
		t.Errorf("Redis grew %d bytes, over the budget %d plus one answer %d", grown, budget, answerSize)
	}
	// An admitted answer is two INCRBY calls (route and caller), a refusal
	// one ZRANGE (the refusing budget's first expiry); once the store
	// refused, it is not asked again until that first stored answer
	// expires (the TTL, after the test).
	stats := redisDo(t, rig.redis, "INFO", "commandstats").Str
	calls := func(cmd string) int {
		m := regexp.MustCompile(`cmdstat_` + cmd + `:calls=(\d+)`).FindStringSubmatch(stats)
		if m == nil {
			return 0
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	if admitted, refused := calls("incrby")/2, calls("zrange"); admitted != stored || refused != 1 {
		t.Errorf("the store admitted %d answers and refused %d, want the %d stored and one refusal (then no asking until one expires)", admitted, refused, stored)
	}
}

// keysMemory is what every key in Redis takes by its own account (MEMORY
// USAGE of each, exact: SAMPLES 0); client buffers, which a large command
// grows for a while, are not the store's.
func keysMemory(t *testing.T, rig *fleetRig) int64 {
	t.Helper()
	total := int64(0)
	for _, k := range redisArray(t, rig.redis, "KEYS", "*") {
		total += redisInt(t, rig.redis, "MEMORY", "USAGE", k, "SAMPLES", "0")
	}
	return total
}

// Follower storms: many keys led on one replica and followed from two
// others at once, through each Redis client the adapters use. Blocking
// reads have connections of their own (max_followers of them), so claims
// and renewals never wait behind them: the fleet stays up, no follower
// starts a second generation, and every answer is whole.
// LLMHEDGE_FLEET=full runs 1,000 followers (500 keys, two followers each).
func TestFleetFollowerStorm(t *testing.T) {
	keys := 100
	if os.Getenv("LLMHEDGE_FLEET") == "full" {
		keys = 500
	}
	for _, client := range []string{"go-redis", "resp"} {
		t.Run(client, func(t *testing.T) {
			// The default lease and timeout (the rig's 300 ms lease is for
			// takeover tests). A loaded machine may starve a leader past
			// its lease or time a claim out: the judge below tells those
			// events (Redis' own expiries, failed operations) apart.
			rig := newFleetRigClient(t, 3, client, func(cfg *config.Config) { cfg.Fleet.Lease = 0 })
			expiries := watchExpiries(t, rig.redis)
			a, b, c := rig.replicas[0], rig.replicas[1], rig.replicas[2]
			release := rig.upstream.holdAll()
			defer release()
			leaders := make([]*http.Response, keys)
			leaderHeads := make([]string, keys)
			for i := range leaders {
				k := "storm" + strconv.Itoa(i)
				leaders[i] = a.open(t, k, "alice", chatBody)
				t.Cleanup(func() { leaders[i].Body.Close() }) // (i is per iteration: Go 1.22)
				leaderHeads[i] = readUntil(t, leaders[i].Body, "gen1-tok0")
			}
			var followers []chan answer
			for i := 0; i < keys; i++ {
				k := "storm" + strconv.Itoa(i)
				followers = append(followers, b.sendAsync(t, k, "alice", chatBody), c.sendAsync(t, k, "alice", chatBody))
			}
			// Every follower has claimed (and so reads) before the release.
			for n := 0; n < 2*keys; n++ {
				if n%2 == 0 {
					b.sink.waitClaim(t)
				} else {
					c.sink.waitClaim(t)
				}
			}
			release()
			answers := make([][]answer, keys) // per key: the leader's, then its followers'
			for i, l := range leaders {
				rest, err := io.ReadAll(l.Body)
				l.Body.Close()
				answers[i] = append(answers[i], answer{status: 200, body: leaderHeads[i] + string(rest), complete: err == nil})
			}
			for i, ch := range followers {
				answers[i/2] = append(answers[i/2], recvAnswer(t, ch))
			}
			second := 0
			for i := 0; i < keys; i++ {
				if g := rig.upstream.generations("storm" + strconv.Itoa(i)); g != 1 {
					second++
				}
			}
			whole, cut, other := 0, 0, 0
			for _, key := range answers {
				for _, r := range key[1:] {
					switch {
					case wholeGeneration(r) == 1:
						whole++
					case r.status == 200:
						cut++
					default:
						other++
					}
				}
			}
			lapsed := expiries.leases(t)
			failed := map[string]int{}
			for _, r := range rig.replicas {
				r.sink.mu.Lock()
				for op, n := range r.sink.errs {
					failed[op] += n
				}
				r.sink.mu.Unlock()
			}
			t.Logf("ACCEPTANCE follower storm (%s): %d followers across 2 replicas of %d keys: %d whole, %d cut, %d other; keys with a second generation %d; leases that ran out %d; failed fleet operations %v; fleet up %v %v",
				client, 2*keys, keys, whole, cut, other, second, len(lapsed), failed, b.fleet.Up(), c.fleet.Up())
			if len(lapsed) > 0 || len(failed) > 0 {
				// A lease ran out (the leader's renewals came later than
				// the lease) or an operation timed out (a claim that may
				// have landed leads uncertain, and loses): a starved
				// machine, where another replica may rightly take a key
				// over or a request be refused for a retry. What must
				// hold then is the invariant.
				t.Logf("leases that ran out %d, failed operations %v: judged by the invariants alone", len(lapsed), failed)
				var twice []string
				for i, key := range answers {
					if !checkOneGeneration(t, "storm"+strconv.Itoa(i), key) {
						twice = append(twice, "storm"+strconv.Itoa(i))
					}
				}
				// A claim Redis did not answer leads uncertain, and one whose
				// later operations fail too answers as without a fleet: at
				// most one more whole generation per failed claim.
				if len(twice) > failed["claim"] {
					t.Errorf("%d keys with whole answers of two generations (%v), more than the %d claims that failed", len(twice), twice, failed["claim"])
				}
				return
			}
			if !b.fleet.Up() || !c.fleet.Up() {
				t.Errorf("fleet up %v/%v; want up", b.fleet.Up(), c.fleet.Up())
			}
			if whole != 2*keys || second != 0 {
				for i, key := range answers {
					for j, r := range key[1:] {
						if wholeGeneration(r) != 1 {
							t.Errorf("follower %d of storm%d: status %d, answer %q; want generation 1 whole", j, i, r.status, r.body)
						}
					}
				}
				t.Errorf("%d of %d followers whole, keys with a second generation %d, no lease ran out; want all whole and none", whole, 2*keys, second)
			}
		})
	}
}

// wholeGeneration is the generation a whole answer carries (0: none, or
// not whole, or tokens of two generations).
func wholeGeneration(r answer) int {
	gens := generationsIn(r.body)
	if r.status != 200 || !r.complete || len(gens) != 1 || !strings.Contains(r.body, "[DONE]") {
		return 0
	}
	for g := range gens {
		if !strings.Contains(r.body, fmt.Sprintf("gen%d-tok4", g)) {
			return 0
		}
		return g
	}
	return 0
}

// generationsIn are the generations whose tokens body holds.
func generationsIn(body string) map[int]bool {
	gens := map[int]bool{}
	for _, m := range genToken.FindAllStringSubmatch(body, -1) {
		g, _ := strconv.Atoi(m[1])
		gens[g] = true
	}
	return gens
}

var genToken = regexp.MustCompile(`gen(\d+)-tok`)

// checkOneGeneration: the answers to one key are never spliced, and a
// retryable refusal (409, 503) loses nothing. It reports whether every
// whole answer carries the same generation (the caller judges when not).
func checkOneGeneration(t *testing.T, key string, answers []answer) bool {
	t.Helper()
	whole := map[int]int{}
	for j, r := range answers {
		if gens := generationsIn(r.body); len(gens) > 1 {
			t.Errorf("%s answer %d: tokens of generations %v spliced into one answer: %q", key, j, gens, r.body)
		}
		if g := wholeGeneration(r); g != 0 {
			whole[g]++
		} else if r.status != 200 && r.status != 409 && r.status != 503 {
			t.Errorf("%s answer %d: status %d body %q; want an answer or a retryable refusal", key, j, r.status, r.body)
		}
	}
	if len(whole) > 1 {
		var each []string
		for j, r := range answers {
			each = append(each, fmt.Sprintf("#%d status %d whole generation %d, %d bytes", j, r.status, wholeGeneration(r), len(r.body)))
		}
		t.Logf("%s: whole answers of %d generations %v (answer 0 is the first leader's): %s", key, len(whole), whole, strings.Join(each, "; "))
		return false
	}
	return true
}

// A claim that timed out (Redis paused) may still land when Redis runs
// what it queued: the request leads as if it had claimed, renews the lease
// once Redis answers, and a follower on another replica joins it instead
// of taking the unrenewed lease over for a second generation.
func TestFleetTimedOutClaimStillLeads(t *testing.T) {
	rig := newFleetRig(t, 2, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	a.send(t, "warm", "alice", chatBody) // the route is attached, the pool has a connection
	release := rig.upstream.hold("t1", true)
	defer release()
	rig.redis.Pause()
	first := a.sendAsync(t, "t1", "alice", chatBody)
	rig.upstream.waitStarted(t, "t1") // the claim timed out: a races
	rig.redis.Resume()                // Redis runs the queued claim
	waitKeys(t, rig, "*{*}:lease")
	second := b.sendAsync(t, "t1", "alice", chatBody)
	b.sink.waitClaim(t)
	release()
	ra, rb := recvAnswer(t, first), recvAnswer(t, second)
	if got := rig.upstream.generations("t1"); got != 1 {
		t.Errorf("generations = %d, want 1 (the follower took the timed-out claim's lease over)", got)
	}
	if !ra.complete || !rb.complete || rb.body != ra.body {
		t.Errorf("leader complete %v, follower complete %v, same body %v: want both whole and alike", ra.complete, rb.complete, rb.body == ra.body)
	}
}

// A claim whose reply never came while Redis answers the replica's other
// commands (a replica too busy to read it in time) is not Redis away: the
// fleet stays up, and the leader that cannot confirm its lease must not
// answer as the key's generation, since another replica may lead it. Its
// client gets a 503 to retry, and the retry replays the other leader's
// answer. (Before: the timed-out claim, a renewal and the commit counted as
// three failures in a row, the fleet went down, and the leader answered a
// second whole generation beside the other replica's.)
func TestFleetUncertainLeaderWithRedisAnsweringRetries(t *testing.T) {
	// a's sync loop runs when the test says (aLoop.round).
	aLoop := loopclock.New(core.SystemClock{}, config.FleetConfig{})
	rig := newFleetRigClocks(t, []core.Clock{aLoop, nil}, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	a.send(t, "warm", "alice", chatBody) // a's route is attached: its sync has keys to write
	release := rig.upstream.holdGen("t2", 1, true)
	defer release()
	second := b.sendAsync(t, "t2", "alice", chatBody)
	rig.upstream.waitStarted(t, "t2") // b leads generation 1, held after its first event
	lost := a.client.loseCommands(":lease")
	first := a.sendAsync(t, "t2", "alice", chatBody)
	<-lost         // a's claim is out, its reply will not come
	aLoop.Round(t) // meanwhile Redis answers a's sync
	ra := recvAnswer(t, first)
	a.client.loseCommands("")
	if ra.status != http.StatusServiceUnavailable || ra.header.Get("Retry-After") == "" || !a.fleet.Up() {
		t.Errorf("a's client: status %d, Retry-After %q, fleet up %v; want 503 with Retry-After, the fleet up (Redis answered a's sync)",
			ra.status, ra.header.Get("Retry-After"), a.fleet.Up())
	}
	release()
	rb := recvAnswer(t, second)
	if rb.status != 200 || !rb.complete {
		t.Fatalf("b's client: status %d, complete %v; want 200 whole", rb.status, rb.complete)
	}
	retry := a.send(t, "t2", "alice", chatBody)
	if retry.status != 200 || retry.body != rb.body {
		t.Errorf("a's retry: status %d, same answer as b's %v; want b's generation replayed", retry.status, retry.body == rb.body)
	}
}

// An uncertain leader (its claim never reached Redis) whose race began
// while another replica's generation was in flight does not take the
// missing lease once that generation ended whole but unstored (here
// nothing fits the store): it cannot tell that its race ran beside it, so
// its client gets a 503 to retry. (Before: its commit adopted the missing
// lease and it answered a second whole generation; Traefik replicas
// starved by a follower storm did so through real Traefik.) Replica a's
// clock never fires a timer, so its first renewal is the one its commit
// sends.
func TestFleetUncertainLeaderDoesNotAdoptBesideAnEndedGeneration(t *testing.T) {
	rig := newFleetRigClocks(t, []core.Clock{frozenClock(), nil}, func(cfg *config.Config) { cfg.Idempotency.MaxBytes, cfg.Idempotency.MaxBytesPerCaller = 64, 64 })
	a, b := rig.replicas[0], rig.replicas[1]
	releaseB := rig.upstream.holdGen("t4", 1, true)
	defer releaseB()
	second := b.sendAsync(t, "t4", "alice", chatBody)
	rig.upstream.waitStarted(t, "t4") // b leads generation 1, held after its first event
	releaseA := rig.upstream.holdGen("t4", 2, false)
	defer releaseA()
	lost := a.client.loseCommands(":lease")
	first := a.sendAsync(t, "t4", "alice", chatBody)
	<-lost                            // a's claim is out, its reply will not come
	rig.upstream.waitStarted(t, "t4") // a leads uncertain: generation 2, held before its first event
	a.client.loseCommands("")
	releaseB()
	rb := recvAnswer(t, second)
	if rb.status != 200 || !rb.complete {
		t.Fatalf("b's client: status %d, complete %v; want 200 whole", rb.status, rb.complete)
	}
	for deadline := time.Now().Add(10 * time.Second); len(redisArray(t, rig.redis, "KEYS", "*{*}:lease")) > 0; {
		if time.Now().After(deadline) { // hang guard
			t.Fatal("b's lease still held 10s after its answer ended")
		}
		time.Sleep(5 * time.Millisecond) // polling Redis for b's end, not a margin
	}
	if done := redisArray(t, rig.redis, "KEYS", "*{*}:done"); len(done) != 0 {
		t.Fatalf("stored answers %v, want none (nothing fits the store)", done)
	}
	releaseA()
	ra := recvAnswer(t, first)
	if ra.status != http.StatusServiceUnavailable || ra.header.Get("Retry-After") == "" {
		t.Errorf("a's client: status %d (whole: %v), Retry-After %q; want 503 with Retry-After, not a second generation beside b's",
			ra.status, ra.complete, ra.header.Get("Retry-After"))
	}
}

// waitKeys waits until a key matching pattern exists and returns them.
func waitKeys(t *testing.T, rig *fleetRig, pattern string) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if keys := redisArray(t, rig.redis, "KEYS", pattern); len(keys) > 0 {
			return keys
		}
		if time.Now().After(deadline) {
			t.Fatalf("no key matching %q within 10s", pattern)
		}
		time.Sleep(5 * time.Millisecond) // polling Redis for the event, not a margin
	}
}

// A stream's end marker goes out with the generation's end, to the
// leader's client and the followers alike: a leader whose lease another
// generation took between the answer's last event and its end (a leader
// starved past its lease) ends its client's answer broken, without the
// marker, and stores nothing. The test holds the end (the one command
// that carries the marker) and hands the lease to another holder, as a
// claim after its expiry would.
func TestFleetEndMarkerGoesOutWithTheEnd(t *testing.T) {
	rig := newFleetRig(t, 1, nil)
	a := rig.replicas[0]
	held, release := a.client.holdCommands("[DONE]")
	defer release()
	releaseUpstream := rig.upstream.hold("marker", true) // after the first event: committed
	defer releaseUpstream()
	resp := a.open(t, "marker", "alice", chatBody)
	defer resp.Body.Close()
	head := readUntil(t, resp.Body, "gen1-tok0")
	releaseUpstream()
	<-held // the end, with the marker, is on its way to Redis
	handLeaseOver(t, rig)
	release()
	wantFenced(t, rig, resp.Body, head, "the end found the lease another's")
}

// wantFenced checks that a leader's answer, read on from what it got,
// ends broken without its end marker, and that nothing is stored.
func wantFenced(t *testing.T, rig *fleetRig, body io.Reader, got, why string) {
	t.Helper()
	rest, err := io.ReadAll(body)
	if all := got + string(rest); err == nil || strings.Contains(all, "[DONE]") {
		t.Errorf("leader's client: read error %v, body %q; want a broken answer without its end marker (%s)", err, all, why)
	}
	if done := redisArray(t, rig.redis, "KEYS", "*{*}:done"); len(done) != 0 {
		t.Errorf("stored answers %v, want none", done)
	}
}

// handLeaseOver gives the one lease in Redis to another holder of the same
// request, as a claim after its expiry would.
func handLeaseOver(t *testing.T, rig *fleetRig) {
	t.Helper()
	lease := waitKeys(t, rig, "*{*}:lease")[0]
	_, fp, _ := strings.Cut(redisDo(t, rig.redis, "GET", lease).Str, " ")
	redisDo(t, rig.redis, "SET", lease, "intruder "+fp, "PX", "60000")
}

// A stream's first event does not wait for its head to reach Redis (a
// round trip off every keyed stream's time to first token): the head is
// queued at commit while the lease surely holds. A head that finds the
// lease another's (Redis lost it, another claim took it) fences the
// answer: it ends broken, without its end marker, and nothing is stored.
// The test holds the head's write (the one command carrying the stream's
// Content-Type) and hands the lease to another holder meanwhile.
func TestFleetStreamHeadGoesOutBesideTheFirstEvent(t *testing.T) {
	rig := newFleetRig(t, 1, nil)
	a := rig.replicas[0]
	held, release := a.client.holdCommands("text/event-stream")
	defer release()
	releaseUpstream := rig.upstream.hold("head", true) // after the first event
	defer releaseUpstream()
	resp := a.open(t, "head", "alice", chatBody)
	defer resp.Body.Close()
	<-held
	got := readUntil(t, resp.Body, "gen1-tok0") // while the head's write waits
	handLeaseOver(t, rig)
	release()
	releaseUpstream()
	wantFenced(t, rig, resp.Body, got, "the head found the lease another's")
}

// An answer that failed validation ends the generation at its end marker
// like any stream, but it is not the winner's: the fleet does not store it
// (a retry with the key runs afresh, it is not replayed the invalid one).
func TestFleetInvalidAnswerIsNotStored(t *testing.T) {
	rig := newFleetRig(t, 1, func(cfg *config.Config) { cfg.ValidateChecks = []string{config.ValidateJSON} })
	a := rig.replicas[0]
	first := a.send(t, "invalid", "alice", chatBody)
	if first.status != 200 || !first.complete || !strings.Contains(first.body, "[DONE]") {
		t.Fatalf("first answer: status %d complete %v body %q; want the invalid answer whole, marked", first.status, first.complete, first.body)
	}
	if done := redisArray(t, rig.redis, "KEYS", "*{*}:done"); len(done) != 0 {
		t.Errorf("stored answers %v after an invalid answer, want none", done)
	}
	again := a.send(t, "invalid", "alice", chatBody)
	if again.header.Get("Idempotent-Replayed") == "true" || rig.upstream.generations("invalid") != 2 {
		t.Errorf("retry: replayed %q, generations %d; want a fresh race (generation 2)", again.header.Get("Idempotent-Replayed"), rig.upstream.generations("invalid"))
	}
}
