package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/internal/testkit/caddybin"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
	"github.com/llmhedge/llmhedge/internal/testkit/switchadmin"
)

// TestAdminSwitchSetListedAndKeptAcrossReload: the per-process switch set
// through Caddy's admin API (admin.api.llm_hedge) is listed by GET and
// survives a config reload (POST /load), which provisions new handlers.
func TestAdminSwitchSetListedAndKeptAcrossReload(t *testing.T) {
	a, b := startSims(t)
	c := startCaddy(t, "", hedgeSite(a, b, ""))
	endpoint := c.admin + "/llm_hedge/switch"
	if got := switchadmin.Listed(t, endpoint); got != "" {
		t.Fatalf("switches at start = %q, want none", got)
	}
	// What a web page could send (no preflight: text/plain; or a foreign
	// Origin) is refused, and nothing changes.
	for _, hdr := range []map[string]string{
		{"Content-Type": "text/plain;charset=UTF-8"},
		{"Content-Type": "application/json", "Origin": "http://evil.example"},
	} {
		code, body := switchadmin.Send(t, endpoint, http.MethodPost, `{"route":"e2e","paused":true}`, hdr)
		if code != http.StatusUnsupportedMediaType && code != http.StatusForbidden {
			t.Errorf("POST with %v: %d %s, want 415 or 403", hdr, code, body)
		}
		if got := switchadmin.Listed(t, endpoint); got != "" {
			t.Fatalf("switches after a POST with %v = %q, want none (refused)", hdr, got)
		}
	}
	code, body := switchadmin.Call(t, endpoint, http.MethodPost, `{"route":"e2e","paused":true}`)
	if code != http.StatusOK || !strings.Contains(body, `"before":"on"`) || !strings.Contains(body, `"after":"paused"`) {
		t.Fatalf("POST pause: %d %s, want 200 with before on, after paused", code, body)
	}
	if code, body := switchadmin.Call(t, endpoint, http.MethodPost, `{"delay":"250ms"}`); code != http.StatusOK {
		t.Fatalf("POST delay for every route: %d %s, want 200", code, body)
	}
	want := "*=delay 250ms e2e=paused"
	if got := switchadmin.Listed(t, endpoint); got != want {
		t.Errorf("switches listed = %q, want %q", got, want)
	}

	if err := c.load(strings.Replace(hedgeSite(a, b, ""), "delay 50ms", "delay 60ms", 1)); err != nil {
		t.Fatal(err)
	}
	if got := switchadmin.Listed(t, endpoint); got != want {
		t.Errorf("switches listed after a reload = %q, want %q (they are the process's)", got, want)
	}

	code, body = switchadmin.Call(t, endpoint, http.MethodPost, `{"route":"e2e","pause":true}`)
	if code != http.StatusBadRequest || !strings.Contains(body, `"error"`) || !strings.Contains(body, "unknown field") {
		t.Errorf("POST with a typo: %d %s, want 400 with an error naming the unknown field", code, body)
	}
	if code, _ := switchadmin.Call(t, endpoint, http.MethodPost, `{"route":"e2e","paused":false}`); code != http.StatusOK {
		t.Errorf("POST resume: %d, want 200", code)
	}
	switchadmin.Call(t, endpoint, http.MethodPost, `{"delay":"auto"}`)
	if got := switchadmin.Listed(t, endpoint); got != "" {
		t.Errorf("switches after resume and auto = %q, want none", got)
	}
}

// ctl runs the llmhedge-ctl binary against the fleet at redisURL.
func ctl(t *testing.T, bin, redisURL string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"-fleet", redisURL}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("llmhedge-ctl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// heartbeatSwitch is the switch the replica of kind caddy reports for
// route, read by llmhedge-ctl status -json ("" while no heartbeat lists it).
func heartbeatSwitch(t *testing.T, bin, redisURL, route string) string {
	t.Helper()
	var rep struct {
		Replicas []fleetstore.ReplicaStatus `json:"replicas"`
	}
	if err := json.Unmarshal([]byte(ctl(t, bin, redisURL, "status", "-json")), &rep); err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Replicas {
		for _, rt := range r.Routes {
			if r.Kind == "caddy" && rt.Name == route {
				return rt.Switch
			}
		}
	}
	return ""
}

// waitHeartbeatSwitch polls the fleet (Caddy is another process; its
// heartbeat comes every 2 s) until the replica reports want for route,
// and returns how long that took.
func waitHeartbeatSwitch(t *testing.T, bin, redisURL, route, want string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		got := heartbeatSwitch(t, bin, redisURL, route)
		if got == want {
			return time.Since(start)
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the replica's heartbeat reports switch %q for %s after 10s, want %q", got, route, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKillSwitchStopsHedgingThroughAdminAndCtl: a request whose primary
// never answers is won by the hedge while hedging runs; paused through
// Caddy's admin API, or fleet-wide by llmhedge-ctl pause (also across a
// config reload), a primary answering after 400ms wins: no hedge started.
func TestKillSwitchStopsHedgingThroughAdminAndCtl(t *testing.T) {
	redisSrv := redisproc.Start(t, redisproc.Options{})
	bin := caddybin.GoBuild(t, "./cmd/llmhedge-ctl")
	a, b := startSims(t)
	site := func(delay string) string {
		return strings.Replace(hedgeSite(a, b, "\t\tfleet "+redisSrv.URL()), "delay 50ms", "delay "+delay, 1)
	}
	c := startCaddy(t, "", site("50ms"))
	ctx := testContext(t)
	endpoint := c.admin + "/llm_hedge/switch"
	n := 0
	wantWinner := func(when, upstream string) {
		t.Helper()
		n++
		id := fmt.Sprintf("switch-%d", n)
		// Hedging on: A never sends a token, so only the hedge can answer,
		// however slow the machine. Paused: A is the one attempt and wins
		// whenever it answers; a hedge (a broken pause) would let B win.
		behavior := "A=ttft:400ms"
		if upstream == "B" {
			behavior = "A=stall"
		}
		if err := streamChat(ctx, sdkClient(c.url(0), id, behavior)).fromOnly(upstream, id); err != nil {
			t.Errorf("%s: %v, want the answer from %s", when, err, upstream)
		}
	}
	wantWinner("hedging on", "B")

	if code, body := switchadmin.Call(t, endpoint, http.MethodPost, `{"route":"e2e","paused":true}`); code != http.StatusOK {
		t.Fatalf("POST pause: %d %s", code, body)
	}
	wantWinner("paused through the admin API", "A")
	switchadmin.Call(t, endpoint, http.MethodPost, `{"route":"e2e","paused":false}`)
	wantWinner("resumed through the admin API", "B")
	// A heartbeat written after the resume, so that the wait below sees
	// the fleet's pause, not the admin one.
	waitHeartbeatSwitch(t, bin, redisSrv.URL(), "e2e", "on")

	if out := ctl(t, bin, redisSrv.URL(), "pause", "-route", "e2e"); !strings.Contains(out, "on -> paused") {
		t.Fatalf("llmhedge-ctl pause printed %q", out)
	}
	took := waitHeartbeatSwitch(t, bin, redisSrv.URL(), "e2e", "paused")
	t.Logf("llmhedge-ctl pause to the replica's heartbeat reporting it: %v (sync and heartbeat intervals included)", took)
	wantWinner("paused by llmhedge-ctl", "A")

	if err := c.load(site("60ms")); err != nil {
		t.Fatal(err)
	}
	// Right after a reload a new connection may still meet the old
	// server's close (reset or EOF, the reload race of
	// TestReloadUnderLoadLosesNoRequest): a client would retry it, so
	// does this one, with a fresh request, at most twice.
	for try := 1; ; try++ {
		n++
		id := fmt.Sprintf("switch-%d", n)
		err := streamChat(ctx, sdkClient(c.url(0), id, "A=ttft:400ms")).fromOnly("A", id)
		if err == nil {
			break
		}
		if try == 3 || !(strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "EOF")) {
			t.Fatalf("paused by llmhedge-ctl, after a reload (try %d): %v, want the answer from A", try, err)
		}
	}

	ctl(t, bin, redisSrv.URL(), "resume", "-route", "e2e")
	waitHeartbeatSwitch(t, bin, redisSrv.URL(), "e2e", "on")
	wantWinner("resumed by llmhedge-ctl", "B")
}
