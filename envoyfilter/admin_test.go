package envoyfilter_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/switchadmin"
)

// The admin listener serves the per-process switch: POST sets it, GET
// lists it, a reload (SIGHUP) keeps it, and no hedge starts while it pauses
// the route.
func TestAdminListenerSwitchSurvivesReload(t *testing.T) {
	defer core.SetProcessSwitch("chat", core.Switch{})
	defer core.SetProcessSwitch(core.SwitchAllRoutes, core.Switch{})
	wl := llmsim.Reference(1, testScale)
	wl.StallProb = noStalls
	a, b := llmsim.Start("A", wl), llmsim.Start("B", wl)
	defer a.Close()
	defer b.Close()
	path := filepath.Join(t.TempDir(), "extproc.yaml")
	config := func(delay string) []byte {
		return []byte(`
grpc: {listen: "127.0.0.1:0"}
metrics: {listen: "off"}
admin: {listen: "127.0.0.1:0"}
log: {level: warn}
routes:
  - name: chat
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: A, url: "` + a.URL + `"}, {name: B, url: "` + b.URL + `"}]
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
	conn, err := grpc.NewClient(app.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	driver := envoydriver.New(conn, envoydriver.Config{})
	defer driver.Close()
	front := httptest.NewServer(driver)
	defer front.Close()
	h := &harness{t: t, front: front}
	n := 0
	// The primary answers after 400ms: the hedge (delay 100ms) wins unless
	// hedging is paused.
	wantFrom := func(when, upstream string) {
		t.Helper()
		n++
		id := "admin-" + strconv.Itoa(n)
		_, from, err := streamChat(context.Background(), h.client(), simHeaders(id, "A=ttft:400ms")...)
		if err != nil || len(from) != 1 || !from[upstream] {
			t.Errorf("%s: answer from %v (error %v), want only %s", when, from, err, upstream)
		}
	}
	wantFrom("hedging on", "B")
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

	wantFrom("paused", "A")

	os.WriteFile(path, config("150ms"), 0o600)
	if err := app.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := switchadmin.Listed(t, endpoint); got != want {
		t.Errorf("GET /switch after a reload = %q, want %q", got, want)
	}
	wantFrom("paused, after a reload", "A")
	switchadmin.Call(t, endpoint, http.MethodPost, `{"route":"chat","paused":false}`)
	switchadmin.Call(t, endpoint, http.MethodPost, `{"delay":"auto"}`)
	wantFrom("resumed", "B")
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
