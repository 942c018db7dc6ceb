package redisproc

import (
	"strings"
	"testing"
)

// A 3-master, 3-replica cluster: every slot served, keys with one hash tag
// on one master, a MOVED for a key another master serves, and a failover
// that promotes the killed master's replica, after which the old master
// rejoins as a replica.
func TestClusterStartAndFailover(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Masters: 3, Replicas: 1, Password: "cl-pw"})
	if len(c.Nodes) != 6 {
		t.Fatalf("%d nodes, want 6", len(c.Nodes))
	}
	masters := c.Masters()
	if len(masters) != 3 {
		t.Fatalf("%d masters, want 3", len(masters))
	}
	if !strings.HasPrefix(c.URL(), "redis+cluster://:cl-pw@127.0.0.1:") || strings.Count(c.URL(), ",") != 5 || !strings.HasSuffix(c.URL(), "/") {
		t.Errorf("URL() = %q, want redis+cluster://:cl-pw@ and six comma-separated addresses", c.URL())
	}
	if a, b := c.Slot("{id}:lease"), c.Slot("{id}:stream"); a != b {
		t.Errorf("slots of {id}:lease and {id}:stream = %d, %d, want one slot", a, b)
	}
	// Keys on three masters: some key lands on a master other than the first.
	m := c.MasterFor("a")
	other := ""
	for _, k := range []string{"b", "c", "d", "e", "f", "g", "h"} {
		if c.MasterFor(k) != m {
			other = k
			break
		}
	}
	if other == "" {
		t.Fatal("keys a..h all on one master")
	}
	if _, err := c.Do(m.Addr(), "SET", other, "v"); err == nil || !strings.HasPrefix(err.Error(), "MOVED") {
		t.Errorf("SET %s on the master of a: %v, want a MOVED error", other, err)
	}
	if _, err := c.Do(c.MasterFor(other).Addr(), "SET", other, "v"); err != nil {
		t.Errorf("SET %s on its master: %v", other, err)
	}

	promoted := c.Failover(m)
	if promoted == m || promoted == nil {
		t.Fatalf("Failover returned %v, want a replica of %s", promoted, m.Addr())
	}
	if got := c.MasterFor("a"); got != promoted {
		t.Errorf("master of a after failover = %s, want the promoted %s", got.Addr(), promoted.Addr())
	}
	m.Restart()
	c.WaitHealthy()
	for _, n := range c.topology() {
		if n.Addr == m.Addr() && n.Master {
			t.Errorf("restarted %s is a master, want a replica of %s", m.Addr(), promoted.Addr())
		}
	}
}
