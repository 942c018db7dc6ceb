package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// adminSwitch sends method to Caddy's /llm_hedge/switch with body ("" for
// none) and returns the status and the answer.
func (c *caddyProc) adminSwitch(method, body string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.admin+"/llm_hedge/switch", strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	// A fresh connection: a config load replaces the admin server.
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(answer)
}

// switchesListed is GET /llm_hedge/switch as "route=switch" strings.
func (c *caddyProc) switchesListed() []string {
	c.t.Helper()
	code, body := c.adminSwitch(http.MethodGet, "")
	if code != http.StatusOK {
		c.t.Fatalf("GET /llm_hedge/switch: %d %s", code, body)
	}
	var list struct {
		Switches []struct{ Route, Switch string }
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		c.t.Fatalf("GET /llm_hedge/switch: %v in %s", err, body)
	}
	out := []string{}
	for _, s := range list.Switches {
		out = append(out, s.Route+"="+s.Switch)
	}
	return out
}

// TestAdminSwitchSetListedAndKeptAcrossReload: the per-process switch set
// through Caddy's admin API (admin.api.llm_hedge) is listed by GET and
// survives a config reload (POST /load), which provisions new handlers.
func TestAdminSwitchSetListedAndKeptAcrossReload(t *testing.T) {
	a, b := startSims(t)
	c := startCaddy(t, "", hedgeSite(a, b, ""))
	if got := c.switchesListed(); len(got) != 0 {
		t.Fatalf("switches at start = %q, want none", got)
	}
	code, body := c.adminSwitch(http.MethodPost, `{"route":"e2e","paused":true}`)
	if code != http.StatusOK || !strings.Contains(body, `"before":"on"`) || !strings.Contains(body, `"after":"paused"`) {
		t.Fatalf("POST pause: %d %s, want 200 with before on, after paused", code, body)
	}
	if code, body := c.adminSwitch(http.MethodPost, `{"delay":"250ms"}`); code != http.StatusOK {
		t.Fatalf("POST delay for every route: %d %s, want 200", code, body)
	}
	want := "*=delay 250ms e2e=paused"
	if got := strings.Join(c.switchesListed(), " "); got != want {
		t.Errorf("switches listed = %q, want %q", got, want)
	}

	if err := c.load(strings.Replace(hedgeSite(a, b, ""), "delay 50ms", "delay 60ms", 1)); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.switchesListed(), " "); got != want {
		t.Errorf("switches listed after a reload = %q, want %q (they are the process's)", got, want)
	}

	code, body = c.adminSwitch(http.MethodPost, `{"route":"e2e","pause":true}`)
	if code != http.StatusBadRequest || !strings.Contains(body, `"error"`) || !strings.Contains(body, "unknown field") {
		t.Errorf("POST with a typo: %d %s, want 400 with an error naming the unknown field", code, body)
	}
	code, _ = c.adminSwitch(http.MethodPost, `{"route":"e2e","paused":false}`)
	if code != http.StatusOK {
		t.Errorf("POST resume: %d, want 200", code)
	}
	c.adminSwitch(http.MethodPost, `{"delay":"auto"}`)
	if got := c.switchesListed(); len(got) != 0 {
		t.Errorf("switches after resume and auto = %q, want none", got)
	}
}
