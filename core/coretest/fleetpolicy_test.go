package coretest

import (
	"strings"
	"sync"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/fleetredis"
	"github.com/llmhedge/llmhedge/internal/testkit/loopclock"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// evictionSink keeps the samples of llm_hedge_fleet_eviction_policy_safe.
type evictionSink struct {
	mu      sync.Mutex
	samples []string
}

func (s *evictionSink) Record(metric int, labels []string, v float64) {
	if metric != core.MetricFleetEvictionSafe {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v == 1 {
		s.samples = append(s.samples, labels[0]+"=1")
	} else {
		s.samples = append(s.samples, labels[0]+"=0")
	}
}

func (s *evictionSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.samples, " ")
}

// evictionFleet is a fleet on a real redis-server started with args, after
// three rounds of its loop (the first reads the policy), which a request
// of a route on it started.
func evictionFleet(t *testing.T, args ...string) (*evictionSink, *lineLog, string) {
	t.Helper()
	redis := redisproc.Start(t, redisproc.Options{Args: args})
	cfg := config.FleetConfig{URL: redis.URL()}
	rcfg := fleet2Config(redis.URL(), newTwoUpstreams(t, nil))
	rcfg.Fleet = cfg
	client, err := fleetredis.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	sink, logs := &evictionSink{}, &lineLog{}
	loop := loopclock.New(&steppedClock{}, cfg)
	f := core.NewFleet(client, cfg, core.FleetOptions{Clock: loop, Metrics: sink, Log: logs.log, Kind: "test"})
	t.Cleanup(f.Close)
	h, err := core.New(rcfg, core.Options{Fleet: f, Clock: hedgeAtOnce{}})
	if err != nil {
		t.Fatal(err)
	}
	m := &member{hedger: h, fleet: f, loop: loop}
	if code := m.do(t, nil); code != 200 {
		t.Fatalf("request: status %d, want 200", code)
	}
	for i := 0; i < 3; i++ {
		loop.Round(t)
	}
	return sink, logs, f.Name()
}

// A Redis that may evict fleet keys: one warning line and one gauge
// sample at 0 over three rounds.
func TestFleetWarnsOnceAboutAnEvictingRedis(t *testing.T) {
	sink, logs, name := evictionFleet(t, "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
	if n := logs.count("maxmemory-policy is allkeys-lru, not noeviction"); n != 1 {
		t.Errorf("%d warnings naming allkeys-lru in %q, want 1", n, logs.lines)
	}
	if n := logs.count("maxmemory"); n != 1 {
		t.Errorf("%d lines about the policy in %q, want 1", n, logs.lines)
	}
	if got, want := sink.String(), name+"=0"; got != want {
		t.Errorf("eviction gauge samples %q, want %q (once)", got, want)
	}
}

// noeviction: nothing said, the gauge at 1.
func TestFleetQuietOnANoEvictionRedis(t *testing.T) {
	sink, logs, name := evictionFleet(t, "--maxmemory", "64mb", "--maxmemory-policy", "noeviction")
	if n := logs.count("maxmemory"); n != 0 {
		t.Errorf("%d lines about the policy in %q, want none", n, logs.lines)
	}
	if got, want := sink.String(), name+"=1"; got != want {
		t.Errorf("eviction gauge samples %q, want %q (once)", got, want)
	}
}

// A Redis that refuses CONFIG (as managed ones do; here renamed away):
// one info line, no gauge, the fleet up.
func TestFleetSaysOnceWhenCONFIGIsRefused(t *testing.T) {
	sink, logs, _ := evictionFleet(t, "--rename-command", "CONFIG", "")
	if n := logs.count("level=info "); n != 1 || logs.count("cannot read Redis maxmemory-policy") != 1 {
		t.Errorf("lines %q, want one info line saying the policy cannot be read", logs.lines)
	}
	if n := logs.count("state=down"); n != 0 {
		t.Errorf("lines %q: the fleet went down, want it up", logs.lines)
	}
	if got := sink.String(); got != "" {
		t.Errorf("eviction gauge samples %q, want none", got)
	}
}
