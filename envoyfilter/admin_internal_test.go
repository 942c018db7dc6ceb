package envoyfilter

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/core/fleetstore"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmhedge/llmhedge/internal/testkit/loopclock"
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

// fleetServer is a Server of route chat on a fleet at the Redis of url,
// on a loop clock, whose fleet's loop one request to the route started.
func fleetServer(t *testing.T, url string, opts Options) (*Server, *loopclock.Clock) {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}]}`)
	}))
	t.Cleanup(up.Close)
	cfg, err := ParseConfig([]byte("fleet: {url: '" + url + "'}\nroutes:\n  - {name: chat, upstreams: [{url: '" + up.URL + "'}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	loop := loopclock.New(core.SystemClock{}, cfg.Fleet)
	opts.Clock = loop
	s, err := NewServer(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.closeFleets)
	if len(s.fleets) != 1 {
		t.Fatalf("%d fleet clients, want 1", len(s.fleets))
	}
	// The route's first request attaches it to the fleet and starts the
	// fleet's loop.
	routes := s.current.Load().table.routes
	if len(routes) != 1 {
		t.Fatalf("%d routes, want 1", len(routes))
	}
	rec := httptest.NewRecorder()
	routes[0].hedger.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`)))
	if rec.Code != 200 {
		t.Fatalf("request to route chat: status %d, want 200", rec.Code)
	}
	return s, loop
}

// The server's heartbeat names it: llmhedge-ctl status lists kind envoy.
func TestFleetHeartbeatNamesTheEnvoyServer(t *testing.T) {
	redisSrv := redisproc.Start(t, redisproc.Options{})
	s, loop := fleetServer(t, redisSrv.URL(), Options{})
	loop.Round(t) // writes the heartbeat
	for _, f := range s.fleets {
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
	zcore, logs := observer.New(zapcore.InfoLevel)
	s, loop := fleetServer(t, redisSrv.URL(), Options{Logger: zap.New(zcore)})
	loop.Round(t) // the first round reads the policy
	loop.Round(t)
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
