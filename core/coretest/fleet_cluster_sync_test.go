package coretest

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// The route-level fleet on a real Redis Cluster (3 masters): for two
// routes whose hash tags land on different masters, the sync (budget
// lease, spend reservation, tenant counters, the heartbeat), the kill
// switch (the route's and every route's, each on its own slot), and a
// cool-down published by one replica and followed by the other all work:
// no operation fails (before the keys had hash tags, every sync failed
// with CROSSSLOT and none of it applied).
func TestFleetClusterRouteSync(t *testing.T) {
	cl := redisproc.StartCluster(t, redisproc.ClusterOptions{Masters: 3})
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("X-Cool") != "" {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(429)
			return true
		}
		return stall(w, r)
	})
	// Two routes on different masters, neither on the master of the
	// switch of every route when that can be had.
	allMaster := cl.MasterFor(fleetstore.SwitchKey("llmhedge:", fleetstore.SwitchAllRoutes)).Addr()
	var routes []string
	masters := map[string]string{} // route -> master
	for i := 0; i < 100 && len(routes) < 2; i++ {
		r := "route" + strconv.Itoa(i)
		m := cl.MasterFor(fleetstore.SwitchKey("llmhedge:", r)).Addr()
		if m == allMaster || (len(routes) == 1 && masters[routes[0]] == m) {
			continue
		}
		routes = append(routes, r)
		masters[r] = m
	}
	if len(routes) != 2 {
		t.Fatalf("found routes %v on masters %v, want two on two masters other than %s's", routes, masters, allMaster)
	}
	perHedge := int64(len(chatBody) / 4)
	tenant := map[string]string{"X-Tenant": "acme"}
	members := map[string][2]*member{}
	for _, route := range routes {
		cfg := fleet2Config(cl.URL(), ups)
		cfg.Route = route
		cfg.Budget = config.BudgetConfig{Ratio: 0.5, Burst: 4, SpendCapTokensPerHour: 100 * perHedge,
			TenantHeader: "X-Tenant", TenantTokensPerMinute: 100 * perHedge}
		pair := [2]*member{newMember(t, cfg, nil, nil), newMember(t, cfg, nil, nil)}
		members[route] = pair
		alternate(t, 2, tenant, pair[0], pair[1])
		h0, _ := pair[0].reports.snapshot()
		h1, _ := pair[1].reports.snapshot()
		if h0+h1 == 0 {
			t.Errorf("%s: no hedge in 4 requests with a budget of 4, want some", route)
		}
		prefix := "llmhedge:{r:" + route + "}:"
		for _, pattern := range []string{prefix + "budget", prefix + "spend:*", prefix + "tenant:*"} {
			keys, err := cl.Do(masters[route], "KEYS", pattern)
			if err != nil || strings.TrimSpace(keys) == "" {
				t.Errorf("%s: no key %s on its master %s (%v), want the sync's", route, pattern, masters[route], err)
			}
		}
	}
	if hb, err := cl.Do(cl.MasterFor(fleetstore.ReplicaKey("llmhedge:", "x")).Addr(), "KEYS", "llmhedge:{fleet}:replica:*"); err != nil || len(strings.Fields(hb)) != 4 {
		t.Errorf("heartbeats on the {fleet} master: %q (%v), want 4", hb, err)
	}

	// The kill switch: route 0's own, then every route's.
	set := func(route string, s fleetstore.Switch) {
		key := fleetstore.SwitchKey("llmhedge:", route)
		if _, err := cl.Do(cl.MasterFor(key).Addr(), "SET", key, fleetstore.EncodeSwitch(s)); err != nil {
			t.Fatal(err)
		}
	}
	syncAll := func() {
		for _, route := range routes {
			members[route][0].loop.Round(t)
			members[route][1].loop.Round(t)
		}
	}
	set(routes[0], fleetstore.Switch{Paused: true})
	syncAll()
	for i, m := range members[routes[0]] {
		if got := m.hedger.SwitchInForce(); !got.Paused {
			t.Errorf("%s replica %d: switch %v after its route's pause, want paused", routes[0], i, got)
		}
	}
	if got := members[routes[1]][0].hedger.SwitchInForce(); got.Paused {
		t.Errorf("%s: switch %v with only %s paused, want on", routes[1], got, routes[0])
	}
	set(fleetstore.SwitchAllRoutes, fleetstore.Switch{Paused: true})
	syncAll()
	for _, route := range routes {
		m := members[route][1]
		_, before := m.reports.snapshot()
		m.do(t, nil)
		if _, after := m.reports.snapshot(); after[core.DenyPaused] != before[core.DenyPaused]+1 {
			t.Errorf("%s: paused denials %d -> %d after every route's pause, want one more", route, before[core.DenyPaused], after[core.DenyPaused])
		}
	}
	set(fleetstore.SwitchAllRoutes, fleetstore.Switch{})
	set(routes[0], fleetstore.Switch{})
	// Route 1 paused while its replica 0 sees A's 429: no hedge to B can
	// win before the 429 arrives (a winner cancels A, and a cancelled
	// attempt cools nothing).
	set(routes[1], fleetstore.Switch{Paused: true})
	syncAll()

	// A cool-down published on route 1's master reaches the other replica.
	pair := members[routes[1]]
	pair[0].do(t, map[string]string{"X-Cool": "1"})
	set(routes[1], fleetstore.Switch{})
	// The 429 was noted before the answer ended; a round of the loop
	// waits for the background publisher and publishes what is pending.
	pair[0].loop.Round(t)
	health := "llmhedge:{r:" + routes[1] + "}:health"
	if got, err := cl.Do(cl.MasterFor(health).Addr(), "HEXISTS", health, "cool:A"); err != nil || strings.TrimSpace(got) != "1" {
		t.Fatalf("%s: no cool:A in %s after A's 429 and a sync (%q, %v); the publisher's Redis errors %q, its last first attempt %q, A's requests %d",
			routes[1], health, got, err, pair[0].errs.all(), pair[0].reports.lastFirst(), ups.aCount.Load())
	}
	pair[1].loop.Round(t)
	pair[1].do(t, nil)
	if got := pair[1].reports.lastFirst(); got != "B" {
		t.Errorf("%s: the other replica's first attempt after A's 429 went to %q, want B (the fleet's cool-down)", routes[1], got)
	}
	for _, route := range routes {
		for i, m := range members[route] {
			if errs := m.errs.all(); len(errs) != 0 || !m.fleet.Up() {
				t.Errorf("%s replica %d: Redis errors %q (NOSCRIPT aside), fleet up %v; want none on the cluster", route, i, errs, m.fleet.Up())
			}
		}
	}
}
