package coretest

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// Defect 8: four replicas bursting hedges at once against a spend cap of
// ten hedges. Each replica spends only what it reserved in Redis, and the
// reservations never exceed the cap while the hour's key lives: the fleet
// admits at most ten hedges (before, each replica admitted up to the cap
// between two syncs: 40). The burst runs concurrently with each
// replica's syncs.
func TestFleetSpendCapBurstAcrossReplicas(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool { return stall(w, r) })
	perHedge := int64(len(chatBody) / 4)
	const replicas, perReplica, workers, capHedges = 4, 40, 4, 10
	limit := capHedges*perHedge + perHedge/2
	cfg := fleet2Config(redis.URL(), ups)
	cfg.Budget = config.BudgetConfig{Ratio: -1, MaxConcurrentHedges: -1, SpendCapTokensPerHour: limit}
	members := make([]*member, replicas)
	for i := range members {
		members[i] = newMember(t, cfg, nil, nil)
	}
	var wg sync.WaitGroup
	for _, m := range members {
		m := m
		sent := make(chan struct{}, perReplica)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < perReplica/workers; i++ {
					if code := m.do(t, nil); code != 200 {
						t.Errorf("status %d, want 200", code)
					}
					sent <- struct{}{}
				}
			}()
		}
		// This replica's loop: a sync after every fourth request, while
		// the requests run.
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= perReplica; i++ {
				<-sent
				if i%4 == 0 {
					m.loop.Round(t)
				}
			}
		}()
	}
	wg.Wait()
	for _, m := range members {
		m.loop.Round(t)
	}
	hedges := 0
	denials := 0
	for _, m := range members {
		h, d := m.reports.snapshot()
		hedges += h
		denials += d[core.DenySpendCap]
	}
	spent := int64(hedges) * perHedge
	t.Logf("%d replicas × %d requests, cap %d tokens (%d hedges): %d hedges admitted (%d tokens), %d spend_cap denials",
		replicas, perReplica, limit, capHedges, hedges, spent, denials)
	if spent > limit {
		t.Errorf("admitted spend = %d tokens (%d hedges), want at most the cap %d (%d hedges): the reservations overshot",
			spent, hedges, limit, capHedges)
	}
	if hedges < capHedges/2 {
		t.Errorf("admitted hedges = %d, want about %d: the reservations starve the cap", hedges, capHedges)
	}
	// The fleet's record: reserved within the cap, spent = what was admitted.
	keys := redisArray(t, redis, "KEYS", "llmhedge:{r:fleet}:spend:*")
	if len(keys) != 1 {
		t.Fatalf("spend keys %v, want one", keys)
	}
	raw := redisDo(t, redis, "GET", keys[0]).Str
	var reserved, recorded int64
	if f := strings.Fields(raw); len(f) == 2 {
		reserved, _ = strconv.ParseInt(f[0], 10, 64)
		recorded, _ = strconv.ParseInt(f[1], 10, 64)
	}
	if reserved > limit || recorded != spent {
		t.Errorf("spend key %q: reserved %d, spent %d; want reserved ≤ %d and spent %d", raw, reserved, recorded, limit, spent)
	}
}

// Defect 9: the spend hour and the tenant minute are Redis', not the
// replicas'. Replica B's clock (its hedger's and its fleet's) is an hour
// ahead: it still counts into the fleet's hour and minute, so the two
// share one cap instead of one each. Keys are named by Redis' TIME.
func TestFleetCapsCountOnRedisClock(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool { return stall(w, r) })
	perHedge := int64(len(chatBody) / 4)
	ahead := &steppedClock{}
	ahead.advance(time.Hour)
	const capHedges = 4
	run := func(route string, budget config.BudgetConfig, hdr map[string]string) (int, int) {
		cfg := fleet2Config(redis.URL(), ups)
		cfg.Route = route
		cfg.Budget = budget
		a := newMember(t, cfg, nil, nil)
		b := newMemberClocks(t, cfg, ahead, skewedClock{time.Hour}, nil)
		alternate(t, 3*capHedges, hdr, a, b)
		ha, _ := a.reports.snapshot()
		hb, _ := b.reports.snapshot()
		return ha, hb
	}
	// Keys named by a minute or an hour of Redis' clock (the test's reads
	// come after the replicas' writes: the window may have turned since).
	redisNow := func() time.Time {
		tm := redisArray(t, redis, "TIME")
		sec, _ := strconv.ParseInt(tm[0], 10, 64)
		return time.Unix(sec, 0)
	}
	window := func(key string, at int) int64 {
		parts := strings.Split(key, ":")
		n, _ := strconv.ParseInt(parts[at], 10, 64)
		return n
	}

	ha, hb := run("spend", config.BudgetConfig{Ratio: -1, SpendCapTokensPerHour: capHedges*perHedge + perHedge/2}, nil)
	hour := redisNow().Unix() / 3600
	keys := redisArray(t, redis, "KEYS", "llmhedge:{r:spend}:spend:*")
	if len(keys) == 0 || len(keys) > 2 {
		t.Errorf("spend keys %v, want the hour's (two if Redis' hour turned during the test)", keys)
	}
	for _, k := range keys {
		if h := window(k, 4); h != hour && h != hour-1 {
			t.Errorf("spend key %q: hour %d, want Redis' hour %d", k, h, hour)
		}
	}
	if len(keys) == 1 && ha+hb != capHedges {
		t.Errorf("hedges under a spend cap of %d with replica B an hour ahead = %d (A %d, B %d), want %d: one cap for the fleet",
			capHedges, ha+hb, ha, hb, capHedges)
	}
	if hb == 0 {
		t.Errorf("replica B (an hour ahead) hedged %d times, want its share", hb)
	}

	ha, hb = run("tenant", config.BudgetConfig{Ratio: -1, TenantHeader: "X-Tenant", TenantTokensPerMinute: capHedges*perHedge + perHedge/2},
		map[string]string{"X-Tenant": "acme"})
	minute := redisNow().Unix() / 60
	keys = redisArray(t, redis, "KEYS", "llmhedge:{r:tenant}:tenant:*")
	if len(keys) == 0 || len(keys) > 2 {
		t.Errorf("tenant keys %v, want the minute's (two if Redis' minute turned during the test)", keys)
	}
	for _, k := range keys {
		if m := window(k, 4); m != minute && m != minute-1 {
			t.Errorf("tenant key %q: minute %d, want Redis' minute %d", k, m, minute)
		}
	}
	// The tenant cap's documented overshoot: what the other replica admits
	// within one sync interval (here one request per round).
	if len(keys) == 1 && (ha+hb < capHedges || ha+hb > capHedges+1) {
		t.Errorf("hedges under a tenant cap of %d with replica B an hour ahead = %d (A %d, B %d), want %d or %d: one cap for the fleet",
			capHedges, ha+hb, ha, hb, capHedges, capHedges+1)
	}
	if hb == 0 {
		t.Errorf("replica B (an hour ahead) hedged %d times for the tenant, want its share", hb)
	}
}

// The spend cap's bound when Redis loses the hour's key (here FLUSHALL
// mid-hour): the hour starts over, so the fleet may spend up to twice the
// cap plus one reservation per replica (cap / 8 or one hedge: one hedge
// here), never more.
func TestFleetSpendCapAfterRedisLostTheKey(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{})
	ups := newTwoUpstreams(t, func(n int64, w http.ResponseWriter, r *http.Request) bool { return stall(w, r) })
	perHedge := int64(len(chatBody) / 4)
	const capHedges, replicas = 10, 2
	cfg := fleet2Config(redis.URL(), ups)
	cfg.Budget = config.BudgetConfig{Ratio: -1, SpendCapTokensPerHour: capHedges*perHedge + perHedge/2}
	r1, r2 := newMember(t, cfg, nil, nil), newMember(t, cfg, nil, nil)
	alternate(t, 3*capHedges, nil, r1, r2)
	h1, _ := r1.reports.snapshot()
	h2, _ := r2.reports.snapshot()
	before := h1 + h2
	redisDo(t, redis, "FLUSHALL")
	alternate(t, 3*capHedges, nil, r1, r2)
	h1, _ = r1.reports.snapshot()
	h2, _ = r2.reports.snapshot()
	bound := 2*capHedges + replicas
	t.Logf("cap %d hedges: %d hedges before FLUSHALL, %d in all (bound %d)", capHedges, before, h1+h2, bound)
	if before > capHedges {
		t.Errorf("hedges before the key was lost = %d, want at most the cap %d", before, capHedges)
	}
	if h1+h2 > bound {
		t.Errorf("hedges in the hour with its key lost once = %d, want at most twice the cap plus a reservation per replica = %d", h1+h2, bound)
	}
}
