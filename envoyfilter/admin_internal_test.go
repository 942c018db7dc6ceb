package envoyfilter

import (
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

func TestIsLoopback(t *testing.T) {
	for _, tc := range []struct {
		ip   string
		want bool
	}{{"127.0.0.1", true}, {"::1", true}, {"0.0.0.0", false}, {"::", false}, {"10.0.0.5", false}} {
		if got := isLoopback(&net.TCPAddr{IP: net.ParseIP(tc.ip), Port: 9902}); got != tc.want {
			t.Errorf("isLoopback(%s) = %v, want %v", tc.ip, got, tc.want)
		}
	}
}

// The server's heartbeat names it: llmhedge-ctl status lists kind envoy.
func TestFleetHeartbeatNamesTheEnvoyServer(t *testing.T) {
	redisSrv := redisproc.Start(t, redisproc.Options{})
	cfg, err := ParseConfig([]byte("fleet: {url: '" + redisSrv.URL() + "'}\nroutes:\n  - {name: chat, upstreams: [{url: 'http://127.0.0.1:9'}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.closeFleets()
	if len(s.fleets) != 1 {
		t.Fatalf("%d fleet clients, want 1", len(s.fleets))
	}
	for _, f := range s.fleets {
		f.fleet.SyncNow() // writes the heartbeat
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		v, err := f.client.Do(ctx, "GET", fleetstore.ReplicaKey("llmhedge:", f.fleet.ReplicaID()))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		var status fleetstore.ReplicaStatus
		if err := json.Unmarshal([]byte(v.Str), &status); err != nil {
			t.Fatalf("heartbeat %q: %v", v.Str, err)
		}
		if status.Kind != "envoy" {
			t.Errorf("heartbeat kind = %q, want envoy", status.Kind)
		}
	}
}

// A Redis that may evict fleet keys: the server's fleet logs one warning
// naming the policy, and its exporter serves
// llm_hedge_fleet_eviction_policy_safe 0.
func TestFleetWarnsAboutAnEvictingRedis(t *testing.T) {
	redisSrv := redisproc.Start(t, redisproc.Options{Args: []string{"--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"}})
	cfg, err := ParseConfig([]byte("fleet: {url: '" + redisSrv.URL() + "'}\nroutes:\n  - {name: chat, upstreams: [{url: 'http://127.0.0.1:9'}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	zcore, logs := observer.New(zapcore.InfoLevel)
	s, err := NewServer(cfg, Options{Logger: zap.New(zcore)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.closeFleets()
	for _, f := range s.fleets {
		f.fleet.SyncNow()
		f.fleet.SyncNow()
	}
	warnings := logs.FilterMessageSnippet("maxmemory-policy is volatile-lru").All()
	if len(warnings) != 1 || warnings[0].Level != zapcore.WarnLevel {
		t.Errorf("policy lines %v, want one warning", warnings)
	}
	families, err := s.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range families {
		if mf.GetName() != "llm_hedge_fleet_eviction_policy_safe" {
			continue
		}
		for _, m := range mf.GetMetric() {
			found = true
			if v := m.GetGauge().GetValue(); v != 0 {
				t.Errorf("llm_hedge_fleet_eviction_policy_safe = %v, want 0 (volatile-lru)", v)
			}
		}
	}
	if !found {
		t.Error("no llm_hedge_fleet_eviction_policy_safe in the scrape")
	}
}
