package traefikplugin

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// Config is the middleware's dynamic configuration, spelled in Traefik's
// camelCase: each field is the config.Config field its core tag names
// (documented there and in README.md, defaults from core's WithDefaults),
// durations as strings such as "250ms" because Traefik hands plugins plain
// strings and does not decode time.Duration. CreateConfig fills every
// field with its default, so a configuration only names what it changes:
//
//	upstreams:
//	  - url: http://127.0.0.1:9001
//	  - url: http://127.0.0.1:9002
//	delay: 50ms
type Config struct {
	// Route defaults to the Traefik middleware's name (e.g. "hedge@file").
	Route            string          `json:"route,omitempty" yaml:"route,omitempty" core:"Route"`
	Upstreams        []Upstream      `json:"upstreams,omitempty" yaml:"upstreams,omitempty"`
	Primary          string          `json:"primary,omitempty" yaml:"primary,omitempty" core:"Primary"`
	Delay            string          `json:"delay,omitempty" yaml:"delay,omitempty" core:"Delay.Fixed"`
	DelayMode        string          `json:"delayMode,omitempty" yaml:"delayMode,omitempty" core:"Delay.Mode"`
	DelayQuantile    float64         `json:"delayQuantile,omitempty" yaml:"delayQuantile,omitempty" core:"Delay.Quantile"`
	DelayMin         string          `json:"delayMin,omitempty" yaml:"delayMin,omitempty" core:"Delay.Min"`
	DelayMax         string          `json:"delayMax,omitempty" yaml:"delayMax,omitempty" core:"Delay.Max"`
	DelayWindow      int             `json:"delayWindow,omitempty" yaml:"delayWindow,omitempty" core:"Delay.Window"`
	DelayMinSamples  int             `json:"delayMinSamples,omitempty" yaml:"delayMinSamples,omitempty" core:"Delay.MinSamples"`
	MaxAttempts      int             `json:"maxAttempts,omitempty" yaml:"maxAttempts,omitempty" core:"MaxAttempts"`
	Timeout          string          `json:"timeout,omitempty" yaml:"timeout,omitempty" core:"Timeout"`
	MinTimeLeft      string          `json:"minTimeLeft,omitempty" yaml:"minTimeLeft,omitempty" core:"MinTimeLeft"`
	MaxBody          config.ByteSize `json:"maxBody,omitempty" yaml:"maxBody,omitempty" core:"MaxBody"`
	MaxPrefix        config.ByteSize `json:"maxPrefix,omitempty" yaml:"maxPrefix,omitempty" core:"MaxPrefix"`
	MaxLine          config.ByteSize `json:"maxLine,omitempty" yaml:"maxLine,omitempty" core:"MaxLine"`
	Methods          []string        `json:"methods,omitempty" yaml:"methods,omitempty" core:"Methods"`
	PathPrefixes     []string        `json:"pathPrefixes,omitempty" yaml:"pathPrefixes,omitempty" core:"PathPrefixes"`
	FirstEvent       string          `json:"firstEvent,omitempty" yaml:"firstEvent,omitempty" core:"FirstEvent"`
	Idempotency      Idempotency     `json:"idempotency,omitempty" yaml:"idempotency,omitempty"`
	Budget           Budget          `json:"budget,omitempty" yaml:"budget,omitempty"`
	ReportHeader     string          `json:"reportHeader,omitempty" yaml:"reportHeader,omitempty" core:"ReportHeader"`
	StreamErrorEvent bool            `json:"streamErrorEvent,omitempty" yaml:"streamErrorEvent,omitempty" core:"StreamErrorEvent"`
	// EarlyHeaders: "off" (also "false", "0", "0s") holds a streaming
	// race's headers until its winner; converted by earlyHeaders.
	EarlyHeaders         string   `json:"earlyHeaders,omitempty" yaml:"earlyHeaders,omitempty" core:"EarlyHeaders"`
	HedgeStoredResponses bool     `json:"hedgeStoredResponses,omitempty" yaml:"hedgeStoredResponses,omitempty" core:"HedgeStoredResponses"`
	Validate             []string `json:"validate,omitempty" yaml:"validate,omitempty" core:"ValidateChecks"`
	ValidateSchema       string   `json:"validateSchema,omitempty" yaml:"validateSchema,omitempty" core:"ValidateSchema"`
	ValidateFailure      string   `json:"validateFailure,omitempty" yaml:"validateFailure,omitempty" core:"ValidateFailure"`

	// The plugin's own options (core:"-"), README.md documents them.
	// PassThrough sends requests not eligible for hedging to the router's
	// service instead of the first upstream.
	PassThrough bool `json:"passThrough,omitempty" yaml:"passThrough,omitempty" core:"-"`
	// Log is "stdout" (default; Traefik shows it at DEBUG level), "stderr"
	// (ERROR level) or "off" (also "false" or "0", what an unquoted YAML
	// off becomes).
	Log string `json:"log,omitempty" yaml:"log,omitempty" core:"-"`
	// MetricsPath, when set, is a path answered with the llm_hedge_*
	// metrics in the Prometheus text format (metrics.go).
	MetricsPath string `json:"metricsPath,omitempty" yaml:"metricsPath,omitempty" core:"-"`
	// Fleet shares joins, replays and conflicts of keyed requests across
	// replicas through Redis. Default off.
	Fleet Fleet `json:"fleet,omitempty" yaml:"fleet,omitempty"`
	// Tracing exports a span per request and per attempt over OTLP/HTTP,
	// spelled like Traefik's own tracing options (tracing.go). Default off.
	Tracing Tracing `json:"tracing,omitempty" yaml:"tracing,omitempty"`
}

// Fleet is config.FleetConfig in Traefik's spelling.
type Fleet struct {
	// URL of the Redis server: redis://[user:password@]host:port/db or
	// rediss://.
	URL string `json:"url,omitempty" yaml:"url,omitempty" core:"Fleet.URL"`
	// PasswordEnv names an environment variable holding the password.
	PasswordEnv string `json:"passwordEnv,omitempty" yaml:"passwordEnv,omitempty" core:"Fleet.PasswordEnv"`
	// Timeout bounds every fleet operation. Default "50ms".
	Timeout string `json:"timeout,omitempty" yaml:"timeout,omitempty" core:"Fleet.Timeout"`
	// Prefix of every key. Default "llmhedge:".
	Prefix string `json:"prefix,omitempty" yaml:"prefix,omitempty" core:"Fleet.Prefix"`
	// Lease of a leader's claim, renewed every lease/3. Default "2s".
	Lease string `json:"lease,omitempty" yaml:"lease,omitempty" core:"Fleet.Lease"`
	// RetryInterval between tries of a Redis that failed. Default "500ms".
	RetryInterval string `json:"retryInterval,omitempty" yaml:"retryInterval,omitempty" core:"Fleet.RetryInterval"`
	// SyncInterval of the fleet's budget, health and switch sync. Default "250ms".
	SyncInterval string `json:"syncInterval,omitempty" yaml:"syncInterval,omitempty" core:"Fleet.SyncInterval"`
	// MaxFollowers caps this replica's requests following another's flight.
	MaxFollowers int `json:"maxFollowers,omitempty" yaml:"maxFollowers,omitempty" core:"Fleet.MaxFollowers"`
}

// Upstream is config.UpstreamConfig. SetHeaders values are never logged.
type Upstream struct {
	Name          string            `json:"name,omitempty" yaml:"name,omitempty" core:"Upstreams.Name"`
	URL           string            `json:"url,omitempty" yaml:"url,omitempty" core:"Upstreams.URL"`
	SetHeaders    map[string]string `json:"setHeaders,omitempty" yaml:"setHeaders,omitempty" core:"Upstreams.SetHeaders"`
	DeleteHeaders []string          `json:"deleteHeaders,omitempty" yaml:"deleteHeaders,omitempty" core:"Upstreams.DeleteHeaders"`
	Model         string            `json:"model,omitempty" yaml:"model,omitempty" core:"Upstreams.Model"`
	// PreferMargin is a fraction (0.25 prefers the upstream unless it is
	// 25 % slower).
	PreferMargin float64 `json:"preferMargin,omitempty" yaml:"preferMargin,omitempty" core:"Upstreams.PreferMargin"`
}

// Idempotency is config.IdempotencyConfig. TTL "off" disables joins and
// replays, and so do the forms an unquoted YAML off takes on its way here
// ("false", "0") and a zero duration ("0s").
type Idempotency struct {
	Header            string          `json:"header,omitempty" yaml:"header,omitempty" core:"Idempotency.Header"`
	TTL               string          `json:"ttl,omitempty" yaml:"ttl,omitempty" core:"Idempotency.TTL"`
	MaxEntries        int             `json:"maxEntries,omitempty" yaml:"maxEntries,omitempty" core:"Idempotency.MaxEntries"`
	MaxBytes          config.ByteSize `json:"maxBytes,omitempty" yaml:"maxBytes,omitempty" core:"Idempotency.MaxBytes"`
	MaxBytesPerCaller config.ByteSize `json:"maxBytesPerCaller,omitempty" yaml:"maxBytesPerCaller,omitempty" core:"Idempotency.MaxBytesPerCaller"`
	MaxResponseBytes  config.ByteSize `json:"maxResponseBytes,omitempty" yaml:"maxResponseBytes,omitempty" core:"Idempotency.MaxResponseBytes"`
	ScopeHeaders      []string        `json:"scopeHeaders,omitempty" yaml:"scopeHeaders,omitempty" core:"Idempotency.ScopeHeaders"`
}

// Budget is config.BudgetConfig.
type Budget struct {
	Ratio                 float64 `json:"ratio,omitempty" yaml:"ratio,omitempty" core:"Budget.Ratio"`
	Burst                 float64 `json:"burst,omitempty" yaml:"burst,omitempty" core:"Budget.Burst"`
	MaxConcurrentHedges   int     `json:"maxConcurrentHedges,omitempty" yaml:"maxConcurrentHedges,omitempty" core:"Budget.MaxConcurrentHedges"`
	CoolDown              string  `json:"coolDown,omitempty" yaml:"coolDown,omitempty" core:"Budget.CoolDown"`
	MaxCoolDown           string  `json:"maxCoolDown,omitempty" yaml:"maxCoolDown,omitempty" core:"Budget.MaxCoolDown"`
	OverloadRate          float64 `json:"overloadRate,omitempty" yaml:"overloadRate,omitempty" core:"Budget.OverloadRate"`
	OverloadWindow        int     `json:"overloadWindow,omitempty" yaml:"overloadWindow,omitempty" core:"Budget.OverloadWindow"`
	BreakerFailures       int     `json:"breakerFailures,omitempty" yaml:"breakerFailures,omitempty" core:"Budget.BreakerFailures"`
	BreakerOpen           string  `json:"breakerOpen,omitempty" yaml:"breakerOpen,omitempty" core:"Budget.BreakerOpen"`
	Caller429             string  `json:"caller429,omitempty" yaml:"caller429,omitempty" core:"Budget.Caller429"`
	TenantHeader          string  `json:"tenantHeader,omitempty" yaml:"tenantHeader,omitempty" core:"Budget.TenantHeader"`
	TenantTokensPerMinute int64   `json:"tenantTokensPerMinute,omitempty" yaml:"tenantTokensPerMinute,omitempty" core:"Budget.TenantTokensPerMinute"`
	SpendCapTokensPerHour int64   `json:"spendCapTokensPerHour,omitempty" yaml:"spendCapTokensPerHour,omitempty" core:"Budget.SpendCapTokensPerHour"`
	SpendCapUSDPerHour    float64 `json:"spendCapUsdPerHour,omitempty" yaml:"spendCapUsdPerHour,omitempty" core:"Budget.SpendCapUSDPerHour"`
	PromptUSDPerMillion   float64 `json:"promptUsdPerMillion,omitempty" yaml:"promptUsdPerMillion,omitempty" core:"Budget.PromptUSDPerMillion"`
}

// Log destinations.
const (
	logStdout = "stdout"
	logStderr = "stderr"
	logOff    = "off"
)

// ttlOff is the Idempotency.TTL value that disables joins and replays.
const ttlOff = "off"

// isOff reports whether v is one of the spellings "off" arrives in. YAML
// 1.1 (kubectl, sigs.k8s.io/yaml) reads an unquoted off/no/false as the
// boolean false; Traefik's file provider hands it on as "false", and its
// plugin decoder (mapstructure, weakly typed) turns a boolean false into
// "0". So "off", "false" and "0", in any case, all mean off.
func isOff(v string) bool {
	v = strings.TrimSpace(v)
	return strings.EqualFold(v, "off") || strings.EqualFold(v, "false") || v == "0"
}

// isOn reports whether v is what an unquoted YAML 1.1 on/yes/true becomes
// on its way to the plugin ("true", or "1" from Traefik's decoder).
func isOn(v string) bool {
	v = strings.TrimSpace(v)
	return strings.EqualFold(v, "true") || v == "1"
}

// yamlTrueHint names the fix for an option that arrived as a YAML true.
const yamlTrueHint = "an unquoted on/yes/true in YAML is the boolean true, which arrives as \"1\" or \"true\""

// logDestination returns the canonical form of the log option (stdout,
// stderr or off), and false when it names none of them.
func logDestination(v string) (string, bool) {
	switch {
	case v == "" || strings.EqualFold(strings.TrimSpace(v), logStdout):
		return logStdout, true
	case strings.EqualFold(strings.TrimSpace(v), logStderr):
		return logStderr, true
	case isOff(v):
		return logOff, true
	}
	return "", false
}

// CreateConfig returns the configuration with every default filled in, as
// Traefik expects; the dynamic configuration is decoded on top of it. The
// defaults are read from core through the core tags, so the two can never
// disagree.
func CreateConfig() *Config {
	c := &Config{}
	defaults := config.Config{}.WithDefaults()
	copyDefaults(reflect.ValueOf(c).Elem(), reflect.ValueOf(defaults))
	c.Route = "" // the default is the middleware's name, known in New
	// The core's default depends on budget.tenantHeader, which the dynamic
	// configuration sets.
	c.Idempotency.ScopeHeaders = nil
	c.Log = logStdout
	c.Tracing.ServiceName = defaultTraceService
	c.Tracing.SampleRate = defaultSampleRate
	return c
}

// copyDefaults sets every option of the mirror struct m to the value of
// the core field its core tag names (durations as strings).
func copyDefaults(m reflect.Value, defaults reflect.Value) {
	for i := 0; i < m.NumField(); i++ {
		field := m.Type().Field(i)
		target := field.Tag.Get("core")
		switch {
		case target == "" && field.Type.Kind() == reflect.Struct:
			copyDefaults(m.Field(i), defaults)
		case target == "" || target == "-" || strings.HasPrefix(target, "Upstreams."):
		case field.Type.Kind() == reflect.String && fieldAt(defaults, target).Kind() == reflect.Int64:
			m.Field(i).SetString(time.Duration(fieldAt(defaults, target).Int()).String())
		default:
			m.Field(i).Set(fieldAt(defaults, target).Convert(field.Type))
		}
	}
}

// fieldAt is the field of v at a dotted path such as "Delay.Fixed".
func fieldAt(v reflect.Value, path string) reflect.Value {
	for _, name := range strings.Split(path, ".") {
		v = v.FieldByName(name)
	}
	return v
}

// coreConfig converts c to the engine's configuration. It reports every
// problem at once, each naming the option as it is spelled in Traefik.
func (c *Config) coreConfig(route string) (config.Config, error) {
	out, errs := c.toCore(route)
	if err := out.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, tracingErrors(&c.Tracing)...)
	if len(errs) > 0 {
		return config.Config{}, errors.Join(errs...)
	}
	return out, nil
}

// toCore copies every option to the core field its core tag names, with
// the options it could not read.
func (c *Config) toCore(route string) (config.Config, []error) {
	var out config.Config
	var errs []error
	copyOptions(reflect.ValueOf(&out).Elem(), reflect.ValueOf(c).Elem(), "", "", &errs)
	for i := range c.Upstreams {
		var up config.UpstreamConfig
		copyOptions(reflect.ValueOf(&up).Elem(), reflect.ValueOf(c.Upstreams[i]), "", "Upstreams.", &errs)
		up.URL = strings.TrimSpace(up.URL)
		out.Upstreams = append(out.Upstreams, up)
	}
	out.Route = route
	if c.Route != "" {
		out.Route = c.Route
	}
	out.Idempotency.TTL = idempotencyTTL(c.Idempotency.TTL, &errs)
	out.EarlyHeaders = earlyHeaders(c.EarlyHeaders, &errs)
	if _, ok := logDestination(c.Log); !ok {
		if isOn(c.Log) {
			errs = append(errs, fmt.Errorf("log %q: want stdout, stderr or off (%s: write one of the three)", c.Log, yamlTrueHint))
		} else {
			errs = append(errs, fmt.Errorf("log %q: want stdout, stderr or off", c.Log))
		}
	}
	return out, errs
}

// copyOptions copies every option of the mirror struct m into dst, at the
// path its core tag names less trim. Duration strings are parsed, with
// errors that name the option as spelled in Traefik (prefix + its name).
// Route, the upstreams and idempotency.ttl are converted by toCore.
func copyOptions(dst, m reflect.Value, prefix, trim string, errs *[]error) {
	for i := 0; i < m.NumField(); i++ {
		field := m.Type().Field(i)
		option := prefix + strings.Split(field.Tag.Get("json"), ",")[0]
		target := field.Tag.Get("core")
		switch {
		case target == "" && field.Type.Kind() == reflect.Struct:
			copyOptions(dst, m.Field(i), option+".", trim, errs)
		case target == "" || target == "-" || target == "Route" || target == "Idempotency.TTL" || target == "EarlyHeaders":
		case field.Type.Kind() == reflect.String && fieldAt(dst, strings.TrimPrefix(target, trim)).Kind() == reflect.Int64:
			fieldAt(dst, strings.TrimPrefix(target, trim)).SetInt(int64(optionDuration(option, m.Field(i).String(), errs)))
		default:
			to := fieldAt(dst, strings.TrimPrefix(target, trim))
			to.Set(m.Field(i).Convert(to.Type()))
		}
	}
}

// optionDuration parses a duration option: "" is zero (the default), a
// negative duration is an error.
func optionDuration(option, value string, errs *[]error) config.Duration {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0
	}
	d, err := time.ParseDuration(value)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s %q is not a duration (write e.g. \"250ms\" or \"2s\")", option, value))
		return 0
	}
	if d < 0 {
		*errs = append(*errs, fmt.Errorf("%s %q must not be negative", option, value))
		return 0
	}
	return config.Duration(d)
}

// earlyHeaders converts the earlyHeaders option: "" is the default, off
// (in every form isOff accepts) and "0s" turn early headers off (-1 for
// the engine), anything else must be a positive duration.
func earlyHeaders(v string, errs *[]error) config.Duration {
	switch {
	case strings.TrimSpace(v) == "":
		return 0
	case isOff(v):
		return -1
	}
	before := len(*errs)
	d := optionDuration("earlyHeaders", v, errs)
	if d == 0 && len(*errs) == before {
		return -1
	}
	return d
}

// idempotencyTTL converts the idempotency.ttl option: "" is the default,
// off (in every form isOff accepts) and a zero duration such as "0s"
// disable joins and replays (-1 for the engine), anything else must be a
// positive duration.
func idempotencyTTL(v string, errs *[]error) config.Duration {
	switch {
	case strings.TrimSpace(v) == "":
		return 0
	case isOff(v):
		return -1
	case isOn(v):
		*errs = append(*errs, fmt.Errorf("idempotency.ttl %q is not a duration (%s: write a duration such as \"10m\", or off to disable joins and replays)", v, yamlTrueHint))
		return 0
	}
	before := len(*errs)
	d := optionDuration("idempotency.ttl", v, errs)
	if d == 0 && len(*errs) == before {
		return -1 // "0s": nothing is kept, so nothing is joined or replayed
	}
	return d
}
