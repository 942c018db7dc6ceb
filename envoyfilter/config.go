package envoyfilter

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
	"sigs.k8s.io/yaml"

	"github.com/llmhedge/llmhedge/core"
)

// FileConfig is the server's configuration file: snake_case YAML (or
// JSON). Unknown fields are errors, so a typo never silently turns a
// setting off. Every field has a default; a file with one route and its
// upstreams is a complete configuration.
type FileConfig struct {
	// GRPC configures the listener Envoy's ext_proc filter connects to.
	GRPC GRPCConfig `json:"grpc"`
	// Metrics configures the Prometheus endpoint.
	Metrics MetricsConfig `json:"metrics"`
	// Log configures the zap logger.
	Log LogConfig `json:"log"`
	// Shutdown configures the drain on SIGTERM.
	Shutdown ShutdownConfig `json:"shutdown"`
	// Envoy describes how the filter in front of this server is configured.
	Envoy EnvoyConfig `json:"envoy"`
	// Transport configures the HTTP client that sends upstream attempts.
	Transport TransportConfig `json:"transport"`
	// Routes are tried in order; the first that matches a request hedges
	// it. A request no route matches continues through Envoy untouched.
	Routes []RouteConfig `json:"routes"`
}

// GRPCConfig configures the gRPC listener.
type GRPCConfig struct {
	// Listen is the address of the ExternalProcessor service. Default
	// "127.0.0.1:50051". Not reloadable.
	Listen string `json:"listen"`
	// MaxRecvMsgSize bounds one message from Envoy, and so the memory a
	// stream's body chunks can hold. In FULL_DUPLEX_STREAMED mode Envoy
	// sends the body in chunks of at most its buffer size (16-64 KiB with
	// the default buffer limits), far below the default. In buffered mode
	// the whole request body arrives in one message: raise it above the
	// largest body (max_body + 64KiB). Default 4MiB.
	MaxRecvMsgSize ByteSize `json:"max_recv_msg_size"`
	// MaxConcurrentStreams caps the ext_proc streams (= requests in
	// flight) per Envoy connection. Default 0: gRPC's default (no cap).
	MaxConcurrentStreams uint32 `json:"max_concurrent_streams"`
	// TLS, when cert_file and key_file are set, serves gRPC over TLS.
	// Certificates are re-read on SIGHUP.
	TLS TLSConfig `json:"tls"`
}

// TLSConfig is the optional TLS of the gRPC listener.
type TLSConfig struct {
	// CertFile and KeyFile are PEM files. Both or neither. Default: plain
	// gRPC (h2c), which suits a sidecar on loopback.
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
	// ClientCAFile, when set, requires Envoy to present a client
	// certificate signed by one of these CAs (mTLS). Default: none.
	ClientCAFile string `json:"client_ca_file"`
}

// Enabled reports whether TLS is configured.
func (t TLSConfig) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// MetricsConfig configures the Prometheus endpoint.
type MetricsConfig struct {
	// Listen is the HTTP address of the metrics endpoint, separate from
	// gRPC. Default "127.0.0.1:9464"; "off" disables it. Not reloadable.
	Listen string `json:"listen"`
	// Path of the endpoint. Default "/metrics".
	Path string `json:"path"`
}

// LogConfig configures the zap logger.
type LogConfig struct {
	// Level is debug, info (default), warn or error. Reloadable.
	Level string `json:"level"`
	// Format is json (default) or console. Not reloadable.
	Format string `json:"format"`
	// Requests logs one line per hedged request at info level (route,
	// outcome, status, attempts, winner, TTFT, delay). Default true.
	Requests *bool `json:"requests"`
}

// ShutdownConfig configures the drain on SIGTERM.
type ShutdownConfig struct {
	// HealthGrace is how long health reports NOT_SERVING while the listener
	// still accepts new streams, so that Envoy's health checker takes the
	// server out of the cluster before connections are refused. Pair it
	// with the cluster's health check: at least interval ×
	// unhealthy_threshold plus one timeout. Default 5s; 0 closes the
	// listener at once.
	HealthGrace *Duration `json:"health_grace"`
	// DrainTimeout is how long streams in flight may run to completion
	// after the listener closed before they are cancelled (which cancels their upstream
	// attempts). Default 30s.
	DrainTimeout Duration `json:"drain_timeout"`
}

// Body modes the server understands, as spelled in the configuration.
const (
	BodyModeFullDuplex = "full_duplex_streamed"
	BodyModeBuffered   = "buffered"
)

// EnvoyConfig describes the ext_proc filter in front of this server. Envoy
// >= 1.3x announces its body modes in protocol_config on the first message
// of every stream; these settings are the fallback and the limits.
type EnvoyConfig struct {
	// RequestBodyMode is assumed when Envoy does not send protocol_config:
	// full_duplex_streamed (default, Envoy >= 1.37) or buffered.
	RequestBodyMode string `json:"request_body_mode"`
	// StreamedImmediateResponse answers streams with
	// StreamedImmediateResponse, which needs Envoy >= 1.37. Default true.
	// With false every answer is collected and sent as one
	// ImmediateResponse (streams then arrive all at once).
	StreamedImmediateResponse *bool `json:"streamed_immediate_response"`
	// MaxImmediateResponse is the largest non-streaming answer sent as one
	// ImmediateResponse. A larger one is streamed instead when streaming is
	// possible, else answered 502. Default 4MiB.
	MaxImmediateResponse ByteSize `json:"max_immediate_response"`
	// BodyChunk is the largest body_response chunk sent to Envoy (Envoy
	// recommends <= 64KiB). Default 64KiB.
	BodyChunk ByteSize `json:"body_chunk"`
	// OverrideMessageTimeout is sent in buffered mode when the request body
	// arrives, so that Envoy's message_timeout (200ms by default) does not
	// cut the race short. It must not exceed the filter's
	// max_message_timeout, or Envoy ignores it. Default 60s; 0 sends none.
	OverrideMessageTimeout *Duration `json:"override_message_timeout"`
}

// TransportConfig configures the HTTP client of upstream attempts.
type TransportConfig struct {
	// DialTimeout bounds a TCP connect. Default 5s.
	DialTimeout Duration `json:"dial_timeout"`
	// TLSHandshakeTimeout bounds a TLS handshake. Default 5s.
	TLSHandshakeTimeout Duration `json:"tls_handshake_timeout"`
	// IdleConnTimeout closes idle keep-alive connections. Default 90s.
	IdleConnTimeout Duration `json:"idle_conn_timeout"`
	// MaxIdleConnsPerHost keeps this many idle connections per upstream.
	// Default 64.
	MaxIdleConnsPerHost int `json:"max_idle_conns_per_host"`
}

// RouteConfig is one hedged route: which requests it takes over (Match)
// and the shared core schema (core.Config) in snake_case.
type RouteConfig struct {
	// Name names the route in metrics and logs. Required, unique.
	Name string `json:"name"`
	// Match selects the requests this route hedges.
	Match MatchConfig `json:"match"`
	// Upstreams are tried in order; at least one. See core.UpstreamConfig.
	Upstreams []UpstreamConfig `json:"upstreams"`
	// Delay is the hedge delay: a duration string ("250ms", fixed mode) or
	// a mapping (see DelayConfig). Default fixed 1s.
	Delay DelayConfig `json:"delay"`
	// MaxAttempts bounds the race, the first attempt included. Default 2.
	MaxAttempts int `json:"max_attempts"`
	// Timeout is the shared deadline of all attempts and the streamed
	// answer. Default 0: none beyond the client's.
	Timeout Duration `json:"timeout"`
	// MinTimeLeft: no hedge starts with less time than this before the
	// deadline. Default: the hedge delay.
	MinTimeLeft Duration `json:"min_time_left"`
	// MaxBody is the largest body that is buffered and hedged; larger ones
	// are forwarded once, unhedged. Default 4MiB.
	MaxBody ByteSize `json:"max_body"`
	// MaxPrefix bounds what an attempt may send before its first output
	// event. Default 1MiB.
	MaxPrefix ByteSize `json:"max_prefix"`
	// MaxLine bounds one SSE/NDJSON line before the first event. Default
	// 256KiB.
	MaxLine ByteSize `json:"max_line"`
	// Methods that may be hedged. Default [POST]. Other methods on a
	// matched route are sent once through this server.
	Methods []string `json:"methods"`
	// PathPrefixes that may be hedged, among the requests Match selected.
	// Default: all of them.
	PathPrefixes []string `json:"path_prefixes"`
	// FirstEvent is the first-output rule: auto (default), openai-chat,
	// openai-responses, anthropic, any.
	FirstEvent string `json:"first_event"`
	// Idempotency configures keys, joins and replays.
	Idempotency IdempotencyConfig `json:"idempotency"`
	// Budget rations hedges.
	Budget BudgetConfig `json:"budget"`
	// ReportHeader names a response header that reports the race. Default
	// off.
	ReportHeader string `json:"report_header"`
	// StreamErrorEvent ends a failed SSE answer with `event: error` instead
	// of a reset stream. Default false.
	StreamErrorEvent bool `json:"stream_error_event"`
}

// MatchConfig selects requests. Every listed condition must hold; an empty
// MatchConfig matches every request.
type MatchConfig struct {
	// PathPrefixes: the request path starts with one of these. Default: any
	// path.
	PathPrefixes []string `json:"path_prefixes"`
	// Headers: every header listed is present with this exact value (any
	// value when value is empty). Default: none.
	Headers []HeaderMatch `json:"headers"`
}

// HeaderMatch is one header condition.
type HeaderMatch struct {
	// Name of the header, case-insensitive. Required.
	Name string `json:"name"`
	// Value it must equal; empty means the header only has to be present.
	Value string `json:"value"`
}

// UpstreamConfig is one upstream of a route (core.UpstreamConfig).
type UpstreamConfig struct {
	// Name in metrics and logs. Default: the URL's host.
	Name string `json:"name"`
	// URL is the base URL; the request path and query are appended. Required.
	URL string `json:"url"`
	// SetHeaders are set on every attempt to this upstream, e.g. its API
	// key. "${NAME}" in a value is replaced by the environment variable
	// NAME, so keys stay out of the file. Values are never logged.
	SetHeaders map[string]string `json:"set_headers"`
	// DeleteHeaders are removed from every attempt to this upstream.
	DeleteHeaders []string `json:"delete_headers"`
	// Model, when set, replaces the JSON "model" field of the body.
	Model string `json:"model"`
}

// DelayConfig is core.DelayConfig. In YAML it is either a duration string
// (fixed mode) or a mapping of these fields.
type DelayConfig struct {
	// Mode is fixed (default) or adaptive.
	Mode string `json:"mode"`
	// Fixed delay, and the adaptive delay until enough samples. Default 1s.
	Fixed Duration `json:"fixed"`
	// Quantile of the primary's TTFT in adaptive mode. Default 0.95.
	Quantile float64 `json:"quantile"`
	// Min and Max clamp the adaptive delay. Defaults 50ms and 10s.
	Min Duration `json:"min"`
	Max Duration `json:"max"`
	// Window of recent TTFT samples. Default 1000.
	Window int `json:"window"`
	// MinSamples before the adaptive delay is used. Default 50.
	MinSamples int `json:"min_samples"`
}

// UnmarshalJSON accepts a duration string as a fixed delay, or a mapping.
func (d *DelayConfig) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		var fixed Duration
		if err := fixed.UnmarshalJSON(b); err != nil {
			return fmt.Errorf("delay: %v", err)
		}
		*d = DelayConfig{Mode: core.DelayFixed, Fixed: fixed}
		return nil
	}
	type plain DelayConfig // no UnmarshalJSON: no recursion
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var p plain
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("delay: %v", err)
	}
	*d = DelayConfig(p)
	return nil
}

// IdempotencyConfig is core.IdempotencyConfig.
type IdempotencyConfig struct {
	// Header carries the key. Default "Idempotency-Key".
	Header string `json:"header"`
	// TTL of replays. Default 10m; negative disables joins and replays.
	TTL Duration `json:"ttl"`
	// MaxEntries and MaxBytes bound the store. Defaults 10000 and 64MiB.
	MaxEntries int      `json:"max_entries"`
	MaxBytes   ByteSize `json:"max_bytes"`
	// MaxResponseBytes is the largest response kept. Default 1MiB.
	MaxResponseBytes ByteSize `json:"max_response_bytes"`
	// ScopeHeaders name the request headers that identify the caller: a
	// key is looked up per caller. Default Authorization, X-Api-Key,
	// Api-Key, X-Goog-Api-Key and budget.tenant_header when set.
	ScopeHeaders []string `json:"scope_headers"`
}

// BudgetConfig is core.BudgetConfig.
type BudgetConfig struct {
	// Ratio of requests that may start a hedge. Default 0.1; negative: no
	// budget.
	Ratio float64 `json:"ratio"`
	// Burst of the token bucket, in hedges. Default 10.
	Burst float64 `json:"burst"`
	// MaxConcurrentHedges in flight. Default 100; negative: no cap.
	MaxConcurrentHedges int `json:"max_concurrent_hedges"`
	// CoolDown after a 429/503 without Retry-After. Default 1s.
	CoolDown Duration `json:"cool_down"`
	// MaxCoolDown caps Retry-After. Default 60s.
	MaxCoolDown Duration `json:"max_cool_down"`
	// OverloadRate of 429/503 among the last OverloadWindow answers above
	// which no hedge starts. Defaults 0.2 and 100.
	OverloadRate   float64 `json:"overload_rate"`
	OverloadWindow int     `json:"overload_window"`
	// BreakerFailures consecutive failures open an upstream's circuit for
	// BreakerOpen. Defaults 5 and 10s.
	BreakerFailures int      `json:"breaker_failures"`
	BreakerOpen     Duration `json:"breaker_open"`
	// TenantHeader and TenantTokensPerMinute cap each tenant's extra prompt
	// tokens spent on hedges. Default off.
	TenantHeader          string `json:"tenant_header"`
	TenantTokensPerMinute int64  `json:"tenant_tokens_per_minute"`
}

// Defaults of the server-level settings.
const (
	DefaultGRPCListen             = "127.0.0.1:50051"
	DefaultMetricsListen          = "127.0.0.1:9464"
	DefaultMaxRecvMsgSize         = 4 << 20
	DefaultMaxImmediateResponse   = 4 << 20
	DefaultBodyChunk              = 64 << 10
	DefaultDrainTimeout           = 30 * time.Second
	DefaultHealthGrace            = 5 * time.Second
	DefaultOverrideMessageTimeout = 60 * time.Second
)

// LoadConfig reads, decodes and validates the configuration file at path,
// with defaults filled in.
func LoadConfig(path string) (*FileConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes and validates a configuration, with defaults filled in.
func ParseConfig(data []byte) (*FileConfig, error) {
	var cfg FileConfig
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		// The YAML library wraps encoding/json's message twice; the
		// message itself says what is wrong.
		msg := err.Error()
		for _, noise := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
			msg = strings.ReplaceAll(msg, noise, "")
		}
		return nil, fmt.Errorf("decoding: %s", msg)
	}
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

func (c *FileConfig) applyDefaults() {
	if c.GRPC.Listen == "" {
		c.GRPC.Listen = DefaultGRPCListen
	}
	if c.GRPC.MaxRecvMsgSize == 0 {
		c.GRPC.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if c.Metrics.Listen == "" {
		c.Metrics.Listen = DefaultMetricsListen
	}
	if c.Metrics.Path == "" {
		c.Metrics.Path = "/metrics"
	}
	if c.Log.Level == "" {
		c.Log.Level = "info"
	}
	if c.Log.Format == "" {
		c.Log.Format = "json"
	}
	if c.Log.Requests == nil {
		on := true
		c.Log.Requests = &on
	}
	if c.Shutdown.DrainTimeout == 0 {
		c.Shutdown.DrainTimeout = Duration(DefaultDrainTimeout)
	}
	if c.Shutdown.HealthGrace == nil {
		d := Duration(DefaultHealthGrace)
		c.Shutdown.HealthGrace = &d
	}
	e := &c.Envoy
	if e.RequestBodyMode == "" {
		e.RequestBodyMode = BodyModeFullDuplex
	}
	if e.StreamedImmediateResponse == nil {
		on := true
		e.StreamedImmediateResponse = &on
	}
	if e.MaxImmediateResponse == 0 {
		e.MaxImmediateResponse = DefaultMaxImmediateResponse
	}
	if e.BodyChunk == 0 {
		e.BodyChunk = DefaultBodyChunk
	}
	if e.OverrideMessageTimeout == nil {
		d := Duration(DefaultOverrideMessageTimeout)
		e.OverrideMessageTimeout = &d
	}
	t := &c.Transport
	if t.DialTimeout == 0 {
		t.DialTimeout = Duration(5 * time.Second)
	}
	if t.TLSHandshakeTimeout == 0 {
		t.TLSHandshakeTimeout = Duration(5 * time.Second)
	}
	if t.IdleConnTimeout == 0 {
		t.IdleConnTimeout = Duration(90 * time.Second)
	}
	if t.MaxIdleConnsPerHost == 0 {
		t.MaxIdleConnsPerHost = 64
	}
}

// Validate reports every problem of the configuration (defaults applied),
// one per line, each prefixed with where it is.
func (c *FileConfig) Validate() error {
	var errs []error
	bad := func(format string, args ...interface{}) { errs = append(errs, fmt.Errorf(format, args...)) }
	if _, _, err := net.SplitHostPort(c.GRPC.Listen); err != nil {
		bad("grpc.listen %q: %v", c.GRPC.Listen, err)
	}
	if c.GRPC.MaxRecvMsgSize < 1<<20 || c.GRPC.MaxRecvMsgSize > 1<<31-1 {
		bad("grpc.max_recv_msg_size %d: want 1MiB..2GiB", c.GRPC.MaxRecvMsgSize)
	}
	tls := c.GRPC.TLS
	if tls.Enabled() && (tls.CertFile == "" || tls.KeyFile == "") {
		bad("grpc.tls: cert_file and key_file must be set together")
	}
	if tls.ClientCAFile != "" && !tls.Enabled() {
		bad("grpc.tls.client_ca_file needs cert_file and key_file")
	}
	if c.Metrics.Listen != "off" {
		if _, _, err := net.SplitHostPort(c.Metrics.Listen); err != nil {
			bad("metrics.listen %q: %v (or \"off\")", c.Metrics.Listen, err)
		}
		if !strings.HasPrefix(c.Metrics.Path, "/") {
			bad("metrics.path %q must start with /", c.Metrics.Path)
		}
	}
	if _, err := parseLevel(c.Log.Level); err != nil {
		bad("log.level: %v", err)
	}
	if c.Log.Format != "json" && c.Log.Format != "console" {
		bad("log.format %q: want json or console", c.Log.Format)
	}
	if c.Shutdown.DrainTimeout < 0 {
		bad("shutdown.drain_timeout must not be negative")
	}
	if *c.Shutdown.HealthGrace < 0 {
		bad("shutdown.health_grace must not be negative")
	}
	e := c.Envoy
	if e.RequestBodyMode != BodyModeFullDuplex && e.RequestBodyMode != BodyModeBuffered {
		bad("envoy.request_body_mode %q: want %s or %s", e.RequestBodyMode, BodyModeFullDuplex, BodyModeBuffered)
	}
	if e.MaxImmediateResponse < 1024 || e.MaxImmediateResponse > c.GRPC.MaxRecvMsgSize {
		bad("envoy.max_immediate_response %d: want 1KiB..grpc.max_recv_msg_size", e.MaxImmediateResponse)
	}
	if e.BodyChunk < 1024 || e.BodyChunk > 4<<20 {
		bad("envoy.body_chunk %d: want 1KiB..4MiB", e.BodyChunk)
	}
	if *e.OverrideMessageTimeout < 0 {
		bad("envoy.override_message_timeout must not be negative")
	}
	t := c.Transport
	if t.DialTimeout < 0 || t.TLSHandshakeTimeout < 0 || t.IdleConnTimeout < 0 || t.MaxIdleConnsPerHost < 0 {
		bad("transport: timeouts and max_idle_conns_per_host must not be negative")
	}
	names := map[string]bool{}
	for i, r := range c.Routes {
		where := fmt.Sprintf("routes[%d]", i)
		if r.Name != "" {
			where += " (" + r.Name + ")"
		}
		switch {
		case r.Name == "":
			bad("%s: name is required", where)
		case names[r.Name]:
			bad("%s: name %q is used by another route", where, r.Name)
		}
		names[r.Name] = true
		for _, p := range r.Match.PathPrefixes {
			if !strings.HasPrefix(p, "/") {
				bad("%s: match.path_prefixes %q must start with /", where, p)
			}
		}
		for j, h := range r.Match.Headers {
			if h.Name == "" || strings.HasPrefix(h.Name, ":") || !httpguts.ValidHeaderFieldName(h.Name) {
				bad("%s: match.headers[%d]: name %q is not a valid header name", where, j, h.Name)
			}
		}
		cc, err := r.CoreConfig()
		if err != nil {
			bad("%s: %v", where, err)
			continue
		}
		if err := cc.Validate(); err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				bad("%s: %s", where, line)
			}
		}
	}
	return errors.Join(errs...)
}

// envReference is "${NAME}" in a set_headers value.
var envReference = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// expandEnv replaces every ${NAME} by the environment variable NAME; an
// unset variable is an error (an empty API key would only fail later, at
// the upstream, with a less useful message).
func expandEnv(value string) (string, error) {
	var missing []string
	out := envReference.ReplaceAllStringFunc(value, func(ref string) string {
		name := envReference.FindStringSubmatch(ref)[1]
		v, ok := os.LookupEnv(name)
		if !ok {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("environment variable %s is not set", strings.Join(missing, ", "))
	}
	return out, nil
}

// CoreConfig converts the route to the core schema (environment references
// in set_headers expanded).
func (r RouteConfig) CoreConfig() (core.Config, error) {
	cfg := core.Config{
		Route:        r.Name,
		MaxAttempts:  r.MaxAttempts,
		Timeout:      time.Duration(r.Timeout),
		MinTimeLeft:  time.Duration(r.MinTimeLeft),
		MaxBody:      int64(r.MaxBody),
		MaxPrefix:    int(r.MaxPrefix),
		MaxLine:      int(r.MaxLine),
		Methods:      r.Methods,
		PathPrefixes: r.PathPrefixes,
		FirstEvent:   r.FirstEvent,
		Delay: core.DelayConfig{
			Mode:       r.Delay.Mode,
			Fixed:      time.Duration(r.Delay.Fixed),
			Quantile:   r.Delay.Quantile,
			Min:        time.Duration(r.Delay.Min),
			Max:        time.Duration(r.Delay.Max),
			Window:     r.Delay.Window,
			MinSamples: r.Delay.MinSamples,
		},
		Idempotency: core.IdempotencyConfig{
			Header:           r.Idempotency.Header,
			TTL:              time.Duration(r.Idempotency.TTL),
			MaxEntries:       r.Idempotency.MaxEntries,
			MaxBytes:         int64(r.Idempotency.MaxBytes),
			MaxResponseBytes: int(r.Idempotency.MaxResponseBytes),
			ScopeHeaders:     r.Idempotency.ScopeHeaders,
		},
		Budget: core.BudgetConfig{
			Ratio:                 r.Budget.Ratio,
			Burst:                 r.Budget.Burst,
			MaxConcurrentHedges:   r.Budget.MaxConcurrentHedges,
			CoolDown:              time.Duration(r.Budget.CoolDown),
			MaxCoolDown:           time.Duration(r.Budget.MaxCoolDown),
			OverloadRate:          r.Budget.OverloadRate,
			OverloadWindow:        r.Budget.OverloadWindow,
			BreakerFailures:       r.Budget.BreakerFailures,
			BreakerOpen:           time.Duration(r.Budget.BreakerOpen),
			TenantHeader:          r.Budget.TenantHeader,
			TenantTokensPerMinute: r.Budget.TenantTokensPerMinute,
		},
		ReportHeader:     r.ReportHeader,
		StreamErrorEvent: r.StreamErrorEvent,
	}
	for i, u := range r.Upstreams {
		up := core.UpstreamConfig{Name: u.Name, URL: u.URL, DeleteHeaders: u.DeleteHeaders, Model: u.Model}
		if len(u.SetHeaders) > 0 {
			up.SetHeaders = make(map[string]string, len(u.SetHeaders))
			for name, value := range u.SetHeaders {
				v, err := expandEnv(value)
				if err != nil {
					return core.Config{}, fmt.Errorf("upstream %d: set_headers %s: %v", i, name, err)
				}
				up.SetHeaders[name] = v
			}
		}
		cfg.Upstreams = append(cfg.Upstreams, up)
	}
	return cfg, nil
}
