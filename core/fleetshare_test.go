package core

import (
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/fleetstore"
)

func TestSpendCapOptions(t *testing.T) {
	base := config.Config{Upstreams: []config.UpstreamConfig{{URL: "http://a"}}}
	bad := base
	bad.Budget.SpendCapUSDPerHour = 5
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "prompt_usd_per_million") {
		t.Errorf("spend_cap_usd_per_hour without a price: error %v, want one naming prompt_usd_per_million", err)
	}
	neg := base
	neg.Budget.SpendCapTokensPerHour = -1
	if err := neg.Validate(); err == nil {
		t.Error("negative spend_cap_tokens_per_hour: no error, want one")
	}
	slow := base
	slow.Fleet = config.FleetConfig{URL: "redis://127.0.0.1:1/0", SyncInterval: config.Duration(2 * time.Second)}
	if err := slow.Validate(); err == nil || !strings.Contains(err.Error(), "sync_interval") {
		t.Errorf("sync_interval 2s: error %v, want one naming sync_interval", err)
	}
	for _, c := range []struct {
		tokens     int64
		usd, price float64
		want       int64
	}{
		{0, 0, 0, 0},
		{1000, 0, 0, 1000},
		{0, 1, 2, 500000}, // $1 at $2 per million: 500,000 tokens
		{1000, 1, 2, 1000},
		{900000, 1, 2, 500000},
	} {
		b := config.BudgetConfig{SpendCapTokensPerHour: c.tokens, SpendCapUSDPerHour: c.usd, PromptUSDPerMillion: c.price}
		if got := b.SpendCapTokens(); got != c.want {
			t.Errorf("SpendCapTokens(%d tokens, $%v at $%v) = %d, want %d", c.tokens, c.usd, c.price, got, c.want)
		}
	}
	if d := (config.FleetConfig{URL: "redis://h:1/0"}).WithDefaults().SyncInterval; d != config.Duration(250*time.Millisecond) {
		t.Errorf("default sync_interval = %v, want 250ms", d)
	}
}

func TestSpendTakeHoldsForTheHour(t *testing.T) {
	m := &spendMeter{}
	hour := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
	if ok, _ := spendTake(m, 40, 100, hour); !ok {
		t.Fatal("first 40 of 100: denied, want allowed")
	}
	if ok, _ := spendTake(m, 40, 100, hour.Add(time.Minute)); !ok {
		t.Fatal("80 of 100: denied, want allowed")
	}
	ok, reached := spendTake(m, 40, 100, hour.Add(2*time.Minute))
	if ok || !reached {
		t.Errorf("120 of 100: allowed %v, reached %v; want denied, reached", ok, reached)
	}
	// A smaller hedge that would fit is still denied: the cap holds for
	// the rest of the hour, and it is reached only once.
	ok, reached = spendTake(m, 1, 100, hour.Add(3*time.Minute))
	if ok || reached {
		t.Errorf("after the cap: allowed %v, reached %v; want denied, not reached again", ok, reached)
	}
	if total, capped := spendSnapshot(m, hour.Add(3*time.Minute)); total != 80 || !capped {
		t.Errorf("snapshot = %d, %v; want 80, capped", total, capped)
	}
	if ok, _ := spendTake(m, 40, 100, hour.Add(time.Hour)); !ok {
		t.Error("the next hour: denied, want allowed")
	}
}

func TestLeaseWant(t *testing.T) {
	for _, c := range []struct {
		name            string
		held            float64
		asked, deposits int64
		ratio, burst    float64
		first, scarce   bool
		demand, want    float64
	}{
		{name: "first sync: half the burst", ratio: 0.1, burst: 10, first: true, want: 5},
		{name: "idle: one token held", ratio: 0.1, burst: 10, want: 1},
		{name: "idle, holding one", held: 1, ratio: 0.1, burst: 10, want: 0},
		{name: "earned share", deposits: 75, ratio: 0.1, burst: 10, want: 8},
		{name: "demand", asked: 10, ratio: 0.1, burst: 10, want: 10},
		{name: "capped", asked: 1000, ratio: 0.1, burst: 10, want: fleetMaxLease},
		{name: "scarce: own share", asked: 100, deposits: 50, ratio: 0.1, burst: 10, scarce: true, want: 6},
	} {
		r := &fleetRoute{demand: c.demand, scarce: c.scarce}
		if got := leaseWant(r, c.held, c.asked, c.deposits, c.ratio, c.burst, c.first); got != c.want {
			t.Errorf("%s: leaseWant = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestSwitchInForceMergesProcessAndFleet(t *testing.T) {
	process := NewSwitches()
	h, err := New(config.Config{Route: "sw", Upstreams: []config.UpstreamConfig{{URL: "http://a"}}}, Options{Switches: process})
	if err != nil {
		t.Fatal(err)
	}
	if s := h.SwitchInForce(); !s.IsZero() {
		t.Fatalf("no switch anywhere: %v, want on", s)
	}
	setFleetSwitches(h.state.share, fleetstore.Switch{Delay: 300 * time.Millisecond}, fleetstore.Switch{Delay: time.Second})
	if s := h.SwitchInForce(); s.Delay != 300*time.Millisecond || s.Paused {
		t.Errorf("fleet route delay 300ms, fleet all 1s: %v, want delay 300ms", s)
	}
	process.Set(fleetstore.SwitchAllRoutes, fleetstore.Switch{Delay: 50 * time.Millisecond})
	if s := h.SwitchInForce(); s.Delay != 50*time.Millisecond {
		t.Errorf("process all 50ms over the fleet's: %v, want delay 50ms", s)
	}
	if d := h.CurrentDelay(); d != 50*time.Millisecond {
		t.Errorf("CurrentDelay = %v, want the override 50ms", d)
	}
	setFleetSwitches(h.state.share, fleetstore.Switch{}, fleetstore.Switch{Paused: true})
	if s := h.SwitchInForce(); !s.Paused {
		t.Errorf("fleet all paused: %v, want paused (a pause anywhere wins)", s)
	}
}

// With a fleet a hedge spends from the reservation the sync took in
// Redis: a short reservation denies without reaching the cap (the next
// sync reserves more), the fleet's reserved total at the cap reaches it,
// a grant lifts it, and the hour ends when Redis' does, whatever this
// replica's clock says.
func TestSpendReservationOnRedisHour(t *testing.T) {
	m := &spendMeter{}
	now := time.Date(2026, 12, 1, 18, 59, 0, 0, time.UTC).Add(5 * time.Hour) // this clock is five hours off
	reply := func(hour, msLeft, grant, reserved, spent int64) fleetstore.SpendResult {
		return fleetstore.SpendResult{OK: true, Hour: hour, Left: time.Duration(msLeft) * time.Millisecond, Granted: grant, Reserved: reserved, Spent: spent}
	}
	fleetSpendIn(m, reply(1000, 60000, 40, 40, 0), now)
	if m.hour != 1000 || m.held != 40 || !m.leased {
		t.Fatalf("after a grant of 40 in Redis' hour 1000: hour %d, held %d, leased %v; want 1000, 40, true", m.hour, m.held, m.leased)
	}
	if ok, _ := spendTake(m, 30, 100, now); !ok {
		t.Fatal("30 of a reservation of 40: denied, want allowed")
	}
	if ok, reached := spendTake(m, 30, 100, now); ok || reached || m.capped {
		t.Errorf("30 with 10 held, the fleet at 40 of 100: allowed %v, reached %v, capped %v; want denied, not capped", ok, reached, m.capped)
	}
	o := fleetSpendOut(m, 100, false, now)
	if o.Hour != 1000 || o.Spent != 30 || o.Over != 0 || o.Held != 10 || o.Target < 30 {
		t.Errorf("sync out = %+v, want hour 1000, spent 30, over 0, held 10, target ≥ 30", o)
	}
	fleetSpendIn(m, reply(1000, 50000, 0, 100, 30), now)
	if ok, reached := spendTake(m, 30, 100, now); ok || !reached || !m.capped {
		t.Errorf("30 with 10 held, the fleet reserved 100 of 100: allowed %v, reached %v, capped %v; want denied, reached, capped", ok, reached, m.capped)
	}
	fleetSpendIn(m, reply(1000, 40000, 25, 100, 60), now)
	if m.capped || m.held != 35 {
		t.Errorf("after a grant of 25: capped %v, held %d; want not capped, 35", m.capped, m.held)
	}
	// Redis' hour ends 40 s later on this clock, not at this clock's hour.
	if total, _ := spendSnapshot(m, now.Add(39*time.Second)); total != 60 {
		t.Errorf("spend 39 s later = %d, want the hour's 60", total)
	}
	if total, _ := spendSnapshot(m, now.Add(40*time.Second)); total != 0 || m.hour != 1001 || m.held != 0 {
		t.Errorf("at Redis' hour end: spend %d, hour %d, held %d; want 0, 1001, 0 (a reservation of the hour before is void)", total, m.hour, m.held)
	}
}
