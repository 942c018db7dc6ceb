package core

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// adminSwitches is the table the admin endpoint of these tests serves.
var adminSwitches = NewSwitches()

func serveSwitchAdmin(t *testing.T, method, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, "/switch", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	ServeSwitchAdmin(adminSwitches, rec, req)
	return rec.Code, rec.Body.String()
}

func TestSwitchAdminPostChangesOnlyTheFieldsGiven(t *testing.T) {
	defer adminSwitches.Set("chat", fleetstore.Switch{})
	if code, body := serveSwitchAdmin(t, http.MethodPost, `{"route":"chat","delay":"250ms"}`); code != 200 {
		t.Fatalf("POST delay: status %d, want 200: %s", code, body)
	}
	code, body := serveSwitchAdmin(t, http.MethodPost, `{"route":"chat","paused":true}`)
	if code != 200 {
		t.Fatalf("POST paused: status %d, want 200: %s", code, body)
	}
	var change struct{ Route, Before, After string }
	if err := json.Unmarshal([]byte(body), &change); err != nil {
		t.Fatal(err)
	}
	if change.Before != "delay 250ms" || change.After != "paused, delay 250ms" {
		t.Errorf("before, after = %q, %q, want \"delay 250ms\", \"paused, delay 250ms\"", change.Before, change.After)
	}
	if got := adminSwitches.Get("chat"); !got.Paused || got.Delay != 250*time.Millisecond {
		t.Errorf("adminSwitches.Get(chat) = paused %v delay %v, want paused with delay 250ms kept", got.Paused, got.Delay)
	}
	serveSwitchAdmin(t, http.MethodPost, `{"route":"chat","paused":false,"delay":"auto"}`)
	if got := adminSwitches.List(); len(got) != 0 {
		t.Errorf("adminSwitches.List() = %q after resume and auto, want none (a zero switch is removed)", got)
	}
}

// Requests skip the switch lookup while the table's count is 0: a switch
// set through the admin endpoint must count.
func TestSwitchAdminPostIsSeenByRequests(t *testing.T) {
	defer adminSwitches.Set("chat", fleetstore.Switch{})
	serveSwitchAdmin(t, http.MethodPost, `{"route":"chat","paused":true}`)
	if n := atomic.LoadInt64(&adminSwitches.count); n != 1 {
		t.Errorf("the switch count = %d after a POST pause, want 1 (requests would not look the switch up)", n)
	}
	serveSwitchAdmin(t, http.MethodPost, `{"route":"chat","paused":false}`)
	if n := atomic.LoadInt64(&adminSwitches.count); n != 0 {
		t.Errorf("the switch count = %d after a POST resume, want 0", n)
	}
}

func TestSwitchAdminGetListsAndNoRouteIsAll(t *testing.T) {
	defer adminSwitches.Set(fleetstore.SwitchAllRoutes, fleetstore.Switch{})
	serveSwitchAdmin(t, http.MethodPost, `{"paused":true}`)
	code, body := serveSwitchAdmin(t, http.MethodGet, "")
	if code != 200 {
		t.Fatalf("GET: status %d, want 200", code)
	}
	var list struct{ Switches []fleetstore.SwitchEntry }
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Switches) != 1 || list.Switches[0].Route != "*" || !list.Switches[0].Paused {
		t.Errorf("GET switches = %s, want one: route * paused", body)
	}
}

func TestSwitchAdminRejectsBadRequests(t *testing.T) {
	for _, tc := range []struct {
		method, body, want string
		code               int
	}{
		{"POST", `{"route":"chat","pause":true}`, "unknown field", 400},
		{"POST", `{"route":"chat"}`, "nothing to change", 400},
		{"POST", `{"route":"chat","delay":"-1s"}`, "positive duration", 400},
		{"POST", `not json`, "want JSON", 400},
		{"DELETE", ``, "not allowed", 405},
	} {
		code, body := serveSwitchAdmin(t, tc.method, tc.body)
		if code != tc.code || !strings.Contains(body, tc.want) || !strings.Contains(body, `"error"`) {
			t.Errorf("%s %s: %d %s, want %d with an error saying %q", tc.method, tc.body, code, body, tc.code, tc.want)
		}
	}
	if got := adminSwitches.List(); len(got) != 0 {
		t.Errorf("adminSwitches.List() = %q after bad requests, want none", got)
	}
}

// adminCall is one request to the switch of an admin listener (what
// ServeSwitchAdminListener serves), allowed hosts
// "admin.internal" (any port) and "ops.example:8443"; origin and
// contentType "" send none.
type adminCall struct {
	name, method, host, origin, contentType, body string
}

func (c adminCall) serve(t *testing.T, local string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(c.method, "/switch", strings.NewReader(c.body))
	req.Host = c.host
	if c.origin != "" {
		req.Header.Set("Origin", c.origin)
	}
	if c.contentType != "" {
		req.Header.Set("Content-Type", c.contentType)
	}
	addr, err := net.ResolveTCPAddr("tcp", local)
	if err != nil {
		t.Fatal(err)
	}
	req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, net.Addr(addr)))
	rec := httptest.NewRecorder()
	ServeSwitchAdminListener(adminSwitches, rec, req, []string{"admin.internal", "ops.example:8443"}, "admin.allowed_hosts")
	return rec.Code, rec.Body.String()
}

const pauseChat = `{"route":"chat","paused":true}`

// What a web page on the host could send is refused, and the switch does
// not change: a foreign Origin, a Host a DNS-rebinding name brings, a
// text/plain or form body (a cross-origin POST a browser sends without a
// preflight).
func TestSwitchAdminListenerRefusesWhatAPageCouldSend(t *testing.T) {
	defer adminSwitches.Set("chat", fleetstore.Switch{})
	const local = "127.0.0.1:9902"
	for _, tc := range []struct {
		call adminCall
		code int
		want string
	}{
		{adminCall{"foreign origin", "POST", local, "http://evil.example", "application/json", pauseChat}, 403, `origin \"http://evil.example\" not allowed`},
		{adminCall{"foreign origin, GET", "GET", local, "https://evil.example", "", ""}, 403, "not allowed"},
		{adminCall{"null origin", "POST", local, "null", "application/json", pauseChat}, 403, `origin \"null\" not allowed`},
		{adminCall{"loopback origin of another port", "POST", local, "http://localhost:3000", "application/json", pauseChat}, 403, "not allowed"},
		{adminCall{"DNS rebinding", "POST", "rebind.evil.example:9902", "http://rebind.evil.example:9902", "application/json", pauseChat}, 403, `host \"rebind.evil.example:9902\" not allowed`},
		{adminCall{"DNS rebinding, no origin", "POST", "rebind.evil.example:9902", "", "application/json", pauseChat}, 403, "admin.allowed_hosts"},
		{adminCall{"DNS rebinding, GET", "GET", "rebind.evil.example:9902", "", "", ""}, 403, "not allowed"},
		{adminCall{"allowed host on another port", "POST", "ops.example:9902", "", "application/json", pauseChat}, 403, "not allowed"},
		{adminCall{"another address", "POST", "10.1.2.3:9902", "", "application/json", pauseChat}, 403, "not allowed"},
		{adminCall{"no host", "POST", "", "", "application/json", pauseChat}, 403, "not allowed"},
		{adminCall{"text/plain", "POST", local, "", "text/plain", pauseChat}, 415, "content type text/plain not allowed"},
		{adminCall{"text/plain from a page", "POST", local, "http://evil.example", "text/plain", pauseChat}, 403, "not allowed"},
		{adminCall{"form", "POST", local, "", "application/x-www-form-urlencoded", pauseChat}, 415, "application/json"},
		{adminCall{"no content type", "POST", local, "", "", pauseChat}, 415, "content type none not allowed"},
	} {
		code, body := tc.call.serve(t, local)
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want %d with an error saying %s", tc.call.name, code, strings.TrimSpace(body), tc.code, tc.want)
		}
		var e struct{ Error string }
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == "" {
			t.Errorf("%s: body %q is not {\"error\": ...} (%v)", tc.call.name, body, err)
		}
		if got := adminSwitches.Get("chat"); got.Paused {
			t.Fatalf("%s: adminSwitches.Get(chat) = %s after a refused request, want it unchanged (on)", tc.call.name, got)
		}
	}
}

// What curl, scripts and llmhedge-ctl send passes: no Origin, a loopback
// Host by any name, the listener's own address, a configured host, the
// endpoint's own origin.
func TestSwitchAdminListenerAllowsLocalCallers(t *testing.T) {
	defer adminSwitches.Set("chat", fleetstore.Switch{})
	for _, tc := range []struct {
		local string
		call  adminCall
	}{
		{"127.0.0.1:9902", adminCall{"curl", "POST", "127.0.0.1:9902", "", "application/json", ""}},
		{"127.0.0.1:9902", adminCall{"localhost", "POST", "localhost:9902", "", "application/json; charset=utf-8", ""}},
		{"[::1]:9902", adminCall{"IPv6 loopback", "POST", "[::1]:9902", "", "application/json", ""}},
		{"10.1.2.3:9902", adminCall{"the listener's own address", "POST", "10.1.2.3:9902", "", "application/json", ""}},
		{"10.1.2.3:9902", adminCall{"configured host", "POST", "admin.internal:9902", "", "application/json", ""}},
		{"10.1.2.3:8443", adminCall{"configured host:port", "POST", "ops.example:8443", "", "application/json", ""}},
		{"10.1.2.3:9902", adminCall{"own origin", "POST", "admin.internal:9902", "http://admin.internal:9902", "application/json", ""}},
		{"127.0.0.1:9902", adminCall{"loopback origin of this port", "POST", "127.0.0.1:9902", "http://localhost:9902", "application/json", ""}},
	} {
		for _, paused := range []bool{true, false} {
			c := tc.call
			c.body = `{"route":"chat","paused":` + strconv.FormatBool(paused) + `}`
			code, body := c.serve(t, tc.local)
			if code != 200 {
				t.Errorf("%s (paused %v): %d %s, want 200", c.name, paused, code, strings.TrimSpace(body))
			}
			if got := adminSwitches.Get("chat"); got.Paused != paused {
				t.Errorf("%s: adminSwitches.Get(chat) = %s after a POST of paused %v, want paused %v", c.name, got, paused, paused)
			}
		}
	}
	get := adminCall{"GET", "GET", "localhost:9902", "", "", ""}
	if code, body := get.serve(t, "127.0.0.1:9902"); code != 200 {
		t.Errorf("GET with no content type: %d %s, want 200", code, body)
	}
}

// Caddy's admin API checks the Host itself; ServeSwitchAdmin still
// refuses a foreign Origin and a body not declared JSON.
func TestSwitchAdminRefusesForeignOriginAndPlainText(t *testing.T) {
	defer adminSwitches.Set("chat", fleetstore.Switch{})
	for _, tc := range []struct {
		origin, contentType string
		code                int
	}{
		{"http://evil.example", "application/json", 403},
		{"", "text/plain;charset=UTF-8", 415},
		{"http://localhost:2019", "application/json", 200},
	} {
		req := httptest.NewRequest("POST", "http://localhost:2019/llm_hedge/switch", strings.NewReader(pauseChat))
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		req.Header.Set("Content-Type", tc.contentType)
		rec := httptest.NewRecorder()
		ServeSwitchAdmin(adminSwitches, rec, req)
		if rec.Code != tc.code {
			t.Errorf("Origin %q, Content-Type %q: %d %s, want %d", tc.origin, tc.contentType, rec.Code, strings.TrimSpace(rec.Body.String()), tc.code)
		}
		if got, want := adminSwitches.Get("chat").Paused, tc.code == 200; got != want {
			t.Errorf("Origin %q, Content-Type %q: adminSwitches.Get(chat).Paused = %v, want %v", tc.origin, tc.contentType, got, want)
		}
	}
}
