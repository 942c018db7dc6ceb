package resp

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// One real cluster (3 masters, 3 replicas) for the cluster tests, in the
// order: slots, every range, ASK during a migration, pipelines, the
// refusal of redis://, and last a master's failover.
func TestCluster(t *testing.T) {
	rc := redisproc.StartCluster(t, redisproc.ClusterOptions{Masters: 3, Replicas: 1})
	c := newClient(t, Options{URL: rc.URL()})
	t.Run("KeySlotMatchesClusterKeyslot", func(t *testing.T) { clusterKeySlots(t, rc, c) })
	t.Run("EveryRangeFollowsMoved", func(t *testing.T) { clusterEveryRange(t, rc, c) })
	t.Run("AskDuringMigration", func(t *testing.T) { clusterAsk(t, rc, c) })
	t.Run("Pipelines", func(t *testing.T) { clusterPipelines(t, c) })
	t.Run("SingleServerURLRefused", func(t *testing.T) { clusterRefusesSingleURL(t, rc) })
	t.Run("MasterFailover", func(t *testing.T) { clusterFailover(t, rc, c) })
}

// slotOwners maps each slot to the address of its master, as the node at
// addr sees the cluster.
func slotOwners(t *testing.T, rc *redisproc.Cluster, addr string) []string {
	t.Helper()
	topo, err := rc.Topology(addr)
	if err != nil {
		t.Fatalf("CLUSTER NODES at %s: %v", addr, err)
	}
	owners := make([]string, numSlots)
	for _, n := range topo {
		if !n.Master || n.Failed {
			continue
		}
		for _, r := range n.Slots {
			for s := r[0]; s <= r[1]; s++ {
				owners[s] = n.Addr
			}
		}
	}
	for s, o := range owners {
		if o == "" {
			t.Fatalf("slot %d has no master in CLUSTER NODES at %s", s, addr)
		}
	}
	return owners
}

func clusterKeySlots(t *testing.T, rc *redisproc.Cluster, c *Client) {
	var keys []string
	for i := 0; i < 100; i++ {
		n := strconv.Itoa(i)
		keys = append(keys, "k"+n, "llmhedge:{route-"+n+"}:budget", "x{"+n+"}y{z}", "{}"+n)
	}
	keys = append(keys, "", "{", "}", "{}", "{{a}}", "a{b", "}{c}", "\x00\xff{\r\n}", "é{ü}")
	cmds := make([][]string, len(keys))
	for i, k := range keys {
		cmds[i] = []string{"CLUSTER", "KEYSLOT", k}
	}
	replies, err := c.Pipeline(ctxTimeout(t, 10*time.Second), cmds)
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT pipeline: %v", err)
	}
	for i, k := range keys {
		if got := keySlot(k); int64(got) != replies[i].Int {
			t.Errorf("keySlot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, replies[i].Int)
		}
	}
}

// clusterEveryRange points the client's whole map at one master, then
// writes keys of every slot range: each is followed to its owner by MOVED
// and stored there.
func clusterEveryRange(t *testing.T, rc *redisproc.Cluster, c *Client) {
	owners := slotOwners(t, rc, rc.Masters()[0].Addr())
	wrong := rc.Masters()[0].Addr()
	installSlots(c, []slotRange{{0, numSlots - 1, wrong}}, wrong)
	movedBefore := c.Stats().Moved
	perOwner := make(map[string]int)
	for i := 0; len(perOwner) < 3 || minCount(perOwner) < 20; i++ {
		if i > 5000 {
			t.Fatalf("keys per master after 5000: %v, want 20 on each of 3", perOwner)
		}
		key := "range-" + strconv.Itoa(i)
		owner := owners[keySlot(key)]
		if perOwner[owner] >= 20 {
			continue
		}
		perOwner[owner]++
		if _, err := c.Do(ctxTimeout(t, 5*time.Second), "SET", key, "v"+strconv.Itoa(i)); err != nil {
			t.Fatalf("SET %s (slot %d, master %s): %v", key, keySlot(key), owner, err)
		}
		got, err := rc.Do(owner, "GET", key)
		if err != nil || got != "v"+strconv.Itoa(i) {
			t.Fatalf("GET %s on its master %s: %q, %v; want %q", key, owner, got, err, "v"+strconv.Itoa(i))
		}
	}
	if moved := c.Stats().Moved - movedBefore; moved == 0 {
		t.Fatalf("MOVED followed = 0 with every slot mapped to %s, want at least one", wrong)
	}
	// The map read again after the MOVED matches the cluster's.
	waitCondition(t, "the client's map to match CLUSTER NODES", func() bool {
		c.cl.mu.Lock()
		defer c.cl.mu.Unlock()
		for s, n := range c.cl.slots {
			if n == nil || n.addr != owners[s] {
				return false
			}
		}
		return true
	})
}

func minCount(m map[string]int) int {
	least := -1
	for _, n := range m {
		if least < 0 || n < least {
			least = n
		}
	}
	return least
}

// waitCondition polls cond until it holds, failing after 10 s.
func waitCondition(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // polling, bounded by deadline
	}
}

// nodeID is the cluster id of the node at addr.
func nodeID(t *testing.T, rc *redisproc.Cluster, addr string) string {
	t.Helper()
	id, err := rc.Do(addr, "CLUSTER", "MYID")
	if err != nil {
		t.Fatalf("CLUSTER MYID at %s: %v", addr, err)
	}
	return id
}

// clusterAsk migrates one slot by hand: while it is MIGRATING on its
// master and IMPORTING on another, a key already moved is reached with ASK
// (ASKING first), and the map is unchanged; once the slot is handed over,
// a key of it is reached with MOVED.
func clusterAsk(t *testing.T, rc *redisproc.Cluster, c *Client) {
	slot := keySlot("ask")
	owners := slotOwners(t, rc, rc.Masters()[0].Addr())
	source := owners[slot]
	target := ""
	for _, m := range rc.Masters() {
		if m.Addr() != source {
			target = m.Addr()
			break
		}
	}
	sourceID := nodeID(t, rc, source)
	targetID := nodeID(t, rc, target)
	do(t, c, "SET", "{ask}old", "on-source")
	slotArg := strconv.Itoa(slot)
	if _, err := rc.Do(target, "CLUSTER", "SETSLOT", slotArg, "IMPORTING", sourceID); err != nil {
		t.Fatalf("SETSLOT IMPORTING at %s: %v", target, err)
	}
	if _, err := rc.Do(source, "CLUSTER", "SETSLOT", slotArg, "MIGRATING", targetID); err != nil {
		t.Fatalf("SETSLOT MIGRATING at %s: %v", source, err)
	}
	askedBefore := c.Stats().Asked
	// A key the source does not have goes to the target.
	if v := do(t, c, "SET", "{ask}new", "on-target"); v.Str != "OK" {
		t.Fatalf("SET {ask}new during the migration = %s, want OK", describe(v))
	}
	if v := do(t, c, "GET", "{ask}new"); v.Str != "on-target" {
		t.Fatalf("GET {ask}new during the migration = %s, want \"on-target\"", describe(v))
	}
	if v := do(t, c, "GET", "{ask}old"); v.Str != "on-source" {
		t.Fatalf("GET {ask}old (not moved yet) = %s, want \"on-source\"", describe(v))
	}
	if asked := c.Stats().Asked - askedBefore; asked != 2 {
		t.Fatalf("ASK followed = %d, want 2 (the SET and the GET of {ask}new)", asked)
	}
	if got := clientOwner(c, slot); got != source {
		t.Fatalf("the client's map after ASK: slot %d on %s, want still %s", slot, got, source)
	}
	// A pipeline on the slot: the key the source has is read there, the
	// other after ASK, in order.
	replies, err := c.Pipeline(ctxTimeout(t, 5*time.Second), [][]string{{"GET", "{ask}old"}, {"GET", "{ask}new"}})
	if err != nil || len(replies) != 2 || replies[0].Str != "on-source" || replies[1].Str != "on-target" {
		t.Fatalf("pipeline GET {ask}old, {ask}new during the migration: %v, err %v; want on-source, on-target", replies, err)
	}

	// Hand the slot over: move the remaining key, then assign the slot.
	host, port, _ := strings.Cut(target, ":")
	if _, err := rc.Do(source, "MIGRATE", host, port, "", "0", "5000", "KEYS", "{ask}old"); err != nil {
		t.Fatalf("MIGRATE {ask}old to %s: %v", target, err)
	}
	for _, addr := range []string{target, source} {
		if _, err := rc.Do(addr, "CLUSTER", "SETSLOT", slotArg, "NODE", targetID); err != nil {
			t.Fatalf("SETSLOT NODE at %s: %v", addr, err)
		}
	}
	movedBefore := c.Stats().Moved
	if v := do(t, c, "GET", "{ask}old"); v.Str != "on-source" {
		t.Fatalf("GET {ask}old after the hand-over = %s, want \"on-source\" (moved with it)", describe(v))
	}
	if moved := c.Stats().Moved - movedBefore; moved != 1 {
		t.Fatalf("MOVED followed after the hand-over = %d, want 1", moved)
	}
	if got := clientOwner(c, slot); got != target {
		t.Fatalf("the client's map after MOVED: slot %d on %s, want %s", slot, got, target)
	}
	rc.WaitHealthy()
}

func clientOwner(c *Client, slot int) string {
	c.cl.mu.Lock()
	defer c.cl.mu.Unlock()
	if n := c.cl.slots[slot]; n != nil {
		return n.addr
	}
	return ""
}

func clusterPipelines(t *testing.T, c *Client) {
	replies, err := c.Pipeline(ctxTimeout(t, 5*time.Second), [][]string{
		{"DEL", "{p}:a", "{p}:b"}, {"INCR", "{p}:a"}, {"INCRBY", "{p}:b", "5"}, {"PING"}})
	if err != nil || len(replies) != 4 || replies[1].Int != 1 || replies[2].Int != 5 || replies[3].Str != "PONG" {
		t.Fatalf("pipeline on one hash tag: %v, err %v; want [_ 1 5 PONG]", replies, err)
	}
	_, err = c.Pipeline(ctxTimeout(t, 5*time.Second), [][]string{{"SET", "foo", "1"}, {"SET", "bar", "2"}})
	if !errors.Is(err, ErrCrossSlot) {
		t.Fatalf("pipeline over slots 12182 and 5061: err = %v, want ErrCrossSlot", err)
	}
	if v := do(t, c, "EXISTS", "foo"); v.Int != 0 {
		t.Fatalf("EXISTS foo after the refused pipeline = %d, want 0 (nothing sent)", v.Int)
	}
	// EVALSHA and EVAL go to their first key's master.
	src := "return redis.call('INCR', KEYS[1])"
	_, err = c.Do(ctxTimeout(t, 5*time.Second), "EVALSHA", strings.Repeat("0", 40), "1", "{s}n")
	if rerr, ok := err.(*Error); !ok || rerr.Code() != "NOSCRIPT" {
		t.Fatalf("EVALSHA unknown: err = %v, want NOSCRIPT", err)
	}
	if v := do(t, c, "EVAL", src, "1", "{s}n"); v.Int != 1 {
		t.Fatalf("EVAL INCR {s}n = %s, want 1", describe(v))
	}
}

// A redis:// URL naming a cluster node fails every command with a message
// that names the cluster form, after one connection, for keys of any node.
func clusterRefusesSingleURL(t *testing.T, rc *redisproc.Cluster) {
	addr := rc.Masters()[0].Addr()
	single := newClient(t, Options{URL: "redis://" + addr + "/0"})
	for i := 0; i < 3; i++ {
		_, err := single.Do(ctxTimeout(t, 5*time.Second), "GET", "k"+strconv.Itoa(i))
		if err == nil || !strings.Contains(err.Error(), "is a Redis Cluster node") || !strings.Contains(err.Error(), "redis+cluster://"+addr) {
			t.Fatalf("GET through redis://%s (a cluster node): err = %v, want a refusal naming redis+cluster://", addr, err)
		}
	}
	if d := single.Stats().Dials; d != 1 {
		t.Fatalf("dials of the refused client = %d, want 1 (refused once for all)", d)
	}
}

// clusterFailover kills the master of some keys while a writer keeps
// writing them: its errors stop once the replica is promoted (the writer
// needs no new client), and the data written before the kill is there.
func clusterFailover(t *testing.T, rc *redisproc.Cluster, c *Client) {
	victim := rc.MasterFor("failover")
	var keys []string
	for i := 0; len(keys) < 5; i++ {
		k := "fo-" + strconv.Itoa(i)
		if rc.MasterFor(k) == victim {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		// Replicated before the kill: WAIT (keyless) rides with the SET
		// to the key's master, on its connection.
		replies, err := c.Pipeline(ctxTimeout(t, 10*time.Second), [][]string{{"SET", k, "before"}, {"WAIT", "1", "5000"}})
		if err != nil || replies[1].Int != 1 {
			t.Fatalf("SET %s then WAIT 1 on its master: %v, err %v; want WAIT = 1", k, replies, err)
		}
	}
	w := &failoverCounts{}
	writerDone := make(chan string, 1)
	go failoverWriter(c, keys, w, writerDone)

	victim.Kill()
	// While no replica has taken over, a command on its keys fails by its
	// deadline and does not hang.
	_, err := c.Do(ctxTimeout(t, 5*time.Second), "GET", keys[0])
	if err == nil {
		t.Fatalf("GET %s with its master killed and no replica promoted: no error", keys[0])
	}
	newMaster := rc.Failover(victim)
	w.mu.Lock()
	w.promoted = true
	w.mu.Unlock()
	waitCondition(t, "20 writes after the promotion", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.okAfter >= 20
	})
	w.mu.Lock()
	w.stop = true
	w.mu.Unlock()
	if msg := <-writerDone; msg != "" {
		t.Fatal(msg)
	}
	if w.errorsAfter > 1 {
		t.Fatalf("writes failed after %s's promotion: %d, want at most 1 (one in flight as it was seen)", newMaster.Addr(), w.errorsAfter)
	}
	t.Logf("failover of %s to %s: %d writes failed before the promotion, %d after", victim.Addr(), newMaster.Addr(), w.errorsBefore, w.errorsAfter)
	for _, k := range keys {
		v, err := c.Do(ctxTimeout(t, 5*time.Second), "GET", k)
		if err != nil || (v.Str != "before" && v.Str != "during") {
			t.Fatalf("GET %s after the failover: %s, %v; want \"before\" or \"during\"", k, describe(v), err)
		}
	}
	if got := clientOwner(c, keySlot(keys[0])); got != newMaster.Addr() {
		t.Fatalf("the client's map after the failover: slot %d on %s, want %s", keySlot(keys[0]), got, newMaster.Addr())
	}
}

// failoverCounts are the failover writer's counters and signals.
type failoverCounts struct {
	mu           sync.Mutex
	promoted     bool // set by the test once a replica took over
	stop         bool // set by the test: the writer ends
	errorsBefore int
	errorsAfter  int
	okAfter      int
}

// failoverWriter writes keys in turn until w.stop, counting the errors
// before and after w.promoted. It reports an unexpected reply.
func failoverWriter(c *Client, keys []string, w *failoverCounts, done chan string) {
	for i := 0; ; i++ {
		w.mu.Lock()
		stop := w.stop
		after := w.promoted
		w.mu.Unlock()
		if stop {
			done <- ""
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		v, err := c.Do(ctx, "SET", keys[i%len(keys)], "during")
		cancel()
		if err == nil && (v.Kind != fleetstore.RedisString || v.Str != "OK") {
			done <- "SET during the failover = " + describe(v) + ", want OK"
			return
		}
		w.mu.Lock()
		switch {
		case err != nil && after:
			w.errorsAfter++
		case err != nil:
			w.errorsBefore++
		case after:
			w.okAfter++
		}
		w.mu.Unlock()
		if err != nil && !after {
			// Pace the failing writes (each reads the map again); the
			// promotion is what the test waits for.
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// A redis+cluster:// URL that names a server without cluster support: the
// first read of the map (CLUSTER SLOTS) refuses the client, and every
// command then fails with a message that says to use redis://.
func TestClusterURLAtAPlainServerIsRefused(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: "redis+cluster://" + srv.Addr() + "/"})
	var err error
	waitCondition(t, "the refusal of redis+cluster:// at a plain server", func() bool {
		_, err = c.Do(ctxTimeout(t, 5*time.Second), "GET", "k")
		return err != nil
	})
	if !strings.Contains(err.Error(), "is not a Redis Cluster node") || !strings.Contains(err.Error(), "use redis://") {
		t.Fatalf("GET through redis+cluster:// at a plain server: err = %v, want a refusal that says to use redis://", err)
	}
}
