package coretest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
)

// Config decodes from its snake_case JSON: the names Caddy's JSON and
// Envoy's YAML use.
func TestConfigDecodesSnakeCaseJSON(t *testing.T) {
	var c core.Config
	err := json.Unmarshal([]byte(`{"route":"r","upstreams":[{"url":"http://a","set_headers":{"K":"v"}}],
		"delay":"50ms","max_body":"8MiB","max_prefix":4096,"timeout":"1m",
		"idempotency":{"ttl":-1,"max_response_bytes":"64KiB"},"budget":{"cool_down":2000000000}}`), &c)
	if err != nil {
		t.Fatal(err)
	}
	if c.Delay.Mode != core.DelayFixed || c.Delay.Fixed.D() != 50*time.Millisecond {
		t.Errorf("delay = %s %v, want fixed 50ms", c.Delay.Mode, c.Delay.Fixed)
	}
	if c.MaxBody != 8<<20 || c.MaxPrefix != 4096 || c.Timeout.D() != time.Minute || c.Idempotency.TTL != -1 ||
		c.Idempotency.MaxResponseBytes != 64<<10 || c.Budget.CoolDown.D() != 2*time.Second || c.Upstreams[0].SetHeaders["K"] != "v" {
		t.Errorf("decoded %+v", c)
	}
	var d core.DelayConfig
	err = json.Unmarshal([]byte(`{"mode":"adaptive","fixd":"1s"}`), &d)
	if err == nil || !strings.Contains(err.Error(), `unknown field "fixd"`) {
		t.Errorf("delay typo: error %v, want unknown field", err)
	}
	// An empty Delay, Idempotency and Budget are left out of the encoding.
	if b, _ := json.Marshal(core.Config{Route: "r"}); string(b) != `{"route":"r"}` {
		t.Errorf("Config{Route: r} encodes as %s", b)
	}
}

// Durations encode as integer nanoseconds, what `caddy adapt` writes.
func TestDurationEncodesAsNanoseconds(t *testing.T) {
	if b, _ := json.Marshal(core.Duration(time.Second)); string(b) != "1000000000" {
		t.Errorf("Duration encodes as %s, want 1000000000", b)
	}
}

// A null option (an empty YAML value) leaves the field at its default.
func TestNullOptionsKeepTheirDefaults(t *testing.T) {
	var c core.Config
	if err := json.Unmarshal([]byte(`{"delay":null,"timeout":null,"max_body":null}`), &c); err != nil {
		t.Fatalf("null options: %v", err)
	}
	if c.Delay != (core.DelayConfig{}) || c.Timeout != 0 || c.MaxBody != 0 {
		t.Errorf("null options changed the config: %+v", c)
	}
}
