package core

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// slowPrimaryRequest runs one request whose primary never produces output
// before the delay; it returns how many attempts were sent and the report.
func slowPrimaryRequest(t *testing.T, hs *harness, r *harnessRequest) (*Report, int) {
	t.Helper()
	hs.clock.drainArmed() // earlier requests' timers must not count as this one's
	before := hs.tr.count()
	out := hs.serve(r.build())
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(roleChunk)
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(hs.h.CurrentDelay())
	winner := a
	if r.expectHedge {
		winner = hs.tr.next(t)
		winner.respond(200, "text/event-stream")
	}
	winner.write(tokenChunk("t"))
	winner.end()
	<-out
	rep := <-hs.reports
	return rep, hs.tr.count() - before
}

type harnessRequest struct {
	tenant      string
	expectHedge bool
}

func (r *harnessRequest) build() *http.Request {
	req := chatRequest("")
	if r.tenant != "" {
		req.Header.Set("X-Tenant", r.tenant)
	}
	return req
}

// The extra-load bucket allows `burst` hedges, then one per 1/ratio requests.
func TestBudgetExhaustion(t *testing.T) {
	cfg := testConfig()
	cfg.Budget.Ratio = 0.5
	cfg.Budget.Burst = 1
	hs := newHarness(t, cfg)
	rep, n := slowPrimaryRequest(t, hs, &harnessRequest{expectHedge: true})
	if n != 2 {
		t.Fatalf("first request: n = %v, want 2", n)
	} else if rep.HedgesStarted != 1 {
		t.Fatalf("first request: rep.HedgesStarted = %v, want 1", rep.HedgesStarted)
	}
	// The bucket is empty (1 + 0.5 deposited - 1 taken = 0.5 < 1).
	rep, n = slowPrimaryRequest(t, hs, &harnessRequest{})
	if n != 1 {
		t.Fatalf("second request: n = %v, want 1", n)
	} else if len(rep.Denials) != 1 {
		t.Fatalf("second request: len(rep.Denials) = %v, want 1", len(rep.Denials))
	} else if rep.Denials[0] != DenyBudget {
		t.Fatalf("second request: rep.Denials[0] = %v, want %v", rep.Denials[0], DenyBudget)
	}
	// Another request's deposit refills it to 1.
	if _, n = slowPrimaryRequest(t, hs, &harnessRequest{expectHedge: true}); n != 2 {
		t.Fatalf("third request: %d attempts", n)
	}
}

// A tenant's extra prompt tokens per minute are capped.
func TestTenantCap(t *testing.T) {
	cfg := testConfig()
	cfg.Budget.TenantHeader = "X-Tenant"
	cfg.Budget.TenantTokensPerMinute = 25 // one hedge of this ~76-byte body (19 tokens)
	hs := newHarness(t, cfg)
	if _, n := slowPrimaryRequest(t, hs, &harnessRequest{tenant: "t1", expectHedge: true}); n != 2 {
		t.Fatalf("first: %d attempts", n)
	}
	rep, n := slowPrimaryRequest(t, hs, &harnessRequest{tenant: "t1"})
	if n != 1 {
		t.Fatalf("second: n = %v, want 1", n)
	} else if rep.Denials[0] != DenyTenant {
		t.Fatalf("second: rep.Denials[0] = %v, want %v", rep.Denials[0], DenyTenant)
	}
	if _, n := slowPrimaryRequest(t, hs, &harnessRequest{tenant: "t2", expectHedge: true}); n != 2 {
		t.Fatalf("other tenant: %d attempts", n)
	}
	hs.clock.Advance(time.Minute)
	if _, n := slowPrimaryRequest(t, hs, &harnessRequest{tenant: "t1", expectHedge: true}); n != 2 {
		t.Fatalf("next minute: %d attempts", n)
	}
}

// A 429 with Retry-After cools its upstream down: the retry and the next
// requests go to the other upstream until the time passes.
func TestCoolDownAfter429(t *testing.T) {
	hs := newHarness(t, testConfig())
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(429, "application/json", "Retry-After", "2")
	a.write(`{"error":{"message":"rate limited"}}`)
	a.end()
	b := hs.tr.next(t)
	b.respond(200, "text/event-stream")
	b.write(tokenChunk("x"))
	b.end()
	<-out
	<-hs.reports
	next := func() string {
		out := hs.serve(chatRequest(""))
		c := hs.tr.next(t)
		c.respond(200, "text/event-stream")
		c.write(tokenChunk("x"))
		c.end()
		<-out
		<-hs.reports
		return c.req.URL.Host
	}
	if host := next(); host != "b.test" {
		t.Fatalf("during cool-down the primary went to %s", host)
	}
	hs.clock.Advance(2 * time.Second)
	if host := next(); host != "a.test" {
		t.Fatalf("after cool-down the primary went to %s", host)
	}
}

// A high recent 429/503 rate stops hedging altogether.
func TestOverloadStopsHedging(t *testing.T) {
	cfg := testConfig()
	cfg.Budget.OverloadWindow = 4
	cfg.Budget.OverloadRate = 0.5
	cfg.Budget.CoolDown = config.Duration(time.Millisecond)
	hs := newHarness(t, cfg)
	for i := 0; i < 4; i++ {
		out := hs.serve(chatRequest(""))
		for j := 0; j < 2; j++ {
			c := hs.tr.next(t)
			c.respond(503, "application/json")
			c.write(`{"error":{"message":"overloaded"}}`)
			c.end()
		}
		<-out
		<-hs.reports
		hs.clock.Advance(time.Second)
	}
	rep, n := slowPrimaryRequest(t, hs, &harnessRequest{})
	if n != 1 {
		t.Fatalf("n = %v, want 1", n)
	} else if len(rep.Denials) == 0 {
		t.Fatalf("len(rep.Denials) = 0, want != 0")
	} else if rep.Denials[0] != DenyOverload {
		t.Fatalf("rep.Denials[0] = %v, want %v", rep.Denials[0], DenyOverload)
	}
}

// Consecutive failures open an upstream's circuit; it is skipped until
// breaker_open passes.
func TestCircuitBreakerOpens(t *testing.T) {
	cfg := testConfig()
	cfg.Budget.BreakerFailures = 2
	cfg.Budget.BreakerOpen = config.Duration(5 * time.Second)
	cfg.MaxAttempts = 1
	hs := newHarness(t, cfg)
	for i := 0; i < 2; i++ {
		out := hs.serve(chatRequest(""))
		c := hs.tr.next(t)
		if c.req.URL.Host != "a.test" {
			t.Fatalf("request %d went to %s", i, c.req.URL.Host)
		}
		c.respond(500, "application/json")
		c.end()
		<-out
		<-hs.reports
	}
	out := hs.serve(chatRequest(""))
	c := hs.tr.next(t)
	if c.req.URL.Host != "b.test" {
		t.Fatalf("open circuit: went to %s", c.req.URL.Host)
	}
	c.respond(200, "text/event-stream")
	c.write(tokenChunk("x"))
	c.end()
	<-out
	<-hs.reports
	if !strings.Contains(hs.h.Config().Upstreams[0].Name, "A") {
		t.Fatal("names")
	}
}

// The adaptive delay follows the primary's TTFT quantile within [min, max],
// using the fixed delay until enough samples exist.
func TestAdaptiveDelayEstimator(t *testing.T) {
	cfg := testConfig()
	cfg.Delay = config.DelayConfig{Mode: config.DelayAdaptive, Fixed: config.Duration(time.Second), Quantile: 0.9, Min: config.Duration(10 * time.Millisecond), Max: config.Duration(500 * time.Millisecond), Window: 100, MinSamples: 10}
	cfg = cfg.WithDefaults()
	st := NewState(cfg, newFakeClock())
	if d := hedgeDelay(st, &cfg, 0); d != time.Second {
		t.Fatalf("before samples: %v", d)
	}
	for i := 1; i <= 100; i++ {
		addSample(st.estimators[0], time.Duration(i)*time.Millisecond)
	}
	if d := hedgeDelay(st, &cfg, 0); d != 90*time.Millisecond {
		t.Fatalf("p90 of 1..100ms: %v", d)
	}
	// The window forgets old samples: 100 samples of 2s clamp to max.
	for i := 0; i < 100; i++ {
		addSample(st.estimators[0], 2*time.Second)
	}
	if d := hedgeDelay(st, &cfg, 0); d != 500*time.Millisecond {
		t.Fatalf("clamped: %v", d)
	}
}

// Retry-After accepts seconds and HTTP dates and is capped.
func TestCoolDownFor(t *testing.T) {
	cfg := testConfig().WithDefaults()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		status int
		header string
		want   time.Duration
	}{
		{429, "", time.Second},
		{503, "3", 3 * time.Second},
		{429, now.Add(10 * time.Second).Format(time.RFC1123), 10 * time.Second},
		{429, "99999", time.Minute},
		{429, "garbage", time.Second},
		{500, "5", 0},
	}
	for _, c := range cases {
		if got := coolDownFor(c.status, c.header, now, &cfg.Budget); got != c.want {
			t.Errorf("%d %q: got %v want %v", c.status, c.header, got, c.want)
		}
	}
}

// pickUpstream prefers an available upstream among the least used, then any
// available one, then the least used when none is available.
func TestPickUpstreamPreference(t *testing.T) {
	hs := newHarness(t, testConfig())
	h, now := hs.h, hs.clock.Now()
	cfg := &h.cfg.Budget
	if up, ok := pickUpstream(h, []int{1, 0}, now); up != 1 {
		t.Fatalf("least used: up = %v, want 1", up)
	} else if !ok {
		t.Fatalf("least used: %d %v", up, ok)
	}
	recordFailure(h.state.health[1], now, time.Minute, 0, cfg) // B cools down
	if up, ok := pickUpstream(h, []int{1, 0}, now); up != 0 {
		t.Fatalf("available over least used: up = %v, want 0", up)
	} else if !ok {
		t.Fatalf("available over least used: %d %v", up, ok)
	}
	recordFailure(h.state.health[0], now, time.Minute, 0, cfg) // A too
	if up, ok := pickUpstream(h, []int{1, 0}, now); up != 1 {
		t.Fatalf("none available: up = %v, want 1", up)
	} else if ok {
		t.Fatalf("none available: %d %v", up, ok)
	}
}

// tenantUsed returns the extra prompt tokens charged to tenant in its
// current window.
func tenantUsed(t *tenantBudget, tenant string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w := t.tenants[tenant]; w != nil {
		return w.used
	}
	return 0
}

// A tenant is charged only for hedges that start: a hedge the global
// bucket denies costs the tenant nothing.
func TestTenantNotChargedWhenBucketDenies(t *testing.T) {
	cfg := testConfig()
	cfg.Budget.Ratio = 0.5
	cfg.Budget.Burst = 1
	cfg.Budget.TenantHeader = "X-Tenant"
	cfg.Budget.TenantTokensPerMinute = 25 // one hedge of this body
	hs := newHarness(t, cfg)
	// Another tenant's hedge empties the bucket.
	if _, n := slowPrimaryRequest(t, hs, &harnessRequest{tenant: "other", expectHedge: true}); n != 2 {
		t.Fatalf("first request: %d attempts, want 2", n)
	}
	perHedge := tenantUsed(hs.h.state.tenants, "other")
	rep, n := slowPrimaryRequest(t, hs, &harnessRequest{tenant: "t1"})
	if n != 1 {
		t.Fatalf("empty bucket: n = %v, want 1", n)
	} else if len(rep.Denials) != 1 {
		t.Fatalf("empty bucket: len(rep.Denials) = %v, want 1", len(rep.Denials))
	} else if rep.Denials[0] != DenyBudget {
		t.Fatalf("empty bucket: rep.Denials[0] = %v, want %v", rep.Denials[0], DenyBudget)
	}
	if used := tenantUsed(hs.h.state.tenants, "t1"); used != 0 {
		t.Fatalf("tenant charged %d tokens for a hedge that did not start, want 0", used)
	}
	// The bucket has refilled; t1's whole minute is still there.
	if _, n := slowPrimaryRequest(t, hs, &harnessRequest{tenant: "t1", expectHedge: true}); n != 2 {
		t.Fatalf("after the refill: %d attempts, want 2", n)
	}
	if used := tenantUsed(hs.h.state.tenants, "t1"); used != perHedge {
		t.Fatalf("tenant charged %d tokens for one hedge, want %d", used, perHedge)
	}
}

// A 429 to the caller's own credentials (passed through unchanged) is that
// caller's rate limit: it fails over, but cools the upstream for nobody
// else; with caller_429 route, or when the route sets its own key, it
// cools the upstream for every caller.
func TestCallersOwn429CoolsOnlyThatCaller(t *testing.T) {
	cases := []struct {
		name      string
		caller429 string
		setKey    bool
		wantNext  string
	}{
		{"own key, default", "", false, "a.test"},
		{"own key, caller_429 route", config.Caller429Route, false, "b.test"},
		{"route's key", "", true, "b.test"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Budget.Caller429 = tc.caller429
			if tc.setKey {
				cfg.Upstreams[0].SetHeaders = map[string]string{"Authorization": "Bearer route-key"}
			}
			hs := newHarness(t, cfg)
			alice := chatRequest("")
			alice.Header.Set("Authorization", "Bearer alice")
			out := hs.serve(alice)
			a := hs.tr.next(t)
			a.respond(429, "application/json", "Retry-After", "30")
			a.write(`{"error":{"message":"alice is rate limited"}}`)
			a.end()
			b := hs.tr.next(t)
			if b.req.URL.Host != "b.test" {
				t.Fatalf("alice's retry went to %s, want b.test", b.req.URL.Host)
			}
			b.respond(200, "text/event-stream")
			b.write(tokenChunk("x"))
			b.end()
			<-out
			<-hs.reports
			bob := chatRequest("")
			bob.Header.Set("Authorization", "Bearer bob")
			out = hs.serve(bob)
			c := hs.tr.next(t)
			if c.req.URL.Host != tc.wantNext {
				t.Errorf("bob's request after alice's 429 went to %s, want %s", c.req.URL.Host, tc.wantNext)
			}
			c.respond(200, "text/event-stream")
			c.write(tokenChunk("y"))
			c.end()
			<-out
			<-hs.reports
		})
	}
}

// A local bucket that gets no requests refills by time, burst per
// BudgetRefillTime (one token a second at the defaults); a fleet's lease
// does not (the fleet's bucket refills it).
func TestBucketRefillsByTimeWithoutRequests(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, leased := range []bool{false, true} {
		b := newHedgeBucket(0.1, 10)
		b.tokens = 0
		b.leased = leased
		got := []bool{b.take(t0), b.take(t0.Add(500 * time.Millisecond)), b.take(t0.Add(time.Second)), b.take(t0.Add(time.Second))}
		want := []bool{false, false, !leased, false}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("leased %v: takes at 0, 0.5 s, 1 s and 1 s again = %v, want %v", leased, got, want)
		}
	}
	b := newHedgeBucket(0.1, 10)
	b.take(t0)
	b.tokens = 0
	b.take(t0.Add(time.Hour))
	if b.tokens != 9 {
		t.Errorf("after an hour without requests and one hedge: %v tokens, want 9 (burst 10, less the hedge)", b.tokens)
	}
}
