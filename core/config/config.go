// Package config is the one declaration of a hedged route's options:
// the schema, its units, defaults and shape checks, the names its values
// take, and the fleet's and the transport's settings. It imports nothing
// of the engine.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/llmhedge/llmhedge/core/redact"
)

// Config is the one declaration of a hedged route's options. Its JSON
// names (snake_case) are what Caddy's JSON and Envoy's YAML decode straight
// into; Traefik's camelCase mirror (traefikplugin/config.go) and the
// Caddyfile parser fill these fields too. Validate says what is wrong in
// plain words, and WithDefaults fills every zero field. Durations and sizes
// decode from strings ("250ms", "4MiB") and integers (nanoseconds, bytes).
type Config struct {
	// Route names the route in metrics and logs. Default "default".
	Route string `json:"route,omitempty"`
	// Upstreams are tried in order: attempt 0 goes to the first healthy one
	// (with Primary fastest, the first in the ranking), each hedge to the
	// next. At least one is required.
	Upstreams []UpstreamConfig `json:"upstreams,omitempty"`
	// Primary chooses attempt 0's upstream: ordered (default), the first
	// healthy one as configured; fastest, the healthy one whose recent TTFT
	// is lowest (see README, "Latency-aware routing"). Hedges go to the
	// next upstream in the same ranking.
	Primary string `json:"primary,omitempty"`
	// Delay decides when a hedge starts if no output event has arrived.
	// Default: fixed 1s.
	Delay DelayConfig `json:"delay,omitzero"`
	// MaxAttempts bounds the race, the first attempt included. Default 3.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// Timeout is the shared deadline of all attempts, the streamed answer
	// included. Zero means no deadline beyond the client's own.
	Timeout Duration `json:"timeout,omitempty"`
	// MinTimeLeft: a hedge is not started when less time than this is left
	// before the deadline. Default: the hedge delay in force.
	MinTimeLeft Duration `json:"min_time_left,omitempty"`
	// MaxBody is the largest request body that is buffered and hedged.
	// Larger bodies are forwarded once, unhedged, never cut. Default 4 MiB.
	MaxBody ByteSize `json:"max_body,omitempty"`
	// MaxPrefix bounds the bytes an attempt may produce before its first
	// output event (and the size of a buffered non-streaming answer).
	// Default 1 MiB.
	MaxPrefix ByteSize `json:"max_prefix,omitempty"`
	// MaxLine bounds one SSE/NDJSON line while looking for the first event.
	// Default 256 KiB.
	MaxLine ByteSize `json:"max_line,omitempty"`
	// Methods that may be hedged; others are proxied once. Default POST.
	Methods []string `json:"methods,omitempty"`
	// PathPrefixes that may be hedged; others are proxied once. Default:
	// every path.
	PathPrefixes []string `json:"path_prefixes,omitempty"`
	// FirstEvent is the rule that says which event carries model output:
	// auto (default), openai-chat, openai-responses, anthropic, any.
	FirstEvent string `json:"first_event,omitempty"`
	// Idempotency configures keys, joins and replays.
	Idempotency IdempotencyConfig `json:"idempotency,omitzero"`
	// Budget rations hedges.
	Budget BudgetConfig `json:"budget,omitzero"`
	// ReportHeader, when set, names a response header that reports the race
	// (attempts, winner, ttft). Default off.
	ReportHeader string `json:"report_header,omitempty"`
	// StreamErrorEvent: a failure after commit ends an SSE answer with a
	// final `event: error` instead of a cut stream. Default false.
	StreamErrorEvent bool `json:"stream_error_event,omitempty"`
	// EarlyHeaders is the grace time after which a streaming request whose
	// race is still undecided gets its response headers (200,
	// text/event-stream) and SSE keep-alive comments until the winner's
	// events follow (see earlyheaders.go). Default 1s; "off" (negative)
	// holds the headers until the winner commits.
	EarlyHeaders Duration `json:"early_headers,omitempty"`
	// HedgeStoredResponses asserts that a duplicated stored response is
	// acceptable on this route: requests that only store their answer
	// (the Responses API's default, "store": true) are hedged without an
	// idempotency key. Background jobs, conversations and tools that act
	// are still sent once. Default false.
	HedgeStoredResponses bool `json:"hedge_stored_responses,omitempty"`
	// Fleet shares joins, replays and conflicts of keyed requests across
	// replicas through Redis. Default off.
	Fleet FleetConfig `json:"fleet,omitzero"`
	// ValidateChecks (`validate`) are the checks an answer must pass before
	// it may win, any of json, json_schema, finish and no_refusal (items
	// may be comma-separated lists). A streamed answer is then held until
	// it is complete (at most MaxPrefix; beyond it it goes out unchecked).
	// Clients may add checks with X-LLM-Hedge-Validate. Default none.
	ValidateChecks []string `json:"validate,omitempty"`
	// ValidateSchema is the JSON schema json_schema checks the content
	// against when the request sends none (JSON text, or in JSON and YAML
	// the schema itself). Default none: then json_schema without a schema
	// in the request only checks that the content is JSON.
	ValidateSchema SchemaText `json:"validate_schema,omitempty"`
	// ValidateFailure is what the client gets when every attempt's answer
	// is invalid: "answer" (default), the most complete invalid answer
	// marked with X-LLM-Hedge-Validation, or "502", an error.
	ValidateFailure FailureMode `json:"validate_failure,omitempty"`
}

// SchemaText is a JSON schema as JSON text. It decodes from a string
// holding the text or from the schema itself (an object or a boolean).
type SchemaText string

// UnmarshalJSON accepts a string (the schema's text) or a schema.
func (s *SchemaText) UnmarshalJSON(b []byte) error {
	var text string
	if json.Unmarshal(b, &text) == nil {
		*s = SchemaText(text)
		return nil
	}
	if string(b) == "null" {
		return nil
	}
	if !json.Valid(b) {
		return fmt.Errorf("validate_schema: not JSON")
	}
	*s = SchemaText(bytes.TrimSpace(b))
	return nil
}

// FailureMode is ValidateFailure: "answer" or "502". It decodes from a
// string or the number 502 (an unquoted 502 in YAML).
type FailureMode string

// UnmarshalJSON accepts a string or a number.
func (m *FailureMode) UnmarshalJSON(b []byte) error {
	var text string
	if json.Unmarshal(b, &text) == nil {
		*m = FailureMode(text)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("validate_failure: want answer or 502")
	}
	*m = FailureMode(n.String())
	return nil
}

// UpstreamConfig is one place an attempt can go.
type UpstreamConfig struct {
	// Name in metrics and logs; it must not be a secret. Default: the
	// URL's host (host:port).
	Name string `json:"name,omitempty"`
	// URL is the base URL (http or https); the request path and query are
	// appended to its path. Required.
	URL string `json:"url"`
	// SetHeaders are set on every attempt to this upstream, replacing the
	// client's value (e.g. its API key). Values are never logged.
	SetHeaders map[string]string `json:"set_headers,omitempty"`
	// DeleteHeaders are removed from every attempt to this upstream.
	DeleteHeaders []string `json:"delete_headers,omitempty"`
	// Model, when set, replaces the top-level JSON "model" field of the body.
	Model string `json:"model,omitempty"`
	// PreferMargin (Primary fastest only) keeps this upstream the primary
	// unless its recent TTFT is slower than another's by more than this
	// fraction: 0.25 (JSON also "25%") prefers it unless it is 25 % slower.
	// Give it to the cheaper upstream. Default 0.
	PreferMargin Fraction `json:"prefer_margin,omitempty"`
}

// Delay modes.
const (
	DelayFixed    = "fixed"
	DelayAdaptive = "adaptive"
)

// DelayConfig says how long to wait for a first output event before
// hedging. In JSON it is a mapping of these fields, or a duration string
// alone: a fixed delay.
type DelayConfig struct {
	// Mode is fixed (default) or adaptive.
	Mode string `json:"mode,omitempty"`
	// Fixed is the delay in fixed mode, and in adaptive mode until enough
	// samples exist. Default 1s.
	Fixed Duration `json:"fixed,omitempty"`
	// Quantile of the primary upstream's TTFT in adaptive mode. Default 0.95.
	Quantile float64 `json:"quantile,omitempty"`
	// Min and Max clamp the adaptive delay. Defaults 50ms and 10s.
	Min Duration `json:"min,omitempty"`
	Max Duration `json:"max,omitempty"`
	// Window is how many recent TTFT samples the estimator keeps. Default 1000.
	Window int `json:"window,omitempty"`
	// MinSamples before the adaptive delay replaces Fixed. Default 50.
	MinSamples int `json:"min_samples,omitempty"`
}

// UnmarshalJSON accepts a duration string as a fixed delay, or a mapping
// of DelayConfig's fields (an unknown field is an error).
func (d *DelayConfig) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil // the convention of encoding/json: no change
	}
	var s string
	if json.Unmarshal(b, &s) == nil {
		var fixed Duration
		if err := fixed.UnmarshalJSON(b); err != nil {
			return fmt.Errorf("delay: %v", err)
		}
		*d = DelayConfig{Mode: DelayFixed, Fixed: fixed}
		return nil
	}
	type plain DelayConfig // no UnmarshalJSON: no recursion
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p plain
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("delay: %v", err)
	}
	*d = DelayConfig(p)
	return nil
}

// IdempotencyConfig configures keys, in-flight joins and replays.
type IdempotencyConfig struct {
	// Header carries the client's key and is sent to every attempt; a key
	// is generated when the client sends none. Default "Idempotency-Key".
	Header string `json:"header,omitempty"`
	// TTL a completed response is replayed for. Default 10m. Negative
	// ("off") disables joins and replays (keys are still generated and sent).
	TTL Duration `json:"ttl,omitempty"`
	// MaxEntries and MaxBytes bound the in-memory store. Defaults 10000 and
	// 64 MiB. In a fleet MaxBytes also bounds the route's stored answers in
	// Redis (fleet-wide), and MaxBytesPerCaller one caller's share of them
	// (default a quarter of MaxBytes); an answer that does not fit is not
	// stored (its flight is still joined; later requests run afresh).
	MaxEntries        int      `json:"max_entries,omitempty"`
	MaxBytes          ByteSize `json:"max_bytes,omitempty"`
	MaxBytesPerCaller ByteSize `json:"max_bytes_per_caller,omitempty"`
	// MaxResponseBytes is the largest response recorded for joins and
	// replays. Default 1 MiB.
	MaxResponseBytes ByteSize `json:"max_response_bytes,omitempty"`
	// ScopeHeaders name the request headers that identify the caller: a
	// key is looked up per caller (a hash of these headers' values), so one
	// caller can neither join nor replay another's answer. Default
	// Authorization, X-Api-Key, Api-Key, X-Goog-Api-Key and, when set,
	// Budget.TenantHeader. A caller identified any other way (a key in the
	// query, a cookie, mTLS, a proxy in front) needs them set.
	ScopeHeaders []string `json:"scope_headers,omitempty"`
}

// What a 429 to the caller's own credentials does (BudgetConfig.Caller429).
const (
	Caller429Caller = "caller"
	Caller429Route  = "route"
)

// BudgetConfig rations hedges (the extra load).
type BudgetConfig struct {
	// Ratio of requests that may start a hedge, as a token bucket refilled by
	// every request (and, without requests, all of Burst in 10 s). Default
	// 0.1. A negative value means no budget.
	Ratio float64 `json:"ratio,omitempty"`
	// Burst is the bucket's size in hedges. Default 10.
	Burst float64 `json:"burst,omitempty"`
	// MaxConcurrentHedges caps hedges in flight. Default 100; negative: no cap.
	MaxConcurrentHedges int `json:"max_concurrent_hedges,omitempty"`
	// CoolDown is how long an upstream is avoided after a 429/503 without a
	// Retry-After header. Default 1s. Retry-After is capped by MaxCoolDown
	// (default 60s).
	CoolDown    Duration `json:"cool_down,omitempty"`
	MaxCoolDown Duration `json:"max_cool_down,omitempty"`
	// OverloadRate of 429/503 answers among the last OverloadWindow answers
	// above which no hedge starts. Defaults 0.2 and 100 (20 answers at least).
	OverloadRate   float64 `json:"overload_rate,omitempty"`
	OverloadWindow int     `json:"overload_window,omitempty"`
	// BreakerFailures consecutive failures open an upstream's circuit for
	// BreakerOpen. Defaults 5 and 10s. Then one probe attempt at a time may
	// go through; each failed probe doubles the open time, at most 5
	// minutes or BreakerOpen if that is longer.
	BreakerFailures int      `json:"breaker_failures,omitempty"`
	BreakerOpen     Duration `json:"breaker_open,omitempty"`
	// Caller429 is what a 429 does when it answered the caller's own
	// credentials (the request carried Authorization, X-Api-Key, Api-Key or
	// X-Goog-Api-Key and the upstream passed it on unchanged): "caller"
	// (default) takes it for that caller's own rate limit, so it cools the
	// upstream for nobody, opens no breaker and counts toward no overload
	// stop (the attempt still fails over); "route" treats it as any 429.
	// A 429 to the route's own key (set_headers) always cools the route.
	Caller429 string `json:"caller_429,omitempty"`
	// TenantHeader names the header that identifies a tenant; with
	// TenantTokensPerMinute > 0 each tenant may spend at most that many
	// estimated extra prompt tokens (body bytes / 4) per minute on hedges.
	TenantHeader          string `json:"tenant_header,omitempty"`
	TenantTokensPerMinute int64  `json:"tenant_tokens_per_minute,omitempty"`
	// SpendCapTokensPerHour caps the estimated extra prompt tokens (body
	// bytes / 4 per hedge) the route may spend on hedges per clock hour,
	// fleet-wide with a fleet; once reached no hedge starts until the hour
	// ends (retries after failures still run). Default 0: no cap.
	SpendCapTokensPerHour int64 `json:"spend_cap_tokens_per_hour,omitempty"`
	// SpendCapUSDPerHour is the same cap in US dollars, at
	// PromptUSDPerMillion per million prompt tokens (required with it).
	// With both caps the lower one holds. Default 0: no cap.
	SpendCapUSDPerHour float64 `json:"spend_cap_usd_per_hour,omitempty"`
	// PromptUSDPerMillion is the price of a million prompt tokens, for
	// SpendCapUSDPerHour and the spend that llmhedge-ctl status shows.
	// Default 0: unpriced.
	PromptUSDPerMillion float64 `json:"prompt_usd_per_million,omitempty"`
}

// SpendCapTokens is the hourly spend cap in tokens (0: none): the lower
// of the token cap and the dollar cap at the configured price.
func (b BudgetConfig) SpendCapTokens() int64 {
	limit := b.SpendCapTokensPerHour
	if b.SpendCapUSDPerHour > 0 && b.PromptUSDPerMillion > 0 {
		byPrice := int64(b.SpendCapUSDPerHour / b.PromptUSDPerMillion * 1e6)
		if byPrice < 1 {
			byPrice = 1
		}
		if limit == 0 || byPrice < limit {
			limit = byPrice
		}
	}
	return limit
}

// ExpandUpstreams returns c with expand applied to every value of its
// upstreams that may hold a reference to the host's environment (Caddy's
// {env.X}, Envoy's ${X}): url, set_headers values and model. c itself is
// not changed. An error names the upstream and the field, never the value.
func (c Config) ExpandUpstreams(expand func(string) (string, error)) (Config, error) {
	ups := make([]UpstreamConfig, len(c.Upstreams))
	for i, u := range c.Upstreams {
		// Multi-value results go to locals first (Yaegi).
		rawURL, err := expand(u.URL)
		if err != nil {
			return c, fmt.Errorf("upstream %d: url: %v", i, err)
		}
		u.URL = rawURL
		model, err := expand(u.Model)
		if err != nil {
			return c, fmt.Errorf("upstream %d: model: %v", i, err)
		}
		u.Model = model
		if len(u.SetHeaders) > 0 {
			set := make(map[string]string, len(u.SetHeaders))
			for name, value := range u.SetHeaders {
				v, err := expand(value)
				if err != nil {
					return c, fmt.Errorf("upstream %d: set_headers %s: %v", i, name, err)
				}
				set[name] = v
			}
			u.SetHeaders = set
		}
		ups[i] = u
	}
	c.Upstreams = ups
	return c, nil
}

// Primary-selection policies (Config.Primary).
const (
	// PrimaryOrdered sends attempt 0 to the first healthy upstream in the
	// configured order, each hedge to the next.
	PrimaryOrdered = "ordered"
	// PrimaryFastest sends attempt 0 to the healthy upstream whose recent
	// TTFT is lowest (scaled by its prefer_margin), each hedge to the next
	// in the same ranking.
	PrimaryFastest = "fastest"
)

// The validity checks (Config.ValidateChecks, and the client's
// X-LLM-Hedge-Validate header).
const (
	ValidateJSON       = "json"        // the message content parses as JSON
	ValidateJSONSchema = "json_schema" // the content validates against the request's (or the route's) schema
	ValidateFinish     = "finish"      // the answer finished normally
	ValidateNoRefusal  = "no_refusal"  // the answer carries no refusal
)

// ValidateFailure values: what the client gets when every answer is invalid.
const (
	ValidateFailureAnswer = "answer" // the most complete invalid answer, marked (default)
	ValidateFailure502    = "502"    // a 502 upstream_invalid_answer error
)

// DefaultEarlyHeaders is the grace time of Config.EarlyHeaders: long
// enough that fast failures (a 400 or 401 arrives in milliseconds) keep
// their real status, short enough that a client's time-to-headers timeout
// (the OpenAI SDKs' `timeout`, Node's headersTimeout) does not become a
// time-to-first-token timeout.
const DefaultEarlyHeaders = time.Second

// First-event rules.
const (
	RuleAuto            = "auto"
	RuleOpenAIChat      = "openai-chat"
	RuleOpenAIResponses = "openai-responses"
	RuleAnthropic       = "anthropic"
	RuleAny             = "any"
)

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Route == "" {
		c.Route = "default"
	}
	ups := make([]UpstreamConfig, len(c.Upstreams))
	copy(ups, c.Upstreams)
	for i := range ups {
		if ups[i].Name == "" {
			ups[i].Name = DefaultUpstreamName(ups[i].URL, i)
		}
	}
	c.Upstreams = ups
	if c.Primary == "" {
		c.Primary = PrimaryOrdered
	}
	delayDefaults(&c.Delay)
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 3
	}
	if c.MaxBody == 0 {
		c.MaxBody = 4 << 20
	}
	if c.MaxPrefix == 0 {
		c.MaxPrefix = 1 << 20
	}
	if c.MaxLine == 0 {
		c.MaxLine = 256 << 10
	}
	if len(c.Methods) == 0 {
		c.Methods = []string{http.MethodPost}
	}
	if c.FirstEvent == "" {
		c.FirstEvent = RuleAuto
	}
	if c.ValidateFailure == "" {
		c.ValidateFailure = ValidateFailureAnswer
	}
	if c.EarlyHeaders == 0 {
		c.EarlyHeaders = Duration(DefaultEarlyHeaders)
	}
	idempotencyDefaults(&c.Idempotency, c.Budget.TenantHeader)
	if c.Fleet.Enabled() {
		c.Fleet = c.Fleet.WithDefaults()
	}
	budgetDefaults(&c.Budget)
	return c
}

// delayDefaults sets every zero field of d to its default.
func delayDefaults(d *DelayConfig) {
	if d.Mode == "" {
		d.Mode = DelayFixed
	}
	if d.Fixed == 0 {
		d.Fixed = Duration(time.Second)
	}
	if d.Quantile == 0 {
		d.Quantile = 0.95
	}
	if d.Min == 0 {
		d.Min = Duration(50 * time.Millisecond)
	}
	if d.Max == 0 {
		d.Max = Duration(10 * time.Second)
	}
	if d.Window == 0 {
		d.Window = 1000
	}
	if d.MinSamples == 0 {
		d.MinSamples = 50
	}
}

// idempotencyDefaults sets every zero field of c to its default; the
// tenant header (when set) joins the default scope.
func idempotencyDefaults(c *IdempotencyConfig, tenantHeader string) {
	if c.Header == "" {
		c.Header = "Idempotency-Key"
	}
	if c.TTL == 0 {
		c.TTL = Duration(10 * time.Minute)
	}
	if c.MaxEntries == 0 {
		c.MaxEntries = 10000
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 64 << 20
	}
	if c.MaxBytesPerCaller == 0 {
		c.MaxBytesPerCaller = c.MaxBytes / 4
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = 1 << 20
	}
	if len(c.ScopeHeaders) == 0 {
		scope := append([]string(nil), redact.CredentialHeaders...)
		if tenantHeader != "" {
			scope = append(scope, tenantHeader)
		}
		c.ScopeHeaders = scope
	} else {
		c.ScopeHeaders = append([]string(nil), c.ScopeHeaders...)
	}
}

// budgetDefaults sets every zero field of b to its default.
func budgetDefaults(b *BudgetConfig) {
	if b.Ratio == 0 {
		b.Ratio = 0.1
	}
	if b.Burst == 0 {
		b.Burst = 10
	}
	if b.MaxConcurrentHedges == 0 {
		b.MaxConcurrentHedges = 100
	}
	if b.CoolDown == 0 {
		b.CoolDown = Duration(time.Second)
	}
	if b.MaxCoolDown == 0 {
		b.MaxCoolDown = Duration(time.Minute)
	}
	if b.OverloadRate == 0 {
		b.OverloadRate = 0.2
	}
	if b.OverloadWindow == 0 {
		b.OverloadWindow = 100
	}
	if b.BreakerFailures == 0 {
		b.BreakerFailures = 5
	}
	if b.Caller429 == "" {
		b.Caller429 = Caller429Caller
	}
	if b.BreakerOpen == 0 {
		b.BreakerOpen = Duration(10 * time.Second)
	}
}

// DefaultUpstreamName is the name of upstream i when none is configured:
// its URL's host.
func DefaultUpstreamName(rawURL string, i int) string {
	if u, err := url.Parse(rawURL); err == nil && u.Host != "" {
		return u.Host
	}
	return fmt.Sprintf("upstream%d", i)
}

// Validate reports every problem of c (after defaults), joined, or nil.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	bad := func(format string, args ...interface{}) {
		errs = append(errs, fmt.Errorf(format, args...))
	}
	if len(c.Upstreams) == 0 {
		bad("at least one upstream is required")
	}
	for i, u := range c.Upstreams {
		validateUpstreamURL(bad, i, u.URL)
		for name, value := range u.SetHeaders {
			if !validHeaderName(name) {
				bad("upstream %d: header name %q is not a valid token", i, name)
			}
			if strings.ContainsAny(value, "\r\n\x00") {
				bad("upstream %d: header %q has a control character in its value", i, name)
			}
		}
		for _, name := range u.DeleteHeaders {
			if !validHeaderName(name) {
				bad("upstream %d: header name %q is not a valid token", i, name)
			}
		}
	}
	validateRouting(bad, &c)
	validateDelay(bad, &c.Delay)
	if c.MaxAttempts < 1 || c.MaxAttempts > 10 {
		bad("max_attempts %d: want 1..10", c.MaxAttempts)
	}
	if c.Timeout < 0 || c.MinTimeLeft < 0 {
		bad("timeout and min_time_left must not be negative")
	}
	if c.MaxBody < 0 || c.MaxPrefix < 1024 || c.MaxLine < 1024 {
		bad("max_body must be >= 0, max_prefix and max_line >= 1024 bytes")
	}
	for _, m := range c.Methods {
		if !validHeaderName(m) {
			bad("method %q is not a valid token", m)
		}
	}
	for _, p := range c.PathPrefixes {
		if !strings.HasPrefix(p, "/") {
			bad("path prefix %q must start with /", p)
		}
	}
	switch c.FirstEvent {
	case RuleAuto, RuleOpenAIChat, RuleOpenAIResponses, RuleAnthropic, RuleAny:
	default:
		bad("first_event %q: want auto, openai-chat, openai-responses, anthropic or any", c.FirstEvent)
	}
	validateIdempotency(bad, &c.Idempotency)
	validateBudget(bad, &c.Budget)
	if c.ReportHeader != "" && !validHeaderName(c.ReportHeader) {
		bad("report header %q is not a valid token", c.ReportHeader)
	}
	validateValidity(&c, bad)
	validateFleet(bad, c.Fleet)
	return errors.Join(errs...)
}

// validateDelay adds the problems of d (defaults applied) to bad.
func validateDelay(bad func(string, ...interface{}), d *DelayConfig) {
	if d.Mode != DelayFixed && d.Mode != DelayAdaptive {
		bad("delay mode %q: want fixed or adaptive", d.Mode)
	}
	if d.Fixed < 0 {
		bad("delay %v must not be negative", d.Fixed)
	}
	if d.Quantile <= 0 || d.Quantile >= 1 {
		bad("delay quantile %v must be between 0 and 1", d.Quantile)
	}
	if d.Min < 0 || d.Max < d.Min {
		bad("delay min %v and max %v: want 0 <= min <= max", d.Min, d.Max)
	}
	if d.Window < 1 || d.Window > 100000 {
		bad("delay window %d: want 1..100000 samples", d.Window)
	}
	if d.MinSamples < 1 || d.MinSamples > d.Window {
		bad("delay min_samples %d: want 1..window (%d)", d.MinSamples, d.Window)
	}
}

// validateIdempotency adds the problems of c (defaults applied) to bad.
func validateIdempotency(bad func(string, ...interface{}), c *IdempotencyConfig) {
	if !validHeaderName(c.Header) {
		bad("idempotency header %q is not a valid token", c.Header)
	}
	if c.MaxEntries < 1 || c.MaxBytes < 1 || c.MaxResponseBytes < 1 || c.MaxBytesPerCaller < 1 {
		bad("idempotency max_entries, max_bytes and max_response_bytes must be positive")
	}
	for _, name := range c.ScopeHeaders {
		if !validHeaderName(name) {
			bad("idempotency scope header %q is not a valid token", name)
		}
	}
}

// validateBudget adds the problems of b (defaults applied) to bad.
func validateBudget(bad func(string, ...interface{}), b *BudgetConfig) {
	if b.Ratio > 1 {
		bad("budget ratio %v must be at most 1", b.Ratio)
	}
	if b.Burst < 1 {
		bad("budget burst %v must be at least 1", b.Burst)
	}
	if b.CoolDown < 0 || b.MaxCoolDown < b.CoolDown {
		bad("budget cool_down %v and max_cool_down %v: want 0 <= cool_down <= max", b.CoolDown, b.MaxCoolDown)
	}
	if b.OverloadRate <= 0 || b.OverloadRate > 1 || b.OverloadWindow < 1 {
		bad("budget overload_rate must be in (0,1] and overload_window positive")
	}
	if b.Caller429 != Caller429Caller && b.Caller429 != Caller429Route {
		bad("budget caller_429 %q: want caller or route", b.Caller429)
	}
	if b.BreakerFailures < 1 || b.BreakerOpen <= 0 {
		bad("budget breaker_failures and breaker_open must be positive")
	}
	if b.TenantTokensPerMinute < 0 {
		bad("budget tenant_tokens_per_minute must not be negative")
	}
	if b.TenantTokensPerMinute > 0 && !validHeaderName(b.TenantHeader) {
		bad("budget tenant_tokens_per_minute needs a valid tenant_header")
	}
	if b.SpendCapTokensPerHour < 0 || b.SpendCapUSDPerHour < 0 || b.PromptUSDPerMillion < 0 {
		bad("budget spend_cap_tokens_per_hour, spend_cap_usd_per_hour and prompt_usd_per_million must not be negative")
	}
	if b.SpendCapUSDPerHour > 0 && b.PromptUSDPerMillion == 0 {
		bad("budget spend_cap_usd_per_hour needs prompt_usd_per_million (the price of a million prompt tokens)")
	}
}

// validateUpstreamURL checks upstream i's URL. Its messages quote the URL
// redacted: it may carry a credential the operator put there by mistake.
func validateUpstreamURL(bad func(string, ...interface{}), i int, raw string) {
	if raw == "" {
		bad("upstream %d: url is required", i)
		return
	}
	shown := redact.URL(raw)
	parsed, err := url.Parse(raw)
	switch {
	case err != nil:
		bad("upstream %d: url %q is not a valid URL: %s", i, shown, redact.ParseError(err, raw))
	case parsed.User != nil:
		// The engine sends attempts with RoundTrip, which never turns
		// userinfo into a header: the upstream would see no credential.
		bad("upstream %d: url %q has a user name or password, which is never sent; "+
			"remove it and set the header instead, e.g. set_headers Authorization \"Basic <base64 of user:password>\"", i, shown)
	case parsed.Scheme != "http" && parsed.Scheme != "https":
		bad("upstream %d: url %q: scheme must be http or https", i, shown)
	case parsed.Host == "":
		bad("upstream %d: url %q has no host", i, shown)
	case parsed.Fragment != "":
		bad("upstream %d: url %q must not have a fragment", i, shown)
	}
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(ch)) {
			return false
		}
	}
	return true
}

// validateRouting checks the primary policy and the upstreams' prefer
// margins of c (defaults applied).
func validateRouting(bad func(string, ...interface{}), c *Config) {
	if c.Primary != PrimaryOrdered && c.Primary != PrimaryFastest {
		bad("primary %q: want ordered or fastest", c.Primary)
	}
	for i, u := range c.Upstreams {
		if u.PreferMargin < 0 || u.PreferMargin > 10 {
			bad("upstream %d: prefer_margin %v: want 0..10 (0.25 or 25%% prefers it unless it is 25 %% slower)", i, float64(u.PreferMargin))
		}
		if u.PreferMargin != 0 && c.Primary != PrimaryFastest {
			bad("upstream %d: prefer_margin needs primary fastest (an ordered route always prefers the first upstream)", i)
		}
	}
}

// validateValidity adds the problems of c's validity options to bad.
func validateValidity(c *Config, bad func(string, ...interface{})) {
	if _, err := ParseChecks(c.ValidateChecks); err != nil {
		bad("%v", err)
	}
	switch string(c.ValidateFailure) {
	case "", ValidateFailureAnswer, ValidateFailure502:
	default:
		bad("validate_failure %q: want answer or 502", string(c.ValidateFailure))
	}
	if c.ValidateSchema != "" {
		var schema interface{}
		if err := json.Unmarshal([]byte(c.ValidateSchema), &schema); err != nil {
			bad("validate_schema is not JSON: %v", err)
		} else if _, ok := schema.(map[string]interface{}); !ok {
			if _, isBool := schema.(bool); !isBool {
				bad("validate_schema must be a JSON object (a schema), got %s", DescribeJSON(schema))
			}
		}
	}
}

// ParseChecks reads check names (Config.ValidateChecks, or the values of
// the X-LLM-Hedge-Validate header), each item a name or a comma-separated
// list of them, and returns them lower-cased, without empty names.
func ParseChecks(items []string) ([]string, error) {
	var names []string
	for _, item := range items {
		for _, name := range strings.Split(item, ",") {
			name = strings.TrimSpace(name)
			switch lower := strings.ToLower(name); lower {
			case "":
			case ValidateJSON, ValidateJSONSchema, ValidateFinish, ValidateNoRefusal:
				names = append(names, lower)
			default:
				return nil, fmt.Errorf("validate %q: want json, json_schema, finish or no_refusal", name)
			}
		}
	}
	return names, nil
}
