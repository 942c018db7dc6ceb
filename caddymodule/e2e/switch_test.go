package e2e

import (
	"net/http"
	"strings"
	"testing"

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
