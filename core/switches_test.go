package core

import (
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"
)

func TestMergeSwitchesPauseWinsAndSpecificDelayWins(t *testing.T) {
	got := fleetstore.MergeSwitches(fleetstore.Switch{Delay: 100 * time.Millisecond}, fleetstore.Switch{}, fleetstore.Switch{Paused: true, Delay: time.Second})
	if !got.Paused {
		t.Errorf("Paused = false, want true (a pause anywhere wins)")
	}
	if got.Delay != 100*time.Millisecond {
		t.Errorf("Delay = %v, want 100ms (the most specific override)", got.Delay)
	}
}

func TestSwitchWireRoundTrip(t *testing.T) {
	for _, s := range []fleetstore.Switch{{}, {Paused: true}, {Delay: 250 * time.Millisecond}} {
		back, err := fleetstore.DecodeSwitch(fleetstore.EncodeSwitch(s))
		if err != nil {
			t.Fatalf("DecodeSwitch(%q): %v", fleetstore.EncodeSwitch(s), err)
		}
		if back != s {
			t.Errorf("round trip of %q = %q, want %q", fleetstore.EncodeSwitch(s), back.String(), s.String())
		}
	}
	if _, err := fleetstore.DecodeSwitch("paused"); err == nil {
		t.Errorf("DecodeSwitch(%q): no error, want one", "paused")
	}
}

func TestProcessSwitchMergesRouteAndAll(t *testing.T) {
	testSwitches := NewSwitches()
	testSwitches.Set("r1", fleetstore.Switch{Delay: 50 * time.Millisecond})
	testSwitches.Set(fleetstore.SwitchAllRoutes, fleetstore.Switch{Paused: true})
	defer testSwitches.Set("r1", fleetstore.Switch{})
	defer testSwitches.Set(fleetstore.SwitchAllRoutes, fleetstore.Switch{})
	if got := testSwitches.Get("r1"); !got.Paused || got.Delay != 50*time.Millisecond {
		t.Errorf("testSwitches.Get(r1) = %s, want paused with delay 50ms", got)
	}
	if got := testSwitches.Get("r2"); got.String() != "paused" {
		t.Errorf("testSwitches.Get(r2) = %s, want paused", got)
	}
	testSwitches.Set(fleetstore.SwitchAllRoutes, fleetstore.Switch{})
	if n := len(testSwitches.List()); n != 1 {
		t.Errorf("len(testSwitches.List()) = %d after clearing *, want 1", n)
	}
}

func TestParseSwitchDelay(t *testing.T) {
	if d, err := fleetstore.ParseSwitchDelay("auto"); err != nil || d != 0 {
		t.Errorf("ParseSwitchDelay(auto) = %v, %v; want 0, nil", d, err)
	}
	if d, err := fleetstore.ParseSwitchDelay("250ms"); err != nil || d != 250*time.Millisecond {
		t.Errorf("ParseSwitchDelay(250ms) = %v, %v; want 250ms, nil", d, err)
	}
	if _, err := fleetstore.ParseSwitchDelay("-1s"); err == nil {
		t.Errorf("ParseSwitchDelay(-1s): no error, want one")
	}
}
