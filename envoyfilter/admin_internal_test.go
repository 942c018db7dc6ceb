package envoyfilter

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/core/config"
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

// loopClock is the server's clock, on which the test runs its fleet's
// sync loop by hand: the loop's timer (the one armed with the fleet's
// sync_interval) never fires by itself, and round runs its callback, one
// whole round of the loop as a tick of the real loop would, in the test's
// goroutine. Now and every other timer (the hedgers' too) are base's. One
// fleet per loopClock.
type loopClock struct {
	base     core.Clock
	interval time.Duration // the fleet's sync_interval

	mu    sync.Mutex
	armed *loopTimer // the loop's pending timer (nil: not armed)
	clash bool       // a second timer of sync_interval was armed beside a pending one
}

// loopTimer is the loop's pending timer on a loopClock.
type loopTimer struct {
	c *loopClock
	f func()
}

// newLoopClock is a loopClock over base for a fleet of cfg (its
// sync_interval, defaults applied).
func newLoopClock(base core.Clock, cfg config.FleetConfig) *loopClock {
	return &loopClock{base: base, interval: time.Duration(cfg.WithDefaults().SyncInterval)}
}

func (c *loopClock) Now() time.Time { return c.base.Now() }

func (c *loopClock) AfterFunc(d time.Duration, f func()) core.Timer {
	if d != c.interval {
		return c.base.AfterFunc(d, f)
	}
	t := &loopTimer{c: c, f: f}
	c.mu.Lock()
	if c.armed != nil {
		c.clash = true
	}
	c.armed = t
	c.mu.Unlock()
	return t
}

// Stop forgets the timer if it is still pending.
func (t *loopTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.c.armed == t {
		t.c.armed = nil
		return true
	}
	return false
}

// round runs one round of the fleet's sync loop now (the callback the
// loop armed, which arms the next) and returns when it is done. It fails
// the test when the loop is not armed: no request attached a route to the
// fleet yet (the loop starts with a route's first request), or the fleet
// is closed.
func (c *loopClock) round(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	armed, clash := c.armed, c.clash
	c.armed = nil
	c.mu.Unlock()
	if clash {
		t.Fatalf("two timers of the sync interval %v were armed at once on the server's loopClock: another timer has the loop's duration", c.interval)
	}
	if armed == nil {
		t.Fatalf("the fleet's sync loop is not armed (no timer of its sync interval %v): no request attached a route to the fleet yet, or the fleet is closed", c.interval)
	}
	armed.f()
}

// fleetServer is a Server of route chat on a fleet at the Redis of url,
// on a loopClock, whose fleet's loop one request to the route started.
func fleetServer(t *testing.T, url string, opts Options) (*Server, *loopClock) {
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
	loop := newLoopClock(core.SystemClock{}, cfg.Fleet)
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
	loop.round(t) // writes the heartbeat
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
	loop.round(t) // the first round reads the policy
	loop.round(t)
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
