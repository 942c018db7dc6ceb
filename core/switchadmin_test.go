package core

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func serveSwitchAdmin(t *testing.T, method, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	ServeSwitchAdmin(rec, httptest.NewRequest(method, "/switch", strings.NewReader(body)))
	return rec.Code, rec.Body.String()
}

func TestSwitchAdminPostChangesOnlyTheFieldsGiven(t *testing.T) {
	defer SetProcessSwitch("chat", Switch{})
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
	if got := ProcessSwitch("chat"); !got.Paused || got.Delay != 250*time.Millisecond {
		t.Errorf("ProcessSwitch(chat) = paused %v delay %v, want paused with delay 250ms kept", got.Paused, got.Delay)
	}
	serveSwitchAdmin(t, http.MethodPost, `{"route":"chat","paused":false,"delay":"auto"}`)
	if got := ProcessSwitches(); len(got) != 0 {
		t.Errorf("ProcessSwitches() = %q after resume and auto, want none (a zero switch is removed)", got)
	}
}

// Requests skip the switch lookup while processSwitchCount is 0: a switch
// set through the admin endpoint must count.
func TestSwitchAdminPostIsSeenByRequests(t *testing.T) {
	defer SetProcessSwitch("chat", Switch{})
	serveSwitchAdmin(t, http.MethodPost, `{"route":"chat","paused":true}`)
	if n := atomic.LoadInt64(&processSwitchCount); n != 1 {
		t.Errorf("processSwitchCount = %d after a POST pause, want 1 (requests would not look the switch up)", n)
	}
	serveSwitchAdmin(t, http.MethodPost, `{"route":"chat","paused":false}`)
	if n := atomic.LoadInt64(&processSwitchCount); n != 0 {
		t.Errorf("processSwitchCount = %d after a POST resume, want 0", n)
	}
}

func TestSwitchAdminGetListsAndNoRouteIsAll(t *testing.T) {
	defer SetProcessSwitch(SwitchAllRoutes, Switch{})
	serveSwitchAdmin(t, http.MethodPost, `{"paused":true}`)
	code, body := serveSwitchAdmin(t, http.MethodGet, "")
	if code != 200 {
		t.Fatalf("GET: status %d, want 200", code)
	}
	var list struct{ Switches []SwitchEntry }
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
	if got := ProcessSwitches(); len(got) != 0 {
		t.Errorf("ProcessSwitches() = %q after bad requests, want none", got)
	}
}
