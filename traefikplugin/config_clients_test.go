package traefikplugin

import (
	"testing"
	"time"
)

// earlyHeaders takes a duration or off in every form YAML delivers it.
func TestEarlyHeadersOption(t *testing.T) {
	cases := map[string]time.Duration{"": 0, "250ms": 250 * time.Millisecond, "off": -1, "false": -1, "0": -1, "0s": -1}
	for v, want := range cases {
		cfg := CreateConfig()
		cfg.Upstreams = []Upstream{{URL: "http://127.0.0.1:9001"}}
		cfg.EarlyHeaders = v
		cfg.HedgeStoredResponses = true
		got, err := cfg.coreConfig("r")
		if err != nil {
			t.Errorf("earlyHeaders %q: %v", v, err)
			continue
		}
		if time.Duration(got.EarlyHeaders) != want && !(v == "" && time.Duration(got.EarlyHeaders) == time.Second) {
			t.Errorf("earlyHeaders %q: engine EarlyHeaders = %v, want %v", v, time.Duration(got.EarlyHeaders), want)
		}
		if !got.HedgeStoredResponses {
			t.Errorf("hedgeStoredResponses did not reach the engine")
		}
	}
	cfg := CreateConfig()
	cfg.Upstreams = []Upstream{{URL: "http://127.0.0.1:9001"}}
	cfg.EarlyHeaders = "soon"
	if _, err := cfg.coreConfig("r"); err == nil {
		t.Errorf(`earlyHeaders "soon" accepted`)
	}
}
