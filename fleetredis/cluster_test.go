package fleetredis

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// nodeID is addr's node id in c's topology.
func nodeID(t *testing.T, c *redisproc.Cluster, addr string) string {
	t.Helper()
	topo, err := c.Topology(addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range topo {
		if n.Addr == addr {
			return n.ID
		}
	}
	t.Fatalf("%s not in its own CLUSTER NODES", addr)
	return ""
}

// keysOnMasters returns one key per master, "<prefix>N" names.
func keysOnMasters(t *testing.T, c *redisproc.Cluster, prefix string) map[*redisproc.Server]string {
	t.Helper()
	out := map[*redisproc.Server]string{}
	for i := 0; len(out) < len(c.Masters()) && i < 1000; i++ {
		k := prefix + strconv.Itoa(i)
		m := c.MasterFor(k)
		if _, ok := out[m]; !ok {
			out[m] = k
		}
	}
	if len(out) != len(c.Masters()) {
		t.Fatalf("keys on %d masters, want %d", len(out), len(c.Masters()))
	}
	return out
}

// A redis+cluster:// client sends each key to its slot's master (keys on
// every master, scripts with hash-tagged keys, blocking reads), pipelines
// across slots, follows ASK during a slot migration and MOVED after it, and
// reads its slot map again after a failover.
func TestClusterClient(t *testing.T) {
	cl := redisproc.StartCluster(t, redisproc.ClusterOptions{Masters: 3, Replicas: 1, Password: "cl-s3cret"})
	c, err := New(config.FleetConfig{URL: cl.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if strings.Contains(c.Name(), "cl-s3cret") || !strings.HasSuffix(c.Name(), "/0") {
		t.Errorf("Name() = %q, want the nodes and /0 without the password", c.Name())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Check(ctx); err != nil {
		t.Fatalf("Check on a cluster: %v", err)
	}

	keys := keysOnMasters(t, cl, "k")
	for m, k := range keys {
		if _, err := do(t, c, "SET", k, "on "+m.Addr()); err != nil {
			t.Fatalf("SET %s (master %s): %v", k, m.Addr(), err)
		}
		if v, err := do(t, c, "GET", k); err != nil || v.Str != "on "+m.Addr() {
			t.Fatalf("GET %s: %+v, %v", k, v, err)
		}
	}
	// A script over keys of one hash tag, as the fleet's are.
	script := "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('INCR', KEYS[2])"
	for i := 0; i < 6; i++ {
		tag := "{id" + strconv.Itoa(i) + "}"
		v, err := do(t, c, "EVAL", script, "2", tag+":lease", tag+":n", "x")
		if err != nil || v.Int != 1 {
			t.Fatalf("EVAL over %s keys: %+v, %v", tag, v, err)
		}
	}
	// A blocking read on the blocking pool, answered by an XADD.
	got := make(chan fleetstore.RedisValue, 1)
	go func() {
		v, _ := c.Do(ctx, "XREAD", "BLOCK", "20000", "STREAMS", "{s}:stream", "$")
		got <- v
	}()
	node := cl.MasterFor("{s}:stream")
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, _ := cl.Do(node.Addr(), "INFO", "clients")
		if strings.Contains(info, "blocked_clients:1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no blocked client on %s", node.Addr())
		}
		time.Sleep(5 * time.Millisecond) // polling interval, bounded by deadline
	}
	if _, err := do(t, c, "XADD", "{s}:stream", "*", "t", "d"); err != nil {
		t.Fatal(err)
	}
	if v := <-got; v.Kind != fleetstore.RedisArray {
		t.Fatalf("blocking XREAD on the cluster: %+v, want the entry", v)
	}
	// The fleet's one pipeline spans two slots (a replica's heartbeat key
	// and the live set).
	var a, b string
	for _, k := range keys {
		if a == "" {
			a = "{" + k + "}:replica"
		} else if b == "" {
			b = "{" + k + "}:live"
		}
	}
	if _, err := do(t, c, "SET", a, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := do(t, c, "ZADD", b, "1", "r"); err != nil {
		t.Fatal(err)
	}
	out, err := c.Pipeline(ctx, [][]string{{"DEL", a}, {"ZREM", b, "r"}})
	if err != nil || len(out) != 2 || out[0].Int != 1 || out[1].Int != 1 {
		t.Fatalf("pipeline over two slots: %+v, %v; want [1 1]", out, err)
	}

	// ASK: the slot of "mig" is migrating from src to dst, the key not on src.
	src := cl.MasterFor("mig")
	var dst *redisproc.Server
	for _, m := range cl.Masters() {
		if m != src {
			dst = m
			break
		}
	}
	slot := strconv.Itoa(cl.Slot("mig"))
	srcID, dstID := nodeID(t, cl, src.Addr()), nodeID(t, cl, dst.Addr())
	if _, err := cl.Do(dst.Addr(), "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Do(src.Addr(), "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID); err != nil {
		t.Fatal(err)
	}
	if _, err := do(t, c, "SET", "mig", "v"); err != nil {
		t.Fatalf("SET during the migration (ASK): %v", err)
	}
	if n, _ := cl.Do(dst.Addr(), "CLUSTER", "COUNTKEYSINSLOT", slot); n != "1" {
		t.Fatalf("keys of slot %s on the importing node = %s, want 1 (the SET followed ASK)", slot, n)
	}
	// MOVED: the slot now belongs to dst; the client's map still says src.
	for _, m := range cl.Masters() {
		if _, err := cl.Do(m.Addr(), "CLUSTER", "SETSLOT", slot, "NODE", dstID); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := do(t, c, "GET", "mig"); err != nil || v.Str != "v" {
		t.Fatalf("GET after the migration (MOVED): %+v, %v; want v", v, err)
	}

	// Failover: the client finds the promoted replica without a restart.
	k := keys[cl.MasterFor(keys[src])]
	promoted := cl.Failover(cl.MasterFor(k))
	deadline = time.Now().Add(30 * time.Second)
	var lastErr error
	for {
		v, err := do(t, c, "SET", k, "after")
		if err == nil && v.Str == "OK" {
			break
		}
		lastErr = err
		if time.Now().After(deadline) {
			t.Fatalf("SET %s after the failover to %s: still %v", k, promoted.Addr(), lastErr)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, bounded by deadline
	}
	if v, err := cl.Do(promoted.Addr(), "GET", k); err != nil || v != "after" {
		t.Fatalf("GET %s on the promoted %s: %q, %v; want after", k, promoted.Addr(), v, err)
	}
}

// A redis:// URL at a cluster node is refused by Check (the adapters' start)
// and by every command; a redis+cluster:// URL at a plain server is refused
// by Check.
func TestClusterMismatchRefused(t *testing.T) {
	cl := redisproc.StartCluster(t, redisproc.ClusterOptions{Masters: 3})
	single, err := New(config.FleetConfig{URL: "redis://" + cl.Nodes[0].Addr() + "/0"})
	if err != nil {
		t.Fatal(err)
	}
	defer single.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = single.Check(ctx)
	if err == nil || !strings.Contains(err.Error(), "redis+cluster://") || !strings.Contains(err.Error(), "cluster_enabled:1") {
		t.Fatalf("Check of redis:// at a cluster node: %v, want a refusal naming cluster_enabled:1 and redis+cluster://", err)
	}
	if _, err := do(t, single, "GET", "k"); err == nil || !strings.Contains(err.Error(), "redis+cluster://") {
		t.Fatalf("GET through the refused client: %v, want the refusal", err)
	}
	lazy, _ := New(config.FleetConfig{URL: "redis://" + cl.Nodes[1].Addr() + "/0"})
	defer lazy.Close()
	if _, err := do(t, lazy, "GET", "k"); err == nil || !strings.Contains(err.Error(), "cluster_enabled:1") {
		t.Fatalf("first GET without Check: %v, want the refusal", err)
	}

	plain := redisproc.Start(t, redisproc.Options{})
	cc, err := New(config.FleetConfig{URL: "redis+cluster://" + plain.Addr() + "/"})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if err := cc.Check(ctx); err == nil || !strings.Contains(err.Error(), "no Redis Cluster node") {
		t.Fatalf("Check of redis+cluster:// at a plain server: %v, want a refusal", err)
	}
	// Unreachable is no mismatch: the fleet starts down and retries.
	gone := redisproc.Start(t, redisproc.Options{})
	gone.Kill()
	g, _ := New(config.FleetConfig{URL: gone.URL()})
	defer g.Close()
	if err := g.Check(ctx); err != nil {
		t.Fatalf("Check of a server that is down: %v, want nil", err)
	}
}
