package fleetstore

import (
	"testing"
	"time"
)

func TestMergeSwitchesPauseWinsAndSpecificDelayWins(t *testing.T) {
	got := MergeSwitches(Switch{Delay: 100 * time.Millisecond}, Switch{}, Switch{Paused: true, Delay: time.Second})
	if !got.Paused {
		t.Errorf("Paused = false, want true (a pause anywhere wins)")
	}
	if got.Delay != 100*time.Millisecond {
		t.Errorf("Delay = %v, want 100ms (the most specific override)", got.Delay)
	}
}

func TestSwitchWireRoundTrip(t *testing.T) {
	for _, s := range []Switch{{}, {Paused: true}, {Delay: 250 * time.Millisecond}} {
		back, err := DecodeSwitch(EncodeSwitch(s))
		if err != nil {
			t.Fatalf("DecodeSwitch(%q): %v", EncodeSwitch(s), err)
		}
		if back != s {
			t.Errorf("round trip of %q = %q, want %q", EncodeSwitch(s), back.String(), s.String())
		}
	}
	if _, err := DecodeSwitch("paused"); err == nil {
		t.Errorf("DecodeSwitch(%q): no error, want one", "paused")
	}
}

func TestParseSwitchDelay(t *testing.T) {
	if d, err := ParseSwitchDelay("auto"); err != nil || d != 0 {
		t.Errorf("ParseSwitchDelay(auto) = %v, %v; want 0, nil", d, err)
	}
	if d, err := ParseSwitchDelay("250ms"); err != nil || d != 250*time.Millisecond {
		t.Errorf("ParseSwitchDelay(250ms) = %v, %v; want 250ms, nil", d, err)
	}
	if _, err := ParseSwitchDelay("-1s"); err == nil {
		t.Errorf("ParseSwitchDelay(-1s): no error, want one")
	}
}
