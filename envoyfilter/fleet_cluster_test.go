package envoyfilter

import (
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// The server refuses to start with a redis:// fleet URL at a Redis Cluster
// node, saying which URL to use; the cluster's redis+cluster:// URL starts.
func TestServerRefusesSingleNodeURLAtClusterNode(t *testing.T) {
	cl := redisproc.StartCluster(t, redisproc.ClusterOptions{Masters: 3})
	const routes = "routes:\n  - {name: a, upstreams: [{url: 'http://a:1'}]}\n"
	cfg, err := ParseConfig([]byte("fleet: {url: 'redis://" + cl.Nodes[0].Addr() + "/0'}\n" + routes))
	if err != nil {
		t.Fatal(err)
	}
	if s, err := NewServer(cfg, Options{}); err == nil || !strings.Contains(err.Error(), "redis+cluster://") {
		if s != nil {
			s.closeFleets()
		}
		t.Fatalf("NewServer with redis:// at a cluster node: %v, want a refusal naming redis+cluster://", err)
	}
	cfg, err = ParseConfig([]byte("fleet: {url: '" + cl.URL() + "'}\n" + routes))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(cfg, Options{})
	if err != nil {
		t.Fatalf("NewServer with the cluster URL: %v", err)
	}
	s.closeFleets()
}
