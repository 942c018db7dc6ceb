package envoyfilter_test

import (
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/envoyfilter"
)

// The minimal form works and every default is filled in.
func TestConfigMinimalAndDefaults(t *testing.T) {
	cfg, err := envoyfilter.ParseConfig([]byte(`
routes:
  - name: chat
    upstreams:
      - url: http://127.0.0.1:9001
      - url: http://127.0.0.1:9002
    delay: 50ms
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GRPC.Listen != envoyfilter.DefaultGRPCListen || cfg.GRPC.MaxRecvMsgSize != envoyfilter.DefaultMaxRecvMsgSize ||
		cfg.Metrics.Listen != envoyfilter.DefaultMetricsListen || cfg.Metrics.Path != "/metrics" ||
		time.Duration(cfg.Shutdown.DrainTimeout) != envoyfilter.DefaultDrainTimeout ||
		cfg.Envoy.RequestBodyMode != envoyfilter.BodyModeFullDuplex || !*cfg.Envoy.StreamedImmediateResponse ||
		time.Duration(*cfg.Envoy.OverrideMessageTimeout) != envoyfilter.DefaultOverrideMessageTimeout {
		t.Fatalf("defaults not applied: %+v", cfg)
	}
	cc, err := cfg.Routes[0].CoreConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cc.Route != "chat" || len(cc.Upstreams) != 2 || cc.Delay.Mode != core.DelayFixed || time.Duration(cc.Delay.Fixed) != 50*time.Millisecond {
		t.Fatalf("core config %+v", cc)
	}
}

// Every field of the core schema is spelled in snake_case and arrives in
// core.Config.
func TestConfigFullRoute(t *testing.T) {
	t.Setenv("LLMHEDGE_TEST_KEY", "sk-123")
	cfg, err := envoyfilter.ParseConfig([]byte(`
routes:
  - name: chat
    match:
      path_prefixes: [/v1/]
      headers: [{name: x-tenant, value: a}, {name: x-llm}]
    upstreams:
      - name: a
        url: https://a.example/openai
        set_headers: {Authorization: "Bearer ${LLMHEDGE_TEST_KEY}"}
        delete_headers: [x-internal]
        model: gpt-4o-mini
    delay: {mode: adaptive, fixed: 2s, quantile: 0.9, min: 100ms, max: 5s, window: 500, min_samples: 20}
    max_attempts: 3
    timeout: 60s
    min_time_left: 1s
    max_body: 8MiB
    max_prefix: 2MiB
    max_line: 512KiB
    methods: [POST, PUT]
    path_prefixes: [/v1/chat/]
    first_event: openai-chat
    idempotency: {header: X-Key, ttl: -1s, max_entries: 10, max_bytes: 1MiB, max_response_bytes: 64KiB, scope_headers: [Authorization, X-User]}
    budget: {ratio: 0.2, burst: 5, max_concurrent_hedges: 7, cool_down: 2s, max_cool_down: 30s, overload_rate: 0.5,
             overload_window: 50, breaker_failures: 3, breaker_open: 5s, tenant_header: x-tenant, tenant_tokens_per_minute: 1000}
    report_header: Server-Timing
    stream_error_event: true
`))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cfg.Routes[0].CoreConfig()
	if err != nil {
		t.Fatal(err)
	}
	u := cc.Upstreams[0]
	if u.Name != "a" || u.SetHeaders["Authorization"] != "Bearer sk-123" || u.DeleteHeaders[0] != "x-internal" || u.Model != "gpt-4o-mini" {
		t.Fatalf("upstream %+v", u)
	}
	d := cc.Delay
	if d.Mode != core.DelayAdaptive || time.Duration(d.Fixed) != 2*time.Second || d.Quantile != 0.9 || time.Duration(d.Min) != 100*time.Millisecond ||
		time.Duration(d.Max) != 5*time.Second || d.Window != 500 || d.MinSamples != 20 {
		t.Fatalf("delay %+v", d)
	}
	if cc.MaxAttempts != 3 || time.Duration(cc.Timeout) != time.Minute || time.Duration(cc.MinTimeLeft) != time.Second || cc.MaxBody != 8<<20 ||
		cc.MaxPrefix != 2<<20 || cc.MaxLine != 512<<10 || len(cc.Methods) != 2 || cc.PathPrefixes[0] != "/v1/chat/" ||
		cc.FirstEvent != core.RuleOpenAIChat || cc.ReportHeader != "Server-Timing" || !cc.StreamErrorEvent {
		t.Fatalf("core config %+v", cc)
	}
	if i := cc.Idempotency; i.Header != "X-Key" || time.Duration(i.TTL) != -time.Second || i.MaxEntries != 10 || i.MaxBytes != 1<<20 || i.MaxResponseBytes != 64<<10 ||
		len(i.ScopeHeaders) != 2 || i.ScopeHeaders[1] != "X-User" {
		t.Fatalf("idempotency %+v", i)
	}
	b := cc.Budget
	if b.Ratio != 0.2 || b.Burst != 5 || b.MaxConcurrentHedges != 7 || time.Duration(b.CoolDown) != 2*time.Second || time.Duration(b.MaxCoolDown) != 30*time.Second ||
		b.OverloadRate != 0.5 || b.OverloadWindow != 50 || b.BreakerFailures != 3 || time.Duration(b.BreakerOpen) != 5*time.Second ||
		b.TenantHeader != "x-tenant" || b.TenantTokensPerMinute != 1000 {
		t.Fatalf("budget %+v", b)
	}
}

// Bad configurations fail with errors that say where and what.
func TestConfigErrors(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"typo", "routes:\n  - name: a\n    upstreams: [{url: 'http://x'}]\n    delai: 1s\n", []string{`unknown field "delai"`}},
		{"typo in delay", "routes:\n  - name: a\n    upstreams: [{url: 'http://x'}]\n    delay: {fixd: 1s}\n", []string{`unknown field "fixd"`}},
		{"bad duration", "routes:\n  - name: a\n    upstreams: [{url: 'http://x'}]\n    delay: soon\n", []string{`duration "soon"`}},
		{"bare number duration", "routes:\n  - name: a\n    upstreams: [{url: 'http://x'}]\n    timeout: 30\n", []string{`want a string such as "250ms"`}},
		{"bad size", "routes:\n  - name: a\n    upstreams: [{url: 'http://x'}]\n    max_body: 4 lots\n", []string{`size "4 lots"`}},
		{"no upstream", "routes:\n  - name: a\n", []string{"routes[0] (a): at least one upstream is required"}},
		{"bad url", "routes:\n  - name: a\n    upstreams: [{url: 'ftp://x'}]\n", []string{"routes[0] (a): upstream 0", "scheme must be http or https"}},
		{"no name", "routes:\n  - upstreams: [{url: 'http://x'}]\n", []string{"routes[0]: name is required"}},
		{"duplicate", "routes:\n  - {name: a, upstreams: [{url: 'http://x'}]}\n  - {name: a, upstreams: [{url: 'http://y'}]}\n",
			[]string{`routes[1] (a): name "a" is used by another route`}},
		{"match", "routes:\n  - name: a\n    match: {path_prefixes: [v1], headers: [{name: 'bad name'}]}\n    upstreams: [{url: 'http://x'}]\n",
			[]string{`match.path_prefixes "v1" must start with /`, `match.headers[0]: name "bad name"`}},
		{"env", "routes:\n  - name: a\n    upstreams: [{url: 'http://x', set_headers: {Authorization: 'Bearer ${LLMHEDGE_SURELY_UNSET}'}}]\n",
			[]string{"set_headers Authorization: environment variable LLMHEDGE_SURELY_UNSET is not set"}},
		{"server", "grpc: {listen: nowhere}\nlog: {level: loud}\nenvoy: {request_body_mode: streamed}\n",
			[]string{`grpc.listen "nowhere"`, `log.level: "loud"`, `envoy.request_body_mode "streamed"`}},
		{"tls", "grpc: {tls: {cert_file: a.pem}}\n", []string{"cert_file and key_file must be set together"}},
		{"transport", "transport: {dial_timeout: -1s, versions: ['1.1', h2c], idle_conn_timeout: 1s, keepalive_idle_timeout: 2s}\n",
			[]string{"transport: timeouts must not be negative", "1.1 and h2c exclude each other", "idle_conn_timeout is the earlier name of keepalive_idle_timeout"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := envoyfilter.ParseConfig([]byte(c.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// ${NAME} is expanded in every upstream value that may hold a secret or a
// deployment detail: url, set_headers values and model, in one pass.
func TestConfigExpandsEnvInEveryUpstreamValue(t *testing.T) {
	t.Setenv("LLMHEDGE_TEST_HOST", "127.0.0.1:9001")
	t.Setenv("LLMHEDGE_TEST_MODEL", "gpt-4o-mini")
	t.Setenv("LLMHEDGE_TEST_KEY", "sk-123")
	cfg, err := envoyfilter.ParseConfig([]byte(`
routes:
  - name: chat
    upstreams:
      - url: http://${LLMHEDGE_TEST_HOST}/v1
        model: ${LLMHEDGE_TEST_MODEL}
        set_headers: {Authorization: "Bearer ${LLMHEDGE_TEST_KEY}"}
`))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cfg.Routes[0].CoreConfig()
	if err != nil {
		t.Fatal(err)
	}
	u := cc.Upstreams[0]
	if u.URL != "http://127.0.0.1:9001/v1" || u.Model != "gpt-4o-mini" || u.SetHeaders["Authorization"] != "Bearer sk-123" {
		t.Errorf("upstream url %q, model %q, Authorization %q: want every ${NAME} expanded", u.URL, u.Model, u.SetHeaders["Authorization"])
	}
	if cfg.Routes[0].Upstreams[0].URL != "http://${LLMHEDGE_TEST_HOST}/v1" {
		t.Errorf("the parsed file changed: url %q", cfg.Routes[0].Upstreams[0].URL)
	}
}

// A route is named by name; core's route field is not an Envoy option.
func TestConfigRejectsRouteField(t *testing.T) {
	_, err := envoyfilter.ParseConfig([]byte("routes:\n  - name: a\n    route: b\n    upstreams: [{url: 'http://x'}]\n"))
	if err == nil || !strings.Contains(err.Error(), `unknown field "route"`) {
		t.Fatalf("error %v, want unknown field \"route\"", err)
	}
}

// The transport section is core.TransportConfig with its defaults;
// idle_conn_timeout, its earlier name of keepalive_idle_timeout, still works.
func TestConfigTransport(t *testing.T) {
	cfg, err := envoyfilter.ParseConfig([]byte("routes: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Transport.TransportConfig, (core.TransportConfig{}).WithDefaults(); core.TransportKey(got, nil) != core.TransportKey(want, nil) {
		t.Errorf("default transport %+v, want core's defaults %+v", got, want)
	}
	cfg, err = envoyfilter.ParseConfig([]byte("transport: {idle_conn_timeout: 7s, tls_handshake_timeout: 3s, response_header_timeout: 1m, proxy_from_environment: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	tr := cfg.Transport
	if tr.KeepAliveIdleTimeout.D() != 7*time.Second {
		t.Errorf("keepalive_idle_timeout = %v, want 7s from idle_conn_timeout", tr.KeepAliveIdleTimeout)
	}
	if tr.TLSHandshakeTimeout.D() != 3*time.Second || tr.ResponseHeaderTimeout.D() != time.Minute || !tr.ProxyFromEnvironment {
		t.Errorf("tls_handshake_timeout = %v, response_header_timeout = %v, proxy_from_environment = %v; want 3s, 1m, true",
			tr.TLSHandshakeTimeout, tr.ResponseHeaderTimeout, tr.ProxyFromEnvironment)
	}
}
