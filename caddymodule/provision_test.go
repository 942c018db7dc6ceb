package caddymodule

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// newCaddyContext returns a Caddy context with its own metrics registry, as
// one loaded config has, and cancels it (running cleanups) at the end.
func newCaddyContext(t *testing.T) caddy.Context {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return ctx
}

// provisionJSON decodes a handler from its JSON config, provisions and
// validates it like Caddy does, and cleans it up at the end of the test.
func provisionJSON(t *testing.T, ctx caddy.Context, config string) (*Handler, error) {
	t.Helper()
	h := new(Handler)
	if err := json.Unmarshal([]byte(config), h); err != nil {
		t.Fatalf("decoding %s: %v", config, err)
	}
	t.Cleanup(func() {
		if err := h.Cleanup(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := h.Provision(ctx); err != nil {
		return h, err
	}
	return h, h.Validate()
}

func TestProvisionValidateErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, config string
		want         []string
	}{
		{"no upstream", `{}`, []string{"at least one upstream is required"}},
		{"bad scheme", `{"upstreams":[{"url":"ftp://a"}]}`, []string{`url "ftp://a": scheme must be http or https`}},
		{"fragment in url", `{"upstreams":[{"url":"http://a/?key=1#x"}]}`, []string{"must not have a fragment"}},
		{"bad header name", `{"upstreams":[{"url":"http://a","set_headers":{"Bad Header":"x"}}]}`, []string{`header name "Bad Header" is not a valid token`}},
		{"quantile", `{"upstreams":[{"url":"http://a"}],"delay":{"mode":"adaptive","quantile":1.5}}`, []string{"quantile 1.5 must be between 0 and 1"}},
		{"delay mode", `{"upstreams":[{"url":"http://a"}],"delay":{"mode":"smart"}}`, []string{`delay mode "smart"`}},
		{"first event", `{"upstreams":[{"url":"http://a"}],"first_event":"gemini"}`, []string{`first_event "gemini"`}},
		{"every problem at once", `{"max_attempts":50,"log_level":"loud","transport":{"versions":["3"]}}`,
			[]string{"at least one upstream", "max_attempts 50", `log_level "loud"`, `unknown HTTP version "3"`}},
		{"h1 and h2c", `{"upstreams":[{"url":"http://a"}],"transport":{"versions":["1.1","h2c"]}}`, []string{"1.1 and h2c exclude each other"}},
		{"missing CA file", `{"upstreams":[{"url":"https://a"}],"transport":{"tls_trusted_ca_certs":["/nonexistent/ca.pem"]}}`,
			[]string{"reading tls_trusted_ca_certs", "/nonexistent/ca.pem"}},
		{"CA file without certificate", `{"upstreams":[{"url":"https://a"}],"transport":{"tls_trusted_ca_certs":["` + notPEM + `"]}}`,
			[]string{"no certificate found in tls_trusted_ca_certs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := provisionJSON(t, newCaddyContext(t), tc.config)
			if err == nil {
				t.Fatal("no error")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			if h.stateKey != "" {
				t.Errorf("an invalid config took the pooled state %q", h.stateKey)
			}
		})
	}
}

func TestProvisionReplacesGlobalPlaceholders(t *testing.T) {
	t.Setenv("LLMHEDGE_TEST_KEY", "sk-from-env")
	t.Setenv("LLMHEDGE_TEST_HOST", "127.0.0.1:9")
	h, err := provisionJSON(t, newCaddyContext(t), `{"upstreams":[{"url":"http://{env.LLMHEDGE_TEST_HOST}/v1",
		"set_headers":{"Authorization":"Bearer {env.LLMHEDGE_TEST_KEY}"},"model":"{env.LLMHEDGE_TEST_MODEL}"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	up := h.cfg.Upstreams[0]
	if up.URL != "http://127.0.0.1:9/v1" {
		t.Fatalf("up.URL = %q, want \"http://127.0.0.1:9/v1\"", up.URL)
	} else if up.SetHeaders["Authorization"] != "Bearer sk-from-env" {
		t.Fatalf("up.SetHeaders[\"Authorization\"] = %q, want \"Bearer sk-from-env\"", up.SetHeaders["Authorization"])
	} else if up.Model != "" {
		t.Fatalf("up.Model = %q, want \"\"", up.Model)
	}
	if up.Name != "127.0.0.1:9" {
		t.Fatalf("default name %q, want the URL's host", up.Name)
	}
}

// TestReloadKeepsStateAndTransport provisions the same route twice, as a
// reload does (new config provisioned before the old one is cleaned up).
func TestReloadKeepsStateAndTransport(t *testing.T) {
	config := `{"route":"reload-test","upstreams":[{"url":"http://127.0.0.1:9001"},{"url":"http://127.0.0.1:9002"}],"delay":{"fixed":"50ms"}}`
	oldCfg, err := provisionJSON(t, newCaddyContext(t), config)
	if err != nil {
		t.Fatal(err)
	}
	newCfg, err := provisionJSON(t, newCaddyContext(t), strings.Replace(config, "50ms", "80ms", 1))
	if err != nil {
		t.Fatal(err)
	}
	if oldCfg.hedger.State() != newCfg.hedger.State() || oldCfg.httpTrans != newCfg.httpTrans {
		t.Fatal("a reload with the same upstreams must keep the state and the transport")
	}
	if refs, _ := shared.References(newCfg.stateKey); refs != 2 {
		t.Fatalf("state references %d, want 2", refs)
	}
	if err := oldCfg.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if refs, ok := shared.References(newCfg.stateKey); !ok {
		t.Fatalf("after the old config's cleanup: references %d (present %v), want 1", refs, ok)
	} else if refs != 1 {
		t.Fatalf("after the old config's cleanup: refs = %v, want 1", refs)
	}
	key := newCfg.stateKey
	if err := newCfg.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, ok := shared.References(key); ok {
		t.Fatal("state still pooled after the last cleanup")
	}

	other, err := provisionJSON(t, newCaddyContext(t), `{"route":"reload-test","upstreams":[{"url":"http://127.0.0.1:9003"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	if other.stateKey == key {
		t.Fatal("different upstreams must not share state")
	}
}

// TestMetricsRegistration: several handlers in one config, and a second
// config (a reload), register the same collectors without error, and the
// gauges report each live route.
func TestMetricsRegistration(t *testing.T) {
	ctx := newCaddyContext(t)
	for _, route := range []string{"m1", "m2"} {
		if _, err := provisionJSON(t, ctx, `{"route":"`+route+`","upstreams":[{"url":"http://127.0.0.1:9001"}],"delay":{"fixed":"75ms"}}`); err != nil {
			t.Fatal(err)
		}
	}
	reloaded := newCaddyContext(t)
	if _, err := provisionJSON(t, reloaded, `{"route":"m1","upstreams":[{"url":"http://127.0.0.1:9001"}],"delay":{"fixed":"75ms"}}`); err != nil {
		t.Fatal(err)
	}
	n, err := testutil.GatherAndCount(reloaded.GetMetricsRegistry(), "llm_hedge_current_delay_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Fatalf("llm_hedge_current_delay_seconds has %d series, want one per live route (m1, m2)", n)
	}
	expected := `
# HELP llm_hedge_current_delay_seconds Hedge delay a request starting now would use, by route (adaptive routes follow the TTFT quantile).
# TYPE llm_hedge_current_delay_seconds gauge
llm_hedge_current_delay_seconds{route="m1"} 0.075
llm_hedge_current_delay_seconds{route="m2"} 0.075
`
	if err := testutil.GatherAndCompare(ctx.GetMetricsRegistry(), strings.NewReader(expected), "llm_hedge_current_delay_seconds"); err != nil {
		t.Fatal(err)
	}
}
