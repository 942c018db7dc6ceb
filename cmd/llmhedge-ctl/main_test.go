package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/redis/go-redis/v9"

	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// ctl runs the command in-process: its exit status, stdout and stderr.
func ctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// startRedis starts a real redis-server and a client the test writes and
// reads keys with.
func startRedis(t *testing.T, opts redisproc.Options) (*redisproc.Server, *redis.Client) {
	t.Helper()
	srv := redisproc.Start(t, opts)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: opts.Password, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { rdb.Close() })
	return srv, rdb
}

// switchValue is the raw value of route's fleet switch key ("" when the
// key does not exist).
func switchValue(t *testing.T, rdb *redis.Client, route string) string {
	t.Helper()
	v, err := rdb.Get(context.Background(), fleetstore.SwitchKey("llmhedge:", route)).Result()
	if err == redis.Nil {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestPauseResumeSetDelayWriteTheFleetSwitch(t *testing.T) {
	srv, rdb := startRedis(t, redisproc.Options{})
	url := srv.URL()
	steps := []struct {
		args      []string
		wantKey   string // the switch key's value after the step, "" deleted
		wantPrint []string
	}{
		{[]string{"pause", "-route", "chat"}, `{"paused":true}`, []string{"route chat: on -> paused"}},
		{[]string{"pause", "-route", "chat"}, `{"paused":true}`, []string{"route chat: already paused, unchanged"}},
		{[]string{"set-delay", "-route", "chat", "250ms"}, `{"paused":true,"delay_ms":250}`, []string{"route chat: paused -> paused, delay 250ms"}},
		{[]string{"resume", "-route", "chat"}, `{"delay_ms":250}`, []string{"route chat: paused, delay 250ms -> delay 250ms", "note: resume keeps the delay override 250ms"}},
		{[]string{"set-delay", "-route", "chat", "auto"}, "", []string{"route chat: delay 250ms -> on"}},
	}
	for _, s := range steps {
		code, out, errOut := ctl(t, append([]string{"-fleet", url}, s.args...)...)
		if code != exitOK {
			t.Fatalf("%v: exit %d, want 0; stderr: %s", s.args, code, errOut)
		}
		if got := switchValue(t, rdb, "chat"); got != s.wantKey {
			t.Errorf("after %v: switch:chat = %q, want %q", s.args, got, s.wantKey)
		}
		for _, want := range s.wantPrint {
			if !strings.Contains(out, want) {
				t.Errorf("%v printed %q, want it to say %q", s.args, out, want)
			}
		}
	}
}

func TestPauseWithoutRouteIsEveryRouteAndResumeDeletesTheKey(t *testing.T) {
	srv, rdb := startRedis(t, redisproc.Options{})
	if code, _, errOut := ctl(t, "-fleet", srv.URL(), "pause"); code != exitOK {
		t.Fatalf("pause: exit %d, want 0: %s", code, errOut)
	}
	if got := switchValue(t, rdb, fleetstore.SwitchAllRoutes); got != `{"paused":true}` {
		t.Errorf("switch:* = %q, want {\"paused\":true}", got)
	}
	// A route resumed while every route is paused stays paused: say so.
	code, out, _ := ctl(t, "-fleet", srv.URL(), "resume", "-route", "chat")
	if code != exitOK || !strings.Contains(out, "stays paused until `resume` without -route") {
		t.Errorf("resume -route chat under switch *: exit %d, printed %q, want 0 and a note that * still pauses it", code, out)
	}
	code, out, _ = ctl(t, "-fleet", srv.URL(), "-json", "resume")
	var change switchChange
	if err := json.Unmarshal([]byte(out), &change); err != nil || code != exitOK {
		t.Fatalf("-json resume: exit %d, output %q: %v", code, out, err)
	}
	if change.Route != "*" || change.Before != "paused" || change.After != "on" || !change.Changed {
		t.Errorf("-json resume = route %q %q -> %q changed %v, want * paused -> on changed", change.Route, change.Before, change.After, change.Changed)
	}
	if n, _ := rdb.Exists(context.Background(), fleetstore.SwitchKey("llmhedge:", "*")).Result(); n != 0 {
		t.Errorf("switch:* still exists after resume, want it deleted (a zero switch has no key)")
	}
}

// heartbeat writes a replica's heartbeat as the engine does.
func heartbeat(t *testing.T, rdb *redis.Client, prefix string, r fleetstore.ReplicaStatus) {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(context.Background(), fleetstore.ReplicaKey(prefix, r.ID), b, fleetstore.HeartbeatTTL).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestStatusListsReplicasRoutesAndSwitches(t *testing.T) {
	srv, rdb := startRedis(t, redisproc.Options{})
	ctx := context.Background()
	heartbeat(t, rdb, "llmhedge:", fleetstore.ReplicaStatus{ID: "caddy-a1", Kind: "caddy", Host: "gw-1", PID: 4242,
		Started: time.Now().Add(-90 * time.Second).UTC().Format(time.RFC3339),
		Routes: []fleetstore.ReplicaRoute{{Name: "chat", Requests: 1200, Hedges: 60, HedgeRate: 0.05, BudgetTokens: 3.5,
			Cooled: []string{"openai"}, Open: []string{"backup"}, Switch: "paused", SpendTokens: 12000, SpendUSD: 0.03, SpendCapped: true}}})
	heartbeat(t, rdb, "llmhedge:", fleetstore.ReplicaStatus{ID: "envoy-b2", Kind: "envoy", Host: "gw-2", PID: 7,
		Routes: []fleetstore.ReplicaRoute{{Name: "chat", Switch: "on"}}})
	heartbeat(t, rdb, "other:", fleetstore.ReplicaStatus{ID: "elsewhere", Kind: "traefik"})
	rdb.Set(ctx, fleetstore.SwitchKey("llmhedge:", "chat"), fleetstore.EncodeSwitch(fleetstore.Switch{Paused: true}), 0)
	rdb.Set(ctx, fleetstore.SwitchKey("llmhedge:", "*"), fleetstore.EncodeSwitch(fleetstore.Switch{Delay: 300 * time.Millisecond}), 0)
	rdb.Set(ctx, fleetstore.ReplicaKey("llmhedge:", "broken"), "not json", fleetstore.HeartbeatTTL)

	code, out, errOut := ctl(t, "-fleet", srv.URL(), "status")
	if code != exitOK {
		t.Fatalf("status: exit %d, want 0: %s", code, errOut)
	}
	for _, want := range []string{
		"2 live replicas",
		"* (every route)  delay 300ms",
		"chat             paused",
		"replica caddy-a1  caddy  gw-1 pid 4242  up 1m3",
		"replica envoy-b2  envoy  gw-2 pid 7",
		"5.0%", "3.5", "12000 tok $0.0300 CAPPED", "openai", "backup",
		"unreadable key (ignored): llmhedge:{fleet}:replica:broken",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "elsewhere") {
		t.Errorf("status lists a replica of prefix other: (want only llmhedge:):\n%s", out)
	}

	code, out, _ = ctl(t, "-fleet", srv.URL(), "status", "-json")
	var rep statusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != exitOK {
		t.Fatalf("status -json: exit %d, output %q: %v", code, out, err)
	}
	if len(rep.Replicas) != 2 || rep.Replicas[0].ID != "caddy-a1" || rep.Replicas[1].ID != "envoy-b2" {
		t.Fatalf("status -json replicas = %d, want caddy-a1 and envoy-b2:\n%s", len(rep.Replicas), out)
	}
	r := rep.Replicas[0]
	if r.HeartbeatAgeMS < 0 || r.HeartbeatAgeMS > int64(fleetstore.HeartbeatTTL/time.Millisecond) {
		t.Errorf("heartbeat_age_ms = %d, want 0..%d", r.HeartbeatAgeMS, fleetstore.HeartbeatTTL/time.Millisecond)
	}
	if rt := r.Routes[0]; rt.Name != "chat" || !rt.SpendCapped || rt.SpendTokens != 12000 || rt.Switch != "paused" {
		t.Errorf("caddy-a1 route = %q capped %v spend %d switch %q, want chat capped 12000 paused", rt.Name, rt.SpendCapped, rt.SpendTokens, rt.Switch)
	}
	if len(rep.Switches) != 2 || rep.Switches[0].Route != "*" || rep.Switches[0].Delay != "300ms" || !rep.Switches[1].Paused {
		t.Errorf("status -json switches = %+v, want * delay 300ms and chat paused", rep.Switches)
	}
}

func TestStatusOfAnEmptyFleet(t *testing.T) {
	srv, _ := startRedis(t, redisproc.Options{})
	code, out, _ := ctl(t, "-fleet", srv.URL(), "status")
	if code != exitOK || !strings.Contains(out, "no live replicas") || !strings.Contains(out, "fleet switches: none") {
		t.Errorf("status of an empty fleet: exit %d, printed %q, want 0, no switches and no replicas", code, out)
	}
}

// deadPort is a loopback port nothing listens on.
func deadPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestUnreachableFleetExitsOneWithoutThePassword(t *testing.T) {
	addr := deadPort(t)
	for _, cmd := range [][]string{{"status"}, {"pause"}, {"set-delay", "-route", "chat", "1s"}} {
		args := append([]string{"-fleet", "redis://ops:hunter2secret@" + addr + "/0", "-timeout", "2s"}, cmd...)
		code, out, errOut := ctl(t, args...)
		if code != exitFleet {
			t.Errorf("%v against a dead port: exit %d, want %d", cmd, code, exitFleet)
		}
		if !strings.Contains(errOut, "fleet "+addr+"/0 unreachable") {
			t.Errorf("%v: stderr %q, want it to name the server as unreachable", cmd, errOut)
		}
		if strings.Contains(errOut+out, "hunter2secret") || strings.Contains(errOut+out, "ops:") {
			t.Errorf("%v: output shows the credentials: %q", cmd, errOut)
		}
	}
}

func TestWrongPasswordIsAFleetErrorAndNeverPrinted(t *testing.T) {
	srv, _ := startRedis(t, redisproc.Options{Password: "right-pass-123"})
	code, _, errOut := ctl(t, "-fleet", "redis://:wrong-pass-456@"+srv.Addr()+"/0", "status")
	if code != exitFleet || !strings.Contains(errOut, "refused the command: WRONGPASS") {
		t.Errorf("wrong password: exit %d, stderr %q, want %d and Redis' WRONGPASS", code, errOut, exitFleet)
	}
	if strings.Contains(errOut, "wrong-pass-456") {
		t.Errorf("stderr shows the password: %q", errOut)
	}
	t.Setenv("LLMHEDGE_CTL_TEST_PASSWORD", "right-pass-123")
	code, out, errOut := ctl(t, "-fleet", "redis://"+srv.Addr()+"/0", "-password-env", "LLMHEDGE_CTL_TEST_PASSWORD", "status")
	if code != exitOK || !strings.Contains(out, "no live replicas") {
		t.Errorf("-password-env: exit %d, stdout %q, stderr %q, want 0 and a status", code, out, errOut)
	}
}

func TestRedisThatStopsAnsweringTimesOut(t *testing.T) {
	srv, _ := startRedis(t, redisproc.Options{})
	srv.Pause()
	defer srv.Resume()
	// Redis stays paused, so only -timeout can end the command (its message
	// says so). The 30 s guard is a hang detector, not a margin.
	type result struct {
		code   int
		errOut string
		took   time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		var out, errOut bytes.Buffer
		code := run([]string{"-fleet", srv.URL(), "-timeout", "300ms", "pause"}, &out, &errOut)
		done <- result{code, errOut.String(), time.Since(start)}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the command against a paused Redis never returned: -timeout did not end it")
	}
	if r.code != exitFleet || !strings.Contains(r.errOut, "no answer within -timeout") {
		t.Errorf("paused Redis: exit %d, stderr %q, want %d and a timeout message", r.code, r.errOut, exitFleet)
	}
	// wall clock: a lower bound on the timeout's own duration.
	if r.took < 300*time.Millisecond {
		t.Errorf("the command gave up after %v against a paused Redis, before -timeout (300ms)", r.took)
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"status"}, "-fleet URL is required"},
		{[]string{"-fleet", "redis://127.0.0.1:1/0", "restart"}, `unknown command "restart"`},
		{[]string{"-fleet", "redis://127.0.0.1:1/0", "set-delay", "1s"}, "set-delay needs -route NAME"},
		{[]string{"-fleet", "redis://127.0.0.1:1/0", "set-delay", "-route", "chat", "soon"}, "positive duration like 250ms, or auto"},
		{[]string{"-fleet", "redis://127.0.0.1:1/0", "set-delay", "-route", "chat"}, "want 1 argument"},
		{[]string{"-fleet", "redis://127.0.0.1:1/0", "pause", "extra"}, `unexpected argument "extra"`},
		{[]string{"-fleet", "redis://127.0.0.1:1/0", "-bogus", "status"}, "flag provided but not defined: -bogus"},
		{[]string{"-fleet", "http://u:topsecret1@127.0.0.1:1/0", "status"}, "scheme must be redis or rediss"},
		{[]string{"-fleet", "redis://127.0.0.1:1/0", "-password-env", "LLMHEDGE_CTL_UNSET_VAR", "status"}, "the variable is not set"},
	} {
		code, _, errOut := ctl(t, tc.args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d", tc.args, code, exitUsage)
		}
		if !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "usage: llmhedge-ctl") {
			t.Errorf("%v: stderr %q, want %q and the usage", tc.args, errOut, tc.want)
		}
		if strings.Contains(errOut, "topsecret1") {
			t.Errorf("%v: stderr shows the password: %q", tc.args, errOut)
		}
	}
}

func TestTLSFleetWithCACert(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{TLS: true})
	code, out, errOut := ctl(t, "-fleet", srv.TLSURL(), "-cacert", srv.CAFile, "pause", "-route", "chat")
	if code != exitOK || !strings.Contains(out, "route chat: on -> paused") {
		t.Errorf("rediss:// with -cacert: exit %d, stdout %q, stderr %q, want 0 and the change", code, out, errOut)
	}
	if code, _, errOut := ctl(t, "-fleet", srv.TLSURL(), "status"); code != exitFleet || !strings.Contains(errOut, "certificate") {
		t.Errorf("rediss:// without -cacert: exit %d, stderr %q, want %d and a certificate error", code, errOut, exitFleet)
	}
}

func TestAnUnreadableSwitchIsReplacedAndSaidSo(t *testing.T) {
	srv, rdb := startRedis(t, redisproc.Options{})
	rdb.Set(context.Background(), fleetstore.SwitchKey("llmhedge:", "chat"), "garbage", 0)
	code, out, _ := ctl(t, "-fleet", srv.URL(), "pause", "-route", "chat")
	if code != exitOK || !strings.Contains(out, "unreadable value") {
		t.Errorf("pause over an unreadable value: exit %d, printed %q, want 0 and a note", code, out)
	}
	if got := switchValue(t, rdb, "chat"); got != `{"paused":true}` {
		t.Errorf("switch:chat = %q, want {\"paused\":true}", got)
	}
}

func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"-fleet", "redis://127.0.0.1:1/0", "pause", "-help"}} {
		code, out, _ := ctl(t, args...)
		if code != exitOK || !strings.Contains(out, "usage: llmhedge-ctl") {
			t.Errorf("%v: exit %d, stdout %q, want 0 and the usage", args, code, out)
		}
	}
}
