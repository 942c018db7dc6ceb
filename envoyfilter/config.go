package envoyfilter

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	"golang.org/x/net/http/httpguts"
	"sigs.k8s.io/yaml"
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
	// Admin configures the HTTP admin listener (the per-process kill
	// switch). Default off.
	Admin AdminConfig `json:"admin"`
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
	// Fleet shares keyed requests with the other replicas through Redis,
	// for every route without a fleet of its own. Default off.
	Fleet config.FleetConfig `json:"fleet"`
	// Tracing exports a span per hedged request and per upstream attempt
	// over OTLP. Default off.
	Tracing TracingConfig `json:"tracing"`
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

// AdminConfig configures the HTTP admin listener: GET /switch lists this
// process's kill switches, POST /switch changes one (core/fleetstore/README.md's
// "Kill switch and llmhedge-ctl"). It has no authentication: keep it on
// loopback. It refuses what a web page could send (a foreign Origin, a
// Host other than a loopback name, the listener's address or
// AllowedHosts, a POST body not declared application/json).
type AdminConfig struct {
	// Listen is its address, e.g. "127.0.0.1:9902". Default "" (or "off"):
	// no admin listener. Not reloadable.
	Listen string `json:"listen"`
	// AllowedHosts are the further Host names the listener answers
	// ("name" for any port, "name:port" for one), e.g. the name of a
	// Kubernetes Service in front of it. Default none: loopback names and
	// addresses and the listener's own address only. Reloadable.
	AllowedHosts []string `json:"allowed_hosts"`
}

// Enabled reports whether the admin listener is configured.
func (c AdminConfig) Enabled() bool { return c.Listen != "" && c.Listen != "off" }

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

// TracingConfig configures the spans of hedged requests: an OpenTelemetry
// SDK tracer provider with a batch span processor and an OTLP exporter.
// Off unless endpoint is set or enabled is true: the environment alone
// (OTEL_EXPORTER_OTLP_ENDPOINT) never turns it on. Reloadable: a reload
// that changes the section builds a new exporter for new streams.
type TracingConfig struct {
	// Enabled turns tracing on or off. Default: on when endpoint is set.
	// enabled: true without an endpoint takes the endpoint from the
	// environment (see Endpoint).
	Enabled *bool `json:"enabled"`
	// Endpoint is the OTLP receiver's URL: http://host:port (plaintext)
	// or https://host:port (TLS, the system's roots). With http/protobuf a
	// URL without a path gets /v1/traces; a path is used as it is. With
	// grpc the URL has no path. Default: the standard environment
	// variables OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then
	// OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4318 (4317 for grpc).
	Endpoint string `json:"endpoint"`
	// Protocol is http/protobuf or grpc. Default:
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, then OTEL_EXPORTER_OTLP_PROTOCOL,
	// else http/protobuf.
	Protocol string `json:"protocol"`
	// ServiceName is the resource's service.name. Default: OTEL_SERVICE_NAME,
	// else "llmhedge-envoy". OTEL_RESOURCE_ATTRIBUTES adds attributes.
	ServiceName string `json:"service_name"`
	// SampleRatio is the share of requests traced among those whose
	// parent (the trace context Envoy sends) made no decision. Parent-based:
	// a sampled parent is always traced, an unsampled one never. Default 1.
	SampleRatio *float64 `json:"sample_ratio"`
	// Headers go with every export, e.g. a collector's API key. "${NAME}"
	// in a value is replaced by the environment variable NAME. Values are
	// never logged. Default: OTEL_EXPORTER_OTLP_HEADERS.
	Headers map[string]string `json:"headers"`
	// Timeout bounds one export. Default 10s.
	Timeout Duration `json:"timeout"`
}

// OTLP protocols of tracing.protocol.
const (
	TracingProtoHTTP = "http/protobuf"
	TracingProtoGRPC = "grpc"
)

// Defaults of the tracing section.
const (
	DefaultTracingServiceName = "llmhedge-envoy"
	DefaultTracingTimeout     = 10 * time.Second
)

// On reports whether tracing is on: enabled when set, else whether an
// endpoint is.
func (t TracingConfig) On() bool {
	if t.Enabled != nil {
		return *t.Enabled
	}
	return t.Endpoint != ""
}

// protocol is the OTLP protocol in force: the section's, else the
// environment's, else http/protobuf.
func (t TracingConfig) protocol() string {
	if t.Protocol != "" {
		return t.Protocol
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := os.Getenv(name); v != "" {
			return v
		}
	}
	return TracingProtoHTTP
}

// serviceName is the service.name in force.
func (t TracingConfig) serviceName() string {
	if t.ServiceName != "" {
		return t.ServiceName
	}
	if v := os.Getenv("OTEL_SERVICE_NAME"); v != "" {
		return v
	}
	return DefaultTracingServiceName
}

// validate reports the section's problems (defaults applied).
func (t TracingConfig) validate(bad func(format string, args ...interface{})) {
	if !t.On() {
		if t.Enabled == nil && (t.Protocol != "" || t.ServiceName != "" || len(t.Headers) > 0) {
			bad("tracing: settings without tracing.endpoint or tracing.enabled: true; tracing is off")
		}
		return
	}
	proto := t.protocol()
	if proto != TracingProtoHTTP && proto != TracingProtoGRPC {
		where := "tracing.protocol"
		if t.Protocol == "" {
			where = "tracing.protocol (from OTEL_EXPORTER_OTLP_PROTOCOL)"
		}
		bad("%s %q: want %s or %s", where, proto, TracingProtoHTTP, TracingProtoGRPC)
	}
	if t.Endpoint != "" {
		if _, err := tracingEndpoint(t.Endpoint, proto); err != nil {
			bad("tracing.endpoint: %v", err)
		}
	}
	if r := *t.SampleRatio; r < 0 || r > 1 {
		bad("tracing.sample_ratio %v: want 0..1", r)
	}
	if t.Timeout <= 0 {
		bad("tracing.timeout must be positive")
	}
	for name, value := range t.Headers {
		if !httpguts.ValidHeaderFieldName(name) {
			bad("tracing.headers: name %q is not a valid header name", name)
			continue
		}
		// The value is never quoted: it may hold a key.
		if v, err := expandEnv(value); err != nil {
			bad("tracing.headers %s: %v", name, err)
		} else if !validFieldValue(v) {
			bad("tracing.headers %s: the value has a control character", name)
		}
	}
}

// tracingEndpoint checks an endpoint URL and returns it parsed.
func tracingEndpoint(endpoint, proto string) (*url.URL, error) {
	u, err := url.Parse(endpoint)
	switch {
	case err != nil || u.Scheme != "http" && u.Scheme != "https":
		return nil, errors.New("want http://host:port (plaintext) or https://host:port (TLS)")
	case u.Host == "":
		return nil, errors.New("no host")
	case u.User != nil:
		return nil, errors.New("credentials in the URL: put them in tracing.headers")
	case u.RawQuery != "" || u.Fragment != "":
		return nil, errors.New("a query or fragment: want none")
	case proto == TracingProtoGRPC && u.Path != "" && u.Path != "/":
		return nil, errors.New("a path: an OTLP/gRPC endpoint has none")
	}
	return u, nil
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

// TransportConfig configures the HTTP client of upstream attempts:
// config.TransportConfig, in its snake_case names (README.md lists them).
type TransportConfig struct {
	config.TransportConfig
	// IdleConnTimeout is the earlier name of keepalive_idle_timeout, still
	// accepted.
	IdleConnTimeout Duration `json:"idle_conn_timeout,omitempty"`
}

// RouteConfig is one hedged route: which requests it takes over (Match)
// and the hedging options, config.Config's fields in its snake_case names
// (README.md lists them). "${NAME}" in an upstream's url, set_headers
// values and model is replaced by the environment variable NAME, so keys
// stay out of the file.
type RouteConfig struct {
	// Name names the route in metrics and logs. Required, unique.
	Name string `json:"name"`
	// Match selects the requests this route hedges.
	Match MatchConfig `json:"match"`
	config.Config
	// Route hides config.Config's route field: a route is named by name.
	Route routeIsName `json:"route,omitempty"`
}

// routeIsName rejects a route: field, which config.Config would accept.
type routeIsName struct{}

// UnmarshalJSON always fails: the route's name is its name field.
func (routeIsName) UnmarshalJSON([]byte) error {
	return errors.New(`unknown field "route": a route is named by name`)
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

// Duration and ByteSize are core's: "250ms", "4MiB" or integers.
type (
	Duration = config.Duration
	ByteSize = config.ByteSize
)

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

// applyDefaults fills every zero server-level setting from serverDefaults
// and the transport's from core.
func (c *FileConfig) applyDefaults() {
	if c.Transport.KeepAliveIdleTimeout == 0 {
		c.Transport.KeepAliveIdleTimeout = c.Transport.IdleConnTimeout
	}
	fillZero(reflect.ValueOf(c).Elem(), reflect.ValueOf(serverDefaults()))
	c.Transport.TransportConfig = c.Transport.TransportConfig.WithDefaults()
	for i := range c.Routes {
		if !c.Routes[i].Fleet.Enabled() {
			c.Routes[i].Fleet = c.Fleet // the server-wide fleet
		}
	}
}

// serverDefaults holds the default of every server-level setting.
func serverDefaults() FileConfig {
	requests, streamed := true, true
	grace, override := Duration(DefaultHealthGrace), Duration(DefaultOverrideMessageTimeout)
	ratio := 1.0
	return FileConfig{
		GRPC:     GRPCConfig{Listen: DefaultGRPCListen, MaxRecvMsgSize: DefaultMaxRecvMsgSize},
		Metrics:  MetricsConfig{Listen: DefaultMetricsListen, Path: "/metrics"},
		Log:      LogConfig{Level: "info", Format: "json", Requests: &requests},
		Shutdown: ShutdownConfig{HealthGrace: &grace, DrainTimeout: Duration(DefaultDrainTimeout)},
		Envoy: EnvoyConfig{RequestBodyMode: BodyModeFullDuplex, StreamedImmediateResponse: &streamed,
			MaxImmediateResponse: DefaultMaxImmediateResponse, BodyChunk: DefaultBodyChunk, OverrideMessageTimeout: &override},
		Tracing: TracingConfig{SampleRatio: &ratio, Timeout: Duration(DefaultTracingTimeout)},
	}
}

// fillZero sets every zero field of the struct v, nested structs field by
// field, to the field of defaults (the same type).
func fillZero(v, defaults reflect.Value) {
	for i := 0; i < v.NumField(); i++ {
		switch f := v.Field(i); {
		case f.Kind() == reflect.Struct:
			fillZero(f, defaults.Field(i))
		case f.IsZero():
			f.Set(defaults.Field(i))
		}
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
	if c.Admin.Enabled() {
		if _, _, err := net.SplitHostPort(c.Admin.Listen); err != nil {
			bad("admin.listen %q: %v (or \"off\")", c.Admin.Listen, err)
		}
	}
	for i, h := range c.Admin.AllowedHosts {
		if !validAdminHost(h) {
			bad("admin.allowed_hosts[%d] %q: want a host name or address, with a port or without (no scheme, no path)", i, h)
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
	if t := c.Transport; t.IdleConnTimeout != 0 && t.IdleConnTimeout != t.KeepAliveIdleTimeout {
		bad("transport: idle_conn_timeout is the earlier name of keepalive_idle_timeout: set one")
	}
	if err := c.Transport.Validate(); err != nil {
		errs = append(errs, err)
	}
	c.Tracing.validate(bad)
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

// validAdminHost reports whether h is a Host header value: "name",
// "name:port", an address or "[v6]:port".
func validAdminHost(h string) bool {
	if h == "" || strings.ContainsAny(h, "/?#@ \t") {
		return false
	}
	host := h
	if strings.HasPrefix(h, "[") || strings.Count(h, ":") == 1 {
		hh, port, err := net.SplitHostPort(h)
		if err != nil && strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
			hh, port, err = strings.Trim(h, "[]"), "1", nil
		}
		if err != nil || hh == "" || port == "" {
			return false
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return false
		}
		host = hh
	}
	return httpguts.ValidHostHeader(host)
}

// envReference is "${NAME}" in an upstream value.
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

// CoreConfig returns the route's core configuration, environment
// references in its upstreams expanded.
func (r RouteConfig) CoreConfig() (config.Config, error) {
	cfg := r.Config
	cfg.Route = r.Name
	fleetURL, err := expandEnv(cfg.Fleet.URL)
	if err != nil {
		return cfg, fmt.Errorf("fleet: url: %v", err)
	}
	cfg.Fleet.URL = fleetURL
	return cfg.ExpandUpstreams(expandEnv)
}
