package llmsim

import (
	"reflect"
	"testing"
	"time"
)

func TestParseBehaviors(t *testing.T) {
	got, err := ParseBehaviors(" A=status:429,retry_after:2 ; B=reset_after:3;C=error_event,no_pings,ttft:250ms; D=done_early,stall:true,slow_headers:1s;*=status:503")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Behavior{
		"A": {Status: 429, RetryAfter: 2},
		"B": {Reset: true, ResetAfterTokens: 3},
		"C": {ErrorEventBeforeOutput: true, NoPings: true, TTFT: 250 * time.Millisecond},
		"D": {DoneBeforeOutput: true, Stall: true, SlowHeaders: time.Second},
		"*": {Status: 503},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if b, ok := behaviorFor(got, "Z"); !ok || b.Status != 503 {
		t.Fatalf("wildcard not applied: %+v %v", b, ok)
	}
	// Round trip through BehaviorHeader.
	again, err := ParseBehaviors(BehaviorHeader(want))
	if err != nil || !reflect.DeepEqual(again, want) {
		t.Fatalf("round trip: %+v, %v\nheader %q", again, err, BehaviorHeader(want))
	}
	if h := BehaviorHeader(map[string]Behavior{"B": {Stall: true}, "A": {Status: 429}}); h != "A=status:429;B=stall" {
		t.Fatalf("BehaviorHeader = %q", h)
	}
}

func TestParseBehaviorsErrors(t *testing.T) {
	for _, v := range []string{"status:429", "A=bogus", "A=status:x", "A=ttft:soon", "=stall", "A=stall:maybe"} {
		if _, err := ParseBehaviors(v); err == nil {
			t.Errorf("ParseBehaviors(%q) accepted", v)
		}
	}
}
