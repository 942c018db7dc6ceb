package caddymodule

import (
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// Provision refuses a redis:// fleet URL that points at a Redis Cluster
// node, saying which URL to use; the cluster's redis+cluster:// URL
// provisions.
func TestProvisionRefusesSingleNodeURLAtClusterNode(t *testing.T) {
	cl := redisproc.StartCluster(t, redisproc.ClusterOptions{Masters: 3})
	config := `{"route":"cluster-check","upstreams":[{"url":"http://127.0.0.1:9001"}],"fleet":{"url":"URL"}}`
	_, err := provisionJSON(t, newCaddyContext(t), strings.Replace(config, "URL", "redis://"+cl.Nodes[0].Addr()+"/0", 1))
	if err == nil || !strings.Contains(err.Error(), "redis+cluster://") {
		t.Fatalf("Provision with redis:// at a cluster node: %v, want a refusal naming redis+cluster://", err)
	}
	if _, err := provisionJSON(t, newCaddyContext(t), strings.Replace(config, "URL", cl.URL(), 1)); err != nil {
		t.Fatalf("Provision with the cluster URL: %v", err)
	}
}
