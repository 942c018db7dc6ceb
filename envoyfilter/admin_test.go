package envoyfilter_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/switchadmin"
)

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
	if app.AdminAddr() == "" {
		t.Fatal("AdminAddr() = \"\" with admin.listen set, want the listener's address")
	}
	endpoint := "http://" + app.AdminAddr() + "/switch"
	code, body := switchadmin.Call(t, endpoint, http.MethodPost, `{"route":"chat","paused":true}`)
	if code != http.StatusOK || !strings.Contains(body, `"after":"paused"`) {
		t.Fatalf("POST pause: %d %s, want 200 and after paused", code, body)
	}
	switchadmin.Call(t, endpoint, http.MethodPost, `{"delay":"250ms"}`)
	want := "*=delay 250ms chat=paused"
	if got := switchadmin.Listed(t, endpoint); got != want {
		t.Errorf("GET /switch = %q, want %q", got, want)
	}
	if got := core.ProcessSwitch("chat"); !got.Paused || got.Delay != 250*time.Millisecond {
		t.Errorf("core.ProcessSwitch(chat) = %s, want paused with the delay 250ms of every route", got)
	}

	os.WriteFile(path, config("200ms"), 0o600)
	if err := app.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := switchadmin.Listed(t, endpoint); got != want {
		t.Errorf("GET /switch after a reload = %q, want %q", got, want)
	}
	if code, body := switchadmin.Call(t, endpoint, http.MethodPut, `{}`); code != http.StatusMethodNotAllowed || !strings.Contains(body, `"error"`) {
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
