package caddymodule

import (
	"testing"
	"time"
)

// early_headers takes a duration or off; hedge_stored_responses is a flag.
func TestCaddyfileEarlyHeadersAndStoredResponses(t *testing.T) {
	for src, want := range map[string]time.Duration{"early_headers 250ms": 250 * time.Millisecond, "early_headers off": -1} {
		h, err := parse(t, "llm_hedge http://a.test {\n\t"+src+"\n\thedge_stored_responses\n}")
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if got := time.Duration(h.Config.EarlyHeaders); got != want {
			t.Errorf("%s: EarlyHeaders = %v, want %v", src, got, want)
		}
		if !h.Config.HedgeStoredResponses {
			t.Errorf("%s: HedgeStoredResponses = false, want true", src)
		}
	}
}
