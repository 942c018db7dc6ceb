package fleetstore

import (
	"encoding/json"
	"errors"
	"strconv"
	"time"
)

// This file is the operator's side of fleet mode: the runtime kill switch
// and the replicas' heartbeats, as both the engine and llmhedge-ctl read and
// write them. Key names and value formats here are the wire contract
// between replicas of different versions and the ctl command: change them
// only with a new key name.

// A Switch is the runtime kill switch of a route's hedging. The zero Switch
// changes nothing: hedging runs as configured.
type Switch struct {
	// Paused stops every hedge (retries after failures still run).
	Paused bool
	// Delay overrides the hedge delay; 0 keeps the configured or adaptive one.
	Delay time.Duration
}

// IsZero reports whether s changes nothing.
func (s Switch) IsZero() bool { return !s.Paused && s.Delay == 0 }

// String is how logs and llmhedge-ctl show s: "on", "paused", "delay 250ms".
func (s Switch) String() string {
	if s.Paused {
		return "paused"
	}
	if s.Delay > 0 {
		return "delay " + s.Delay.String()
	}
	return "on"
}

// SwitchAllRoutes is the route name of a switch that applies to every route.
const SwitchAllRoutes string = "*"

// MergeSwitches returns the switch in force given switches from the most
// specific to the least (process route, process all, fleet route, fleet
// all): a pause anywhere wins, and the most specific delay override wins.
func MergeSwitches(switches ...Switch) Switch {
	var out Switch
	for _, s := range switches {
		if s.Paused {
			out.Paused = true
		}
		if out.Delay == 0 && s.Delay > 0 {
			out.Delay = s.Delay
		}
	}
	return out
}

// switchWire is a Switch as stored in Redis and sent by admin endpoints.
type switchWire struct {
	Paused  bool  `json:"paused,omitempty"`
	DelayMS int64 `json:"delay_ms,omitempty"`
}

// EncodeSwitch is s in its wire form: JSON {"paused":true,"delay_ms":250}.
func EncodeSwitch(s Switch) string {
	w := switchWire{Paused: s.Paused, DelayMS: int64(s.Delay / time.Millisecond)}
	b, _ := json.Marshal(w)
	return string(b)
}

// DecodeSwitch parses EncodeSwitch's form.
func DecodeSwitch(v string) (Switch, error) {
	var w switchWire
	if err := json.Unmarshal([]byte(v), &w); err != nil {
		return Switch{}, errors.New("llmhedge: switch: not {\"paused\":bool,\"delay_ms\":int}")
	}
	if w.DelayMS < 0 {
		return Switch{}, errors.New("llmhedge: switch: negative delay_ms")
	}
	return Switch{Paused: w.Paused, Delay: time.Duration(w.DelayMS) * time.Millisecond}, nil
}

// Fleet key names. Switch keys carry no TTL on purpose (a pause must hold
// until an operator resumes); there is at most one per route, and a switch
// set back to the zero Switch is deleted. Every other key expires.
//
// A route's keys share the hash tag {r:<route>} and the fleet-wide ones
// the tag {fleet}, so that every script's keys are on one slot of a Redis
// Cluster: <prefix>{r:<route>}:switch, <prefix>{r:*}:switch (every
// route's: a slot of its own, read with a command of its own),
// <prefix>{fleet}:replica:<id>, <prefix>{fleet}:live.

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

// ParseSwitchDelay parses llmhedge-ctl's and the admin endpoints' delay
// argument: a duration ("250ms") or "auto" (back to the configured delay).
func ParseSwitchDelay(s string) (time.Duration, error) {
	if s == "auto" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, errors.New("llmhedge: delay " + strconv.Quote(s) + ": want a positive duration like 250ms, or auto")
	}
	return d, nil
}
