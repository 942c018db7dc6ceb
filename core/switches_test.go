package core

import (
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"
)

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
