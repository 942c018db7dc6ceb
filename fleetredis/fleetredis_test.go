package fleetredis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

func do(t *testing.T, c *Client, args ...string) (fleetstore.RedisValue, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := c.Do(ctx, args...)
	return v, err
}

// Replies map onto fleetstore.RedisValue: strings, integers, nil, arrays (nested,
// with nil elements), and error replies are errors with Redis' code first.
func TestRepliesConvert(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c, err := New(config.FleetConfig{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if v, err := do(t, c, "SET", "k", "a\x00b"); err != nil || v.Kind != fleetstore.RedisString || v.Str != "OK" {
		t.Errorf("SET: %+v, %v; want the string OK", v, err)
	}
	if v, _ := do(t, c, "GET", "k"); v.Str != "a\x00b" {
		t.Errorf("GET = %q, want the binary value back", v.Str)
	}
	if v, _ := do(t, c, "GET", "missing"); v.Kind != fleetstore.RedisNil {
		t.Errorf("GET missing: kind %d, want RedisNil", v.Kind)
	}
	if v, _ := do(t, c, "INCR", "n"); v.Kind != fleetstore.RedisInt || v.Int != 1 {
		t.Errorf("INCR = %+v, want the integer 1", v)
	}
	if v, _ := do(t, c, "MGET", "k", "missing"); v.Kind != fleetstore.RedisArray || len(v.Array) != 2 || v.Array[1].Kind != fleetstore.RedisNil {
		t.Errorf("MGET = %+v, want [value, nil]", v)
	}
	if _, err := do(t, c, "EVALSHA", strings.Repeat("0", 40), "0"); err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
		t.Errorf("EVALSHA of an unknown script: %v, want a NOSCRIPT error", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := c.Pipeline(ctx, [][]string{{"XADD", "s", "*", "t", "d", "v", "x"}, {"PEXPIRE", "s", "1000"}})
	if err != nil || len(out) != 2 || out[1].Int != 1 {
		t.Errorf("pipeline: %+v, %v", out, err)
	}
	if _, err := c.Pipeline(ctx, [][]string{{"SET", "k", "v"}, {"INCR", "k"}}); err == nil {
		t.Error("pipeline with an error reply: no error")
	}
}

// The password in the URL or from password_env, and rediss:// with the
// server's CA.
func TestAuthAndTLS(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{Password: "s3cret-pw", TLS: true})
	c, err := New(config.FleetConfig{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if v, err := do(t, c, "PING"); err != nil || v.Str != "PONG" {
		t.Errorf("PING with the URL's password: %+v, %v", v, err)
	}
	t.Setenv("LLMHEDGE_TEST_REDIS_PW", "s3cret-pw")
	bare := strings.Replace(srv.URL(), ":s3cret-pw@", "", 1)
	e, _ := New(config.FleetConfig{URL: bare, PasswordEnv: "LLMHEDGE_TEST_REDIS_PW"})
	defer e.Close()
	if _, err := do(t, e, "PING"); err != nil {
		t.Errorf("PING with password_env: %v", err)
	}
	s, err := NewWithRoots(config.FleetConfig{URL: srv.TLSURL()}, srv.CAPool)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, err := do(t, s, "PING"); err != nil || v.Str != "PONG" {
		t.Errorf("PING over rediss://: %+v, %v", v, err)
	}
	if c.Name() != srv.Addr()+"/0" || strings.Contains(c.Name(), "s3cret") {
		t.Errorf("Name() = %q, want %s/0 without the password", c.Name(), srv.Addr())
	}
}
