package core

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"
)

// This file is the per-process kill switch's HTTP surface, one for every
// host with an admin API: the Caddy module registers ServeSwitchAdmin on
// Caddy's admin API, the Envoy server on its admin listener. Both serve
// the same JSON, so an operator's script works against either.

// ChangeSwitch returns s with the changes an operator asked for: paused
// (nil: unchanged) and delay (nil: unchanged; 0: back to the configured
// or adaptive delay). llmhedge-ctl and the admin endpoints share it.
func ChangeSwitch(s Switch, paused *bool, delay *time.Duration) Switch {
	out := s
	if paused != nil {
		out.Paused = *paused
	}
	if delay != nil {
		out.Delay = *delay
	}
	return out
}

// DescribeSwitch is s as operators read it: String's form, except that a
// pause with a delay override names both ("paused, delay 250ms"), so that
// a change of either shows.
func DescribeSwitch(s Switch) string {
	if s.Paused && s.Delay > 0 {
		return "paused, delay " + s.Delay.String()
	}
	return s.String()
}

// UpdateProcessSwitch changes this process's own switch for route (not
// merged with the one for every route) under one lock, and returns it
// before and after.
func UpdateProcessSwitch(route string, paused *bool, delay *time.Duration) (Switch, Switch) {
	processSwitches.mu.Lock()
	before := processSwitches.m[route]
	after := ChangeSwitch(before, paused, delay)
	storeProcessSwitchLocked(route, after)
	processSwitches.mu.Unlock()
	return before, after
}

// SwitchEntry is one route's switch as the admin endpoints and
// llmhedge-ctl -json show it.
type SwitchEntry struct {
	Route  string `json:"route"`
	Paused bool   `json:"paused"`
	// Delay is the delay override ("250ms"), "" for none.
	Delay string `json:"delay,omitempty"`
	// Switch is DescribeSwitch's form: "paused", "delay 250ms", "on".
	Switch string `json:"switch"`
}

// NewSwitchEntry is route's switch s as a SwitchEntry.
func NewSwitchEntry(route string, s Switch) SwitchEntry {
	e := SwitchEntry{Route: route, Paused: s.Paused, Switch: DescribeSwitch(s)}
	if s.Delay > 0 {
		e.Delay = s.Delay.String()
	}
	return e
}

// processSwitchEntries lists this process's switches, sorted by route.
func processSwitchEntries() []SwitchEntry {
	processSwitches.mu.Lock()
	out := make([]SwitchEntry, 0, len(processSwitches.m))
	for route, s := range processSwitches.m {
		out = append(out, NewSwitchEntry(route, s))
	}
	processSwitches.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Route < out[j].Route })
	return out
}

// switchAdminRequest is the body of a POST: {"route": "chat", "paused":
// true, "delay": "250ms"|"auto"}. A field left out is left unchanged; no
// route (or "*") is the switch of every route.
type switchAdminRequest struct {
	Route  string  `json:"route"`
	Paused *bool   `json:"paused"`
	Delay  *string `json:"delay"`
}

// switchAdminList is the answer to a GET, and part of a POST's.
type switchAdminList struct {
	Switches []SwitchEntry `json:"switches"`
}

// switchAdminChange is the answer to a POST.
type switchAdminChange struct {
	Route    string        `json:"route"`
	Before   string        `json:"before"`
	After    string        `json:"after"`
	Switches []SwitchEntry `json:"switches"`
}

// maxSwitchAdminBody bounds a POST's body.
const maxSwitchAdminBody int64 = 64 << 10

// ParseSwitchAdminRequest decodes a POST body into the route and the
// changes it asks for. Unknown fields are errors, so a typo ("pause")
// never silently changes nothing.
func ParseSwitchAdminRequest(body []byte) (string, *bool, *time.Duration, error) {
	var req switchAdminRequest
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return "", nil, nil, errors.New("body: want JSON {\"route\": \"NAME\", \"paused\": true|false, \"delay\": \"250ms\"|\"auto\"}: " + err.Error())
	}
	route := strings.TrimSpace(req.Route)
	if route == "" {
		route = SwitchAllRoutes
	}
	if req.Paused == nil && req.Delay == nil {
		return "", nil, nil, errors.New("body: nothing to change: set paused or delay")
	}
	var delay *time.Duration
	if req.Delay != nil {
		d, err := ParseSwitchDelay(*req.Delay)
		if err != nil {
			return "", nil, nil, err
		}
		delay = &d
	}
	return route, req.Paused, delay, nil
}

// ServeSwitchAdmin serves the per-process switch: GET lists this
// process's switches, POST changes one (body as ParseSwitchAdminRequest
// reads it) and answers with the route's switch before and after and the
// list. Errors are {"error": "..."} with a 4xx status, as Caddy's admin API
// answers its own.
func ServeSwitchAdmin(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		writeSwitchAdmin(w, http.StatusOK, switchAdminList{Switches: processSwitchEntries()})
	case http.MethodPost:
		body, err := io.ReadAll(io.LimitReader(r.Body, maxSwitchAdminBody+1))
		if err != nil {
			writeSwitchAdminError(w, http.StatusBadRequest, "reading the body: "+err.Error())
			return
		}
		if int64(len(body)) > maxSwitchAdminBody {
			writeSwitchAdminError(w, http.StatusRequestEntityTooLarge, "body larger than 64KiB")
			return
		}
		route, paused, delay, err := ParseSwitchAdminRequest(body)
		if err != nil {
			writeSwitchAdminError(w, http.StatusBadRequest, err.Error())
			return
		}
		before, after := UpdateProcessSwitch(route, paused, delay)
		writeSwitchAdmin(w, http.StatusOK, switchAdminChange{
			Route: route, Before: DescribeSwitch(before), After: DescribeSwitch(after), Switches: processSwitchEntries(),
		})
	default:
		w.Header().Set("Allow", "GET, POST")
		writeSwitchAdminError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed: GET lists the switches, POST changes one")
	}
}

func writeSwitchAdminError(w http.ResponseWriter, status int, msg string) {
	writeSwitchAdmin(w, status, map[string]string{"error": msg})
}

func writeSwitchAdmin(w http.ResponseWriter, status int, v interface{}) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
