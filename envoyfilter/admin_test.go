package envoyfilter_test

import (
	"context"
	"net"
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

	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/switchadmin"
)

// The admin listener serves the per-process switch: POST sets it, GET
// lists it, a reload (SIGHUP) keeps it, and no hedge starts while it pauses
// the route.
func TestAdminListenerSwitchSurvivesReload(t *testing.T) {
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
	// Hedging on: the primary never sends a token, so only the hedge can
	// answer, however slow the machine. Paused: the primary, answering
	// after 400ms, is the one attempt and wins; a hedge (a broken pause)
	// would let B win.
	wantFrom := func(when, upstream string) {
		t.Helper()
		n++
		id := "admin-" + strconv.Itoa(n)
		behavior := "A=ttft:400ms"
		if upstream == "B" {
			behavior = "A=stall"
		}
		_, from, err := streamChat(context.Background(), h.client(), simHeaders(id, behavior)...)
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
	if got := app.Server.Switches().Get("chat"); !got.Paused || got.Delay != 250*time.Millisecond {
		t.Errorf("Switches().Get(chat) = %s, want paused with the delay 250ms of every route", got)
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

// adminRequest sends method to the admin listener's /switch at addr with
// the Host, Origin and Content-Type given ("" for none; host "" is addr).
func adminRequest(t *testing.T, addr, method, host, origin, contentType, body string) (int, string) {
	t.Helper()
	hdr := map[string]string{}
	for k, v := range map[string]string{"Host": host, "Origin": origin, "Content-Type": contentType} {
		if v != "" {
			hdr[k] = v
		}
	}
	code, answer := switchadmin.Send(t, "http://"+addr+"/switch", method, body, hdr)
	return code, strings.TrimSpace(answer)
}

// A web page on the host cannot pause hedging through the admin listener:
// a cross-origin POST (text/plain, which needs no preflight, or JSON), a
// DNS-rebinding name as Host, and a body not declared JSON are refused
// with a JSON error and the switch unchanged; curl's requests (no Origin,
// a loopback Host) and a host listed in admin.allowed_hosts pass, and a
// reload changes the list.
func TestAdminListenerRefusesWebPages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "extproc.yaml")
	config := func(hosts string) []byte {
		return []byte(`
grpc: {listen: "127.0.0.1:0"}
metrics: {listen: "off"}
admin: {listen: "127.0.0.1:0", allowed_hosts: [` + hosts + `]}
log: {level: warn}
routes:
  - name: chat
    upstreams: [{name: A, url: "http://127.0.0.1:9"}]
`)
	}
	os.WriteFile(path, config("llmhedge-admin.internal"), 0o600)
	app, _ := startApp(t, path, zap.NewNop(), envoyfilter.Options{})
	defer app.Shutdown(time.Second)
	addr := app.AdminAddr()
	_, port, _ := net.SplitHostPort(addr)
	const pause = `{"route":"chat","paused":true}`
	for _, tc := range []struct {
		name, host, origin, contentType string
		code                            int
		want                            string
	}{
		{"cross-origin text/plain", "", "http://evil.example", "text/plain;charset=UTF-8", 403, `origin \"http://evil.example\" not allowed`},
		{"cross-origin JSON", "", "https://evil.example", "application/json", 403, "not allowed"},
		{"DNS rebinding", "rebind.evil.example:" + port, "http://rebind.evil.example:" + port, "text/plain", 403, `host \"rebind.evil.example:` + port + `\" not allowed`},
		{"DNS rebinding, JSON", "rebind.evil.example:" + port, "http://rebind.evil.example:" + port, "application/json", 403, "admin.allowed_hosts"},
		{"text/plain without an origin", "", "", "text/plain", 415, "Content-Type: application/json"},
		{"form without an origin", "localhost:" + port, "", "application/x-www-form-urlencoded", 415, "not allowed"},
	} {
		code, body := adminRequest(t, addr, http.MethodPost, tc.host, tc.origin, tc.contentType, pause)
		if code != tc.code || !strings.Contains(body, tc.want) || !strings.HasPrefix(body, `{"error":`) {
			t.Errorf("%s: %d %s, want %d and {\"error\": ...} saying %s", tc.name, code, body, tc.code, tc.want)
		}
		if got := app.Server.Switches().Get("chat"); got.Paused {
			t.Fatalf("%s: Switches().Get(chat) = %s after a refused POST, want it unchanged (on)", tc.name, got)
		}
	}
	if code, body := adminRequest(t, addr, http.MethodGet, "rebind.evil.example:"+port, "", "", ""); code != http.StatusForbidden {
		t.Errorf("GET with a DNS-rebinding Host: %d %s, want 403", code, body)
	}
	allowed := func(name, host string) {
		t.Helper()
		for _, paused := range []bool{true, false} {
			body := `{"route":"chat","paused":` + strconv.FormatBool(paused) + `}`
			if code, answer := adminRequest(t, addr, http.MethodPost, host, "", "application/json", body); code != http.StatusOK {
				t.Errorf("%s: %d %s, want 200", name, code, answer)
			}
			if got := app.Server.Switches().Get("chat"); got.Paused != paused {
				t.Errorf("%s: Switches().Get(chat) = %s after a POST of paused %v, want paused %v", name, got, paused, paused)
			}
		}
	}
	allowed("curl (no Origin, Host 127.0.0.1)", "")
	allowed("Host localhost", "localhost:"+port)
	allowed("configured host", "llmhedge-admin.internal:"+port)

	os.WriteFile(path, config("ops.example"), 0o600)
	if err := app.Reload(); err != nil {
		t.Fatal(err)
	}
	if code, body := adminRequest(t, addr, http.MethodPost, "llmhedge-admin.internal:"+port, "", "application/json", pause); code != http.StatusForbidden {
		t.Errorf("a host the reload removed from admin.allowed_hosts: %d %s, want 403", code, body)
	}
	if got := app.Server.Switches().Get("chat"); got.Paused {
		t.Errorf("Switches().Get(chat) = %s after a refused POST, want it unchanged (on)", got)
	}
	allowed("a host the reload added", "ops.example:"+port)
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
	for _, tc := range []struct {
		host string
		ok   bool
	}{
		{"admin.internal", true}, {"admin.internal:9902", true}, {"10.0.0.5", true}, {"[fd00::1]:9902", true}, {"fd00::1", true},
		{"http://admin.internal", false}, {"admin.internal/switch", false}, {"admin.internal:", false},
		{"admin.internal:99999", false}, {":9902", false}, {"", false},
	} {
		_, err := envoyfilter.ParseConfig([]byte("admin: {listen: 127.0.0.1:9902, allowed_hosts: ['" + tc.host + "']}\nroutes: [{name: chat, upstreams: [{url: http://127.0.0.1:9}]}]"))
		if tc.ok && err != nil {
			t.Errorf("admin.allowed_hosts [%q]: error %v, want none", tc.host, err)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "admin.allowed_hosts[0]")) {
			t.Errorf("admin.allowed_hosts [%q]: error %v, want one naming admin.allowed_hosts[0]", tc.host, err)
		}
	}
}
