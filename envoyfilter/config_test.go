package envoyfilter_test

import (
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

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
	switch {
	case cfg.GRPC.Listen != envoyfilter.DefaultGRPCListen:
		t.Fatalf("default grpc.listen = %q, want %q", cfg.GRPC.Listen, envoyfilter.DefaultGRPCListen)
	case cfg.GRPC.MaxRecvMsgSize != envoyfilter.DefaultMaxRecvMsgSize:
		t.Fatalf("default grpc.max_recv_msg_size = %d, want %d", cfg.GRPC.MaxRecvMsgSize, envoyfilter.DefaultMaxRecvMsgSize)
	case cfg.Metrics.Listen != envoyfilter.DefaultMetricsListen:
		t.Fatalf("default metrics.listen = %q, want %q", cfg.Metrics.Listen, envoyfilter.DefaultMetricsListen)
	case cfg.Metrics.Path != "/metrics":
		t.Fatalf("default metrics.path = %q, want /metrics", cfg.Metrics.Path)
	case time.Duration(cfg.Shutdown.DrainTimeout) != envoyfilter.DefaultDrainTimeout:
		t.Fatalf("default shutdown.drain_timeout = %v, want %v", cfg.Shutdown.DrainTimeout, envoyfilter.DefaultDrainTimeout)
	case cfg.Envoy.RequestBodyMode != envoyfilter.BodyModeFullDuplex:
		t.Fatalf("default envoy.request_body_mode = %q, want %q", cfg.Envoy.RequestBodyMode, envoyfilter.BodyModeFullDuplex)
	case !*cfg.Envoy.StreamedImmediateResponse:
		t.Fatal("default envoy.streamed_immediate_response = false, want true")
	case time.Duration(*cfg.Envoy.OverrideMessageTimeout) != envoyfilter.DefaultOverrideMessageTimeout:
		t.Fatalf("default envoy.override_message_timeout = %v, want %v", *cfg.Envoy.OverrideMessageTimeout, envoyfilter.DefaultOverrideMessageTimeout)
	}
	cc, err := cfg.Routes[0].CoreConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cc.Route != "chat" {
		t.Fatalf("cc.Route = %q, want \"chat\"", cc.Route)
	} else if len(cc.Upstreams) != 2 {
		t.Fatalf("len(cc.Upstreams) = %v, want 2", len(cc.Upstreams))
	} else if cc.Delay.Mode != config.DelayFixed {
		t.Fatalf("cc.Delay.Mode = %v, want config.DelayFixed", cc.Delay.Mode)
	} else if time.Duration(cc.Delay.Fixed) != 50*time.Millisecond {
		t.Fatalf("time.Duration(cc.Delay.Fixed) = %v, want %v", time.Duration(cc.Delay.Fixed), 50*time.Millisecond)
	}
}

// Every field of the core schema is spelled in snake_case and arrives in
// config.Config.
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
	if u.Name != "a" {
		t.Fatalf("u.Name = %q, want \"a\"", u.Name)
	} else if u.SetHeaders["Authorization"] != "Bearer sk-123" {
		t.Fatalf("u.SetHeaders[\"Authorization\"] = %q, want \"Bearer sk-123\"", u.SetHeaders["Authorization"])
	} else if u.DeleteHeaders[0] != "x-internal" {
		t.Fatalf("u.DeleteHeaders[0] = %q, want \"x-internal\"", u.DeleteHeaders[0])
	} else if u.Model != "gpt-4o-mini" {
		t.Fatalf("u.Model = %q, want \"gpt-4o-mini\"", u.Model)
	}
	d := cc.Delay
	if d.Mode != config.DelayAdaptive {
		t.Fatalf("d.Mode = %v, want config.DelayAdaptive", d.Mode)
	} else if time.Duration(d.Fixed) != 2*time.Second {
		t.Fatalf("time.Duration(d.Fixed) = %v, want %v", time.Duration(d.Fixed), 2*time.Second)
	} else if d.Quantile != 0.9 {
		t.Fatalf("d.Quantile = %v, want 0.9", d.Quantile)
	} else if time.Duration(d.Min) != 100*time.Millisecond {
		t.Fatalf("time.Duration(d.Min) = %v, want %v", time.Duration(d.Min), 100*time.Millisecond)
	} else if time.Duration(d.Max) != 5*time.Second {
		t.Fatalf("time.Duration(d.Max) = %v, want %v", time.Duration(d.Max), 5*time.Second)
	} else if d.Window != 500 {
		t.Fatalf("d.Window = %v, want 500", d.Window)
	} else if d.MinSamples != 20 {
		t.Fatalf("d.MinSamples = %v, want 20", d.MinSamples)
	}
	if cc.MaxAttempts != 3 {
		t.Fatalf("cc.MaxAttempts = %v, want 3", cc.MaxAttempts)
	} else if time.Duration(cc.Timeout) != time.Minute {
		t.Fatalf("time.Duration(cc.Timeout) = %v, want time.Minute", time.Duration(cc.Timeout))
	} else if time.Duration(cc.MinTimeLeft) != time.Second {
		t.Fatalf("time.Duration(cc.MinTimeLeft) = %v, want time.Second", time.Duration(cc.MinTimeLeft))
	} else if cc.MaxBody != 8<<20 {
		t.Fatalf("cc.MaxBody = %v, want %v", cc.MaxBody, 8<<20)
	} else if cc.MaxPrefix != 2<<20 {
		t.Fatalf("cc.MaxPrefix = %v, want %v", cc.MaxPrefix, 2<<20)
	} else if cc.MaxLine != 512<<10 {
		t.Fatalf("cc.MaxLine = %v, want %v", cc.MaxLine, 512<<10)
	} else if len(cc.Methods) != 2 {
		t.Fatalf("len(cc.Methods) = %v, want 2", len(cc.Methods))
	} else if cc.PathPrefixes[0] != "/v1/chat/" {
		t.Fatalf("cc.PathPrefixes[0] = %q, want \"/v1/chat/\"", cc.PathPrefixes[0])
	} else if cc.FirstEvent != config.RuleOpenAIChat {
		t.Fatalf("cc.FirstEvent = %v, want config.RuleOpenAIChat", cc.FirstEvent)
	} else if cc.ReportHeader != "Server-Timing" {
		t.Fatalf("cc.ReportHeader = %q, want \"Server-Timing\"", cc.ReportHeader)
	} else if !cc.StreamErrorEvent {
		t.Fatalf("cc.StreamErrorEvent = false, want true")
	}
	if i := cc.Idempotency; i.Header != "X-Key" {
		t.Fatalf("i.Header = %q, want \"X-Key\"", i.Header)
	} else if time.Duration(i.TTL) != -time.Second {
		t.Fatalf("time.Duration(i.TTL) = %v, want -time.Second", time.Duration(i.TTL))
	} else if i.MaxEntries != 10 {
		t.Fatalf("i.MaxEntries = %v, want 10", i.MaxEntries)
	} else if i.MaxBytes != 1<<20 {
		t.Fatalf("i.MaxBytes = %v, want %v", i.MaxBytes, 1<<20)
	} else if i.MaxResponseBytes != 64<<10 {
		t.Fatalf("i.MaxResponseBytes = %v, want %v", i.MaxResponseBytes, 64<<10)
	} else if len(i.ScopeHeaders) != 2 {
		t.Fatalf("len(i.ScopeHeaders) = %v, want 2", len(i.ScopeHeaders))
	} else if i.ScopeHeaders[1] != "X-User" {
		t.Fatalf("i.ScopeHeaders[1] = %q, want \"X-User\"", i.ScopeHeaders[1])
	}
	b := cc.Budget
	if b.Ratio != 0.2 {
		t.Fatalf("b.Ratio = %v, want 0.2", b.Ratio)
	} else if b.Burst != 5 {
		t.Fatalf("b.Burst = %v, want 5", b.Burst)
	} else if b.MaxConcurrentHedges != 7 {
		t.Fatalf("b.MaxConcurrentHedges = %v, want 7", b.MaxConcurrentHedges)
	} else if time.Duration(b.CoolDown) != 2*time.Second {
		t.Fatalf("time.Duration(b.CoolDown) = %v, want %v", time.Duration(b.CoolDown), 2*time.Second)
	} else if time.Duration(b.MaxCoolDown) != 30*time.Second {
		t.Fatalf("time.Duration(b.MaxCoolDown) = %v, want %v", time.Duration(b.MaxCoolDown), 30*time.Second)
	} else if b.OverloadRate != 0.5 {
		t.Fatalf("b.OverloadRate = %v, want 0.5", b.OverloadRate)
	} else if b.OverloadWindow != 50 {
		t.Fatalf("b.OverloadWindow = %v, want 50", b.OverloadWindow)
	} else if b.BreakerFailures != 3 {
		t.Fatalf("b.BreakerFailures = %v, want 3", b.BreakerFailures)
	} else if time.Duration(b.BreakerOpen) != 5*time.Second {
		t.Fatalf("time.Duration(b.BreakerOpen) = %v, want %v", time.Duration(b.BreakerOpen), 5*time.Second)
	} else if b.TenantHeader != "x-tenant" {
		t.Fatalf("b.TenantHeader = %q, want \"x-tenant\"", b.TenantHeader)
	} else if b.TenantTokensPerMinute != 1000 {
		t.Fatalf("b.TenantTokensPerMinute = %v, want 1000", b.TenantTokensPerMinute)
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
	if u.URL != "http://127.0.0.1:9001/v1" {
		t.Errorf("u.URL = %q, want \"http://127.0.0.1:9001/v1\"", u.URL)
	} else if u.Model != "gpt-4o-mini" {
		t.Errorf("u.Model = %q, want \"gpt-4o-mini\"", u.Model)
	} else if u.SetHeaders["Authorization"] != "Bearer sk-123" {
		t.Errorf("u.SetHeaders[\"Authorization\"] = %q, want \"Bearer sk-123\"", u.SetHeaders["Authorization"])
	}
	if cfg.Routes[0].Upstreams[0].URL != "http://${LLMHEDGE_TEST_HOST}/v1" {
		t.Errorf("the parsed file changed: url %q", cfg.Routes[0].Upstreams[0].URL)
	}
}

// A route is named by name; core's route field is not an Envoy option.
func TestConfigRejectsRouteField(t *testing.T) {
	_, err := envoyfilter.ParseConfig([]byte("routes:\n  - name: a\n    route: b\n    upstreams: [{url: 'http://x'}]\n"))
	if err == nil {
		t.Fatalf("err = nil, want an error")
	} else if !strings.Contains(err.Error(), `unknown field "route"`) {
		t.Fatalf("err.Error() = %q, want it to contain `unknown field \"route\"`", err.Error())
	}
}

// The transport section is config.TransportConfig with its defaults;
// idle_conn_timeout, its earlier name of keepalive_idle_timeout, still works.
func TestConfigTransport(t *testing.T) {
	cfg, err := envoyfilter.ParseConfig([]byte("routes: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Transport.TransportConfig, (config.TransportConfig{}).WithDefaults(); config.TransportKey(got, nil) != config.TransportKey(want, nil) {
		t.Errorf("config.TransportKey(got, nil) = %v, want %v", config.TransportKey(got, nil), config.TransportKey(want, nil))
	}
	cfg, err = envoyfilter.ParseConfig([]byte("transport: {idle_conn_timeout: 7s, tls_handshake_timeout: 3s, response_header_timeout: 1m, proxy_from_environment: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	tr := cfg.Transport
	if tr.KeepAliveIdleTimeout.D() != 7*time.Second {
		t.Errorf("keepalive_idle_timeout = %v, want 7s from idle_conn_timeout", tr.KeepAliveIdleTimeout)
	}
	if tr.TLSHandshakeTimeout.D() != 3*time.Second {
		t.Errorf("tr.TLSHandshakeTimeout.D() = %v, want %v", tr.TLSHandshakeTimeout.D(), 3*time.Second)
	} else if tr.ResponseHeaderTimeout.D() != time.Minute {
		t.Errorf("tr.ResponseHeaderTimeout.D() = %v, want time.Minute", tr.ResponseHeaderTimeout.D())
	} else if !tr.ProxyFromEnvironment {
		t.Errorf("tls_handshake_timeout = %v, response_header_timeout = %v, proxy_from_environment = %v; want 3s, 1m, true",
			tr.TLSHandshakeTimeout, tr.ResponseHeaderTimeout, tr.ProxyFromEnvironment)
	}
}
