package coretest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// Config decodes from its snake_case JSON: the names Caddy's JSON and
// Envoy's YAML use.
func TestConfigDecodesSnakeCaseJSON(t *testing.T) {
	var c config.Config
	err := json.Unmarshal([]byte(`{"route":"r","upstreams":[{"url":"http://a","set_headers":{"K":"v"}}],
		"delay":"50ms","max_body":"8MiB","max_prefix":4096,"timeout":"1m",
		"idempotency":{"ttl":-1,"max_response_bytes":"64KiB"},"budget":{"cool_down":2000000000}}`), &c)
	if err != nil {
		t.Fatal(err)
	}
	if c.Delay.Mode != config.DelayFixed {
		t.Errorf("c.Delay.Mode = %v, want config.DelayFixed", c.Delay.Mode)
	} else if c.Delay.Fixed.D() != 50*time.Millisecond {
		t.Errorf("c.Delay.Fixed.D() = %v, want %v", c.Delay.Fixed.D(), 50*time.Millisecond)
	}
	if c.MaxBody != 8<<20 {
		t.Errorf("c.MaxBody = %v, want %v", c.MaxBody, 8<<20)
	} else if c.MaxPrefix != 4096 {
		t.Errorf("c.MaxPrefix = %v, want 4096", c.MaxPrefix)
	} else if c.Timeout.D() != time.Minute {
		t.Errorf("c.Timeout.D() = %v, want time.Minute", c.Timeout.D())
	} else if c.Idempotency.TTL != -1 {
		t.Errorf("c.Idempotency.TTL = %v, want -1", c.Idempotency.TTL)
	} else if c.Idempotency.MaxResponseBytes != 64<<10 {
		t.Errorf("c.Idempotency.MaxResponseBytes = %v, want %v", c.Idempotency.MaxResponseBytes, 64<<10)
	} else if c.Budget.CoolDown.D() != 2*time.Second {
		t.Errorf("c.Budget.CoolDown.D() = %v, want %v", c.Budget.CoolDown.D(), 2*time.Second)
	} else if c.Upstreams[0].SetHeaders["K"] != "v" {
		t.Errorf("c.Upstreams[0].SetHeaders[\"K\"] = %q, want \"v\"", c.Upstreams[0].SetHeaders["K"])
	}
	var d config.DelayConfig
	err = json.Unmarshal([]byte(`{"mode":"adaptive","fixd":"1s"}`), &d)
	if err == nil {
		t.Errorf("delay typo: err = nil, want an error")
	} else if !strings.Contains(err.Error(), `unknown field "fixd"`) {
		t.Errorf("delay typo: err.Error() = %q, want it to contain `unknown field \"fixd\"`", err.Error())
	}
	// An empty Delay, Idempotency and Budget are left out of the encoding.
	if b, _ := json.Marshal(config.Config{Route: "r"}); string(b) != `{"route":"r"}` {
		t.Errorf("Config{Route: r} encodes as %s", b)
	}
}

// Durations encode as integer nanoseconds, what `caddy adapt` writes.
func TestDurationEncodesAsNanoseconds(t *testing.T) {
	if b, _ := json.Marshal(config.Duration(time.Second)); string(b) != "1000000000" {
		t.Errorf("Duration encodes as %s, want 1000000000", b)
	}
}

// A null option (an empty YAML value) leaves the field at its default.
func TestNullOptionsKeepTheirDefaults(t *testing.T) {
	var c config.Config
	if err := json.Unmarshal([]byte(`{"delay":null,"timeout":null,"max_body":null}`), &c); err != nil {
		t.Fatalf("null options: %v", err)
	}
	if c.Delay != (config.DelayConfig{}) {
		t.Errorf("null options changed the config: c.Delay = %v, want %v", c.Delay, (config.DelayConfig{}))
	} else if c.Timeout != 0 {
		t.Errorf("null options changed the config: c.Timeout = %v, want 0", c.Timeout)
	} else if c.MaxBody != 0 {
		t.Errorf("null options changed the config: c.MaxBody = %v, want 0", c.MaxBody)
	}
}
