package envoyfilter_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/envoyfilter"
)

// adminCall sends method to the admin listener's /switch with body.
func adminCall(t *testing.T, addr, method, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+"/switch", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(answer)
}

func listedSwitches(t *testing.T, addr string) string {
	t.Helper()
	code, body := adminCall(t, addr, http.MethodGet, "")
	if code != http.StatusOK {
		t.Fatalf("GET /switch: %d %s", code, body)
	}
	var list struct{ Switches []core.SwitchEntry }
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatalf("GET /switch: %v in %s", err, body)
	}
	var out []string
	for _, s := range list.Switches {
		out = append(out, s.Route+"="+s.Switch)
	}
	return strings.Join(out, " ")
}

// The admin listener serves the per-process switch: POST sets it, GET
// lists it, a reload (SIGHUP) keeps it, and the process's hedgers see it.
func TestAdminListenerSwitchSurvivesReload(t *testing.T) {
	defer core.SetProcessSwitch("chat", core.Switch{})
	defer core.SetProcessSwitch(core.SwitchAllRoutes, core.Switch{})
	path := filepath.Join(t.TempDir(), "extproc.yaml")
	config := func(delay string) []byte {
		return []byte(`
grpc: {listen: "127.0.0.1:0"}
metrics: {listen: "off"}
admin: {listen: "127.0.0.1:0"}
log: {level: warn}
routes:
  - name: chat
    upstreams: [{name: A, url: "http://127.0.0.1:9"}, {name: B, url: "http://127.0.0.1:10"}]
    delay: ` + delay + `
`)
	}
	os.WriteFile(path, config("100ms"), 0o600)
	app, _ := startApp(t, path, zap.NewNop(), envoyfilter.Options{})
	defer app.Shutdown(time.Second)
	addr := app.AdminAddr()
	if addr == "" {
		t.Fatal("AdminAddr() = \"\" with admin.listen set, want the listener's address")
	}
	code, body := adminCall(t, addr, http.MethodPost, `{"route":"chat","paused":true}`)
	if code != http.StatusOK || !strings.Contains(body, `"after":"paused"`) {
		t.Fatalf("POST pause: %d %s, want 200 and after paused", code, body)
	}
	adminCall(t, addr, http.MethodPost, `{"delay":"250ms"}`)
	want := "*=delay 250ms chat=paused"
	if got := listedSwitches(t, addr); got != want {
		t.Errorf("GET /switch = %q, want %q", got, want)
	}
	if got := core.ProcessSwitch("chat"); !got.Paused || got.Delay != 250*time.Millisecond {
		t.Errorf("core.ProcessSwitch(chat) = %s, want paused with the delay 250ms of every route", got)
	}

	os.WriteFile(path, config("200ms"), 0o600)
	if err := app.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := listedSwitches(t, addr); got != want {
		t.Errorf("GET /switch after a reload = %q, want %q", got, want)
	}
	if code, body := adminCall(t, addr, http.MethodPut, `{}`); code != http.StatusMethodNotAllowed || !strings.Contains(body, `"error"`) {
		t.Errorf("PUT /switch: %d %s, want 405 with an error", code, body)
	}
}

func TestAdminListenerIsOffByDefaultAndValidated(t *testing.T) {
	cfg, err := envoyfilter.ParseConfig([]byte("routes: [{name: chat, upstreams: [{url: http://127.0.0.1:9}]}]"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Admin.Enabled() {
		t.Errorf("admin listener on by default (listen %q), want off", cfg.Admin.Listen)
	}
	_, err = envoyfilter.ParseConfig([]byte("admin: {listen: 9902}\nroutes: [{name: chat, upstreams: [{url: http://127.0.0.1:9}]}]"))
	if err == nil || !strings.Contains(err.Error(), "admin.listen") {
		t.Errorf("admin.listen 9902 (no host): error %v, want one naming admin.listen", err)
	}
}
