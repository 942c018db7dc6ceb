package coretest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// A NOSCRIPT reply (Redis restarted, or SCRIPT FLUSH) makes the fleet send
// the script in full: not a failed operation, in the metrics as for the
// breaker.
func TestFleetNoScriptIsNoOperationError(t *testing.T) {
	redis, _, clock, r1 := syncedReplica(t)
	redisDo(t, redis, "SCRIPT", "FLUSH")
	before := redisCommands(t, redis)
	clock.advance(fleetstore.HeartbeatInterval)
	r1.loop.Round(t) // a sync and a heartbeat, each NOSCRIPT then EVAL
	calls := redisCommands(t, redis).Since(before, ownReads...)
	if calls["eval"] < 2 {
		t.Fatalf("after SCRIPT FLUSH the sync and heartbeat sent %s, want at least 2 EVAL (after NOSCRIPT)", calls)
	}
	r1.sink.mu.Lock()
	errs := len(r1.sink.errs)
	got := r1.sink.errs
	r1.sink.mu.Unlock()
	if errs != 0 {
		t.Errorf("llm_hedge_fleet_operation_errors_total counted %v after NOSCRIPT replies, want nothing", got)
	}
	if !r1.fleet.Up() {
		t.Error("fleet down after NOSCRIPT replies, want up")
	}
}

// syncedReplica is a replica of fleet2Config on a steppedClock that has
// served one request and synced.
func syncedReplica(t *testing.T) (*redisproc.Server, config.Config, *steppedClock, *member) {
	redis := redisproc.Start(t, redisproc.Options{})
	cfg := fleet2Config(redis.URL(), newTwoUpstreams(t, nil))
	clock := &steppedClock{}
	r1 := newMember(t, cfg, clock, nil)
	r1.do(t, nil)
	r1.loop.Round(t)
	return redis, cfg, clock, r1
}

// heartbeatOf reads m's heartbeat from Redis.
func heartbeatOf(t *testing.T, redis *redisproc.Server, m *member) fleetstore.ReplicaStatus {
	t.Helper()
	raw := redisDo(t, redis, "GET", fleetstore.ReplicaKey("llmhedge:", m.fleet.ReplicaID())).Str
	var st fleetstore.ReplicaStatus
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		t.Fatalf("heartbeat %q: %v", raw, err)
	}
	return st
}

// A replica without requests for longer than two minutes still reports
// its routes (llmhedge-ctl status) and takes a pause of the kill switch
// (llm_hedge_hedging_paused) before its next request.
func TestFleetIdleReplicaReportsRoutesAndSwitch(t *testing.T) {
	redis, _, clock, r1 := syncedReplica(t)
	// Five idle minutes, a round every heartbeat interval.
	for i := 0; i < int(5*time.Minute/fleetstore.HeartbeatInterval); i++ {
		clock.advance(fleetstore.HeartbeatInterval)
		r1.loop.Round(t)
	}
	st := heartbeatOf(t, redis, r1)
	if len(st.Routes) != 1 || st.Routes[0].Name != "fleet" || st.Routes[0].Switch != "on" {
		t.Fatalf("heartbeat after 5 idle minutes: routes %+v, want route fleet, switch on", st.Routes)
	}
	redisDo(t, redis, "SET", fleetstore.SwitchKey("llmhedge:", "fleet"), fleetstore.EncodeSwitch(fleetstore.Switch{Paused: true}))
	// One heartbeat interval later the idle replica has read the pause.
	clock.advance(fleetstore.HeartbeatInterval)
	r1.loop.Round(t)
	if got := core.HedgerGauge(core.MetricHedgingPaused, r1.hedger); got != 1 {
		t.Errorf("llm_hedge_hedging_paused = %v on the idle replica during a pause, want 1", got)
	}
	clock.advance(fleetstore.HeartbeatInterval)
	r1.loop.Round(t)
	st = heartbeatOf(t, redis, r1)
	if len(st.Routes) != 1 || st.Routes[0].Switch != "paused" {
		t.Errorf("heartbeat of the idle replica during a pause: routes %+v, want route fleet, switch paused", st.Routes)
	}
}

// A reload that changes a route's shape makes a new State: once the old
// one is idle, the heartbeat reports the route once, from the new State.
func TestFleetSupersededStateDetaches(t *testing.T) {
	redis, cfg, clock, r1 := syncedReplica(t)
	reloaded := cfg
	reloaded.Budget.Burst = 20 // another shape: a new State
	h2, err := core.New(reloaded, core.Options{Fleet: r1.fleet, Log: r1.logs.log})
	if err != nil {
		t.Fatal(err)
	}
	r2 := &member{hedger: h2, fleet: r1.fleet}
	n := int(3 * time.Minute / fleetstore.HeartbeatInterval)
	for i := 0; i < n; i++ {
		r2.do(t, nil)
		clock.advance(fleetstore.HeartbeatInterval)
		r1.loop.Round(t)
	}
	st := heartbeatOf(t, redis, r1)
	if len(st.Routes) != 1 || st.Routes[0].Requests != int64(n) {
		t.Errorf("heartbeat with the old State idle 3 minutes: routes %+v, want one, the new State's (%d requests)", st.Routes, n)
	}
}
