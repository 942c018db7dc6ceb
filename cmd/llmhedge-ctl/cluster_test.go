package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/redis/go-redis/v9"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/fleetredis"
	"github.com/llmhedge/llmhedge/internal/testkit/loopclock"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// On a real Redis Cluster (3 masters): pause and resume write the switch
// keys through the cluster client, and status finds the switches and the
// heartbeats on every master (SCAN per master), with switches of routes
// whose slots are on different masters.
func TestClusterPauseResumeAndStatus(t *testing.T) {
	c := redisproc.StartCluster(t, redisproc.ClusterOptions{})
	ctx := context.Background()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), DisableIdentity: true})
	t.Cleanup(func() { rdb.Close() })
	// Routes whose switches are on at least two masters.
	var routes []string
	masters := map[string]bool{}
	for _, r := range []string{"chat", "embed", "claude", "gpt", "mini", "batch"} {
		routes = append(routes, r)
		masters[c.MasterFor(fleetstore.SwitchKey("llmhedge:", r)).Addr()] = true
		if len(masters) >= 2 && len(routes) >= 3 {
			break
		}
	}
	if len(masters) < 2 {
		t.Fatalf("switch keys of %v all on one master, want two at least", routes)
	}
	for _, r := range routes {
		if code, _, errOut := ctl(t, "-fleet", c.URL(), "pause", "-route", r); code != exitOK {
			t.Fatalf("pause -route %s on the cluster: exit %d: %s", r, code, errOut)
		}
	}
	if code, _, errOut := ctl(t, "-fleet", c.URL(), "set-delay", "-route", "*", "300ms"); code != exitOK {
		t.Fatalf("set-delay -route * on the cluster: exit %d: %s", code, errOut)
	}
	for _, r := range routes {
		if v, err := rdb.Get(ctx, fleetstore.SwitchKey("llmhedge:", r)).Result(); err != nil || v != `{"paused":true}` {
			t.Errorf("switch of %s = %q (%v), want {\"paused\":true}", r, v, err)
		}
	}
	for _, id := range []string{"r1", "r2"} {
		if err := rdb.Set(ctx, fleetstore.ReplicaKey("llmhedge:", id), `{"id":"`+id+`","kind":"caddy","routes":[]}`, fleetstore.HeartbeatTTL).Err(); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := ctl(t, "-fleet", c.URL(), "status")
	if code != exitOK {
		t.Fatalf("status on the cluster: exit %d: %s", code, errOut)
	}
	for _, want := range append([]string{"2 live replicas", "replica r1", "replica r2", "* (every route)  delay 300ms"}, routes...) {
		if !strings.Contains(out, want) {
			t.Errorf("status on the cluster lacks %q:\n%s", want, out)
		}
	}

	// A replica on the cluster applies what the command wrote: the
	// route's pause and every route's delay (two slots).
	h, loop := clusterReplica(t, c.URL(), routes[0])
	if got, want := h.SwitchInForce(), (fleetstore.Switch{Paused: true, Delay: 300 * time.Millisecond}); got != want {
		t.Errorf("replica's switch for %s after pause and set-delay *: %v, want %v", routes[0], got, want)
	}
	if code, _, errOut := ctl(t, "-fleet", c.URL(), "resume", "-route", routes[0]); code != exitOK {
		t.Fatalf("resume on the cluster: exit %d: %s", code, errOut)
	}
	if n, err := rdb.Exists(ctx, fleetstore.SwitchKey("llmhedge:", routes[0])).Result(); err != nil || n != 0 {
		t.Errorf("switch of %s after resume: exists %d (%v), want deleted", routes[0], n, err)
	}
	loop.Round(t) // the replica's next sync
	if got, want := h.SwitchInForce(), (fleetstore.Switch{Delay: 300 * time.Millisecond}); got != want {
		t.Errorf("replica's switch for %s after resume: %v, want %v", routes[0], got, want)
	}
}

// clusterReplica is an engine replica of route on the cluster at url,
// attached to its fleet by one request (its first sync reads the
// switches), and its fleet's clock, on which the test runs the fleet's
// sync loop (round).
func clusterReplica(t *testing.T, url, route string) (*core.Hedger, *loopclock.Clock) {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}]}`)
	}))
	t.Cleanup(up.Close)
	cfg := config.Config{Route: route, Upstreams: []config.UpstreamConfig{{Name: "A", URL: up.URL}},
		Fleet: config.FleetConfig{URL: url, Timeout: config.Duration(2 * time.Second)}}
	client, err := fleetredis.New(cfg.Fleet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	loop := loopclock.New(stoppedClock{}, cfg.Fleet)
	fleet := core.NewFleet(client, cfg.Fleet, core.FleetOptions{Clock: loop})
	t.Cleanup(fleet.Close)
	h, err := core.New(cfg, core.Options{Fleet: fleet})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`)))
	if rec.Code != 200 {
		t.Fatalf("request through the cluster replica: status %d, want 200", rec.Code)
	}
	return h, loop
}

// stoppedClock is the system's time with timers that never fire.
type stoppedClock struct{}

func (stoppedClock) Now() time.Time { return time.Now() }

func (stoppedClock) AfterFunc(time.Duration, func()) core.Timer { return stoppedTimer{} }

type stoppedTimer struct{}

func (stoppedTimer) Stop() bool { return true }
