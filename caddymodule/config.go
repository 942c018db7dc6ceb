package caddymodule

import (
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmhedge/llmhedge/core"
)

// Upstream is one place an attempt can go. Attempt 0 goes to the first
// upstream, each hedge to the next one in order.
//
// Global placeholders ({env.*}, {system.*}, …) in url, set_headers values
// and model are replaced once, when the handler is provisioned, so an API key
// can stay in the environment and out of the adapted JSON.
type Upstream struct {
	// Name of the upstream in metrics, logs and placeholders. It must not be
	// a secret. Default: the URL's host (host:port).
	Name string `json:"name,omitempty"`

	// URL is the base URL (http or https, no query). The request's path and
	// query are appended to its path: https://api.openai.com plus
	// /v1/chat/completions gives https://api.openai.com/v1/chat/completions.
	// Required.
	URL string `json:"url"`

	// SetHeaders are set on every attempt sent to this upstream, replacing
	// the client's value (e.g. this upstream's own Authorization). Values
	// are never logged. Default: none.
	SetHeaders map[string]string `json:"set_headers,omitempty"`

	// DeleteHeaders are removed from every attempt sent to this upstream.
	// Default: none.
	DeleteHeaders []string `json:"delete_headers,omitempty"`

	// Model, when set, replaces the top-level JSON "model" field of the
	// request body sent to this upstream (cross-provider or cheaper-tier
	// hedging). Default: the client's model is kept.
	Model string `json:"model,omitempty"`
}

// Delay says how long to wait for the first output event before a hedge
// starts.
type Delay struct {
	// Mode is "fixed" or "adaptive". Default "fixed".
	Mode string `json:"mode,omitempty"`

	// Fixed is the delay in fixed mode, and in adaptive mode until
	// min_samples first tokens have been observed. Default 1s.
	Fixed caddy.Duration `json:"fixed,omitempty"`

	// Quantile of the primary upstream's observed time to first token that
	// the adaptive delay follows. Default 0.95.
	Quantile float64 `json:"quantile,omitempty"`

	// Min clamps the adaptive delay from below. Default 50ms.
	Min caddy.Duration `json:"min,omitempty"`

	// Max clamps the adaptive delay from above. Default 10s.
	Max caddy.Duration `json:"max,omitempty"`

	// Window is how many recent samples the adaptive estimator keeps
	// (constant memory). Default 1000.
	Window int `json:"window,omitempty"`

	// MinSamples observed before the adaptive delay replaces fixed.
	// Default 50.
	MinSamples int `json:"min_samples,omitempty"`
}

// Idempotency configures the idempotency key sent to every attempt, and
// joins and replays inside the gateway.
type Idempotency struct {
	// Header carries the client's key and is sent to every attempt; a key
	// is generated when the client sends none. Default "Idempotency-Key".
	Header string `json:"header,omitempty"`

	// TTL a completed response is replayed for, to a request with the same
	// key and body. A negative value turns joins and replays off (keys are
	// still sent). Default 10m.
	TTL caddy.Duration `json:"ttl,omitempty"`

	// MaxEntries bounds the number of stored responses. Default 10000.
	MaxEntries int `json:"max_entries,omitempty"`

	// MaxBytes bounds the stored responses' total size. Default 64 MiB.
	MaxBytes int64 `json:"max_bytes,omitempty"`

	// MaxResponseBytes is the largest response stored for joins and
	// replays. Default 1 MiB.
	MaxResponseBytes int `json:"max_response_bytes,omitempty"`

	// ScopeHeaders name the request headers that identify the caller: a
	// key is looked up per caller, so one caller never joins or replays
	// another's answer. Default Authorization, X-Api-Key, Api-Key,
	// X-Goog-Api-Key and the budget's tenant_header when set.
	ScopeHeaders []string `json:"scope_headers,omitempty"`
}

// Budget rations hedges: they are extra load on the upstreams.
type Budget struct {
	// Ratio of requests that may start a hedge, as a token bucket that
	// every request refills by this much. Negative: no budget. Default 0.1.
	Ratio float64 `json:"ratio,omitempty"`

	// Burst is the bucket's size, in hedges. Default 10.
	Burst float64 `json:"burst,omitempty"`

	// MaxConcurrentHedges caps the hedges in flight. Negative: no cap.
	// Default 100.
	MaxConcurrentHedges int `json:"max_concurrent_hedges,omitempty"`

	// CoolDown is how long an upstream is avoided after a 429 or 503
	// without Retry-After. Default 1s.
	CoolDown caddy.Duration `json:"cool_down,omitempty"`

	// MaxCoolDown caps a Retry-After cool-down. Default 1m.
	MaxCoolDown caddy.Duration `json:"max_cool_down,omitempty"`

	// OverloadRate of 429/503 answers among the last overload_window
	// answers above which no hedge starts. Default 0.2.
	OverloadRate float64 `json:"overload_rate,omitempty"`

	// OverloadWindow is the number of recent answers the overload rate is
	// computed over. Default 100.
	OverloadWindow int `json:"overload_window,omitempty"`

	// BreakerFailures consecutive failures open an upstream's circuit.
	// Default 5.
	BreakerFailures int `json:"breaker_failures,omitempty"`

	// BreakerOpen is how long an open circuit stays open. Default 10s.
	BreakerOpen caddy.Duration `json:"breaker_open,omitempty"`

	// TenantHeader names the request header that identifies a tenant.
	// Default: none.
	TenantHeader string `json:"tenant_header,omitempty"`

	// TenantTokensPerMinute caps each tenant's estimated extra prompt
	// tokens (body bytes / 4) spent on hedges per minute. 0: no cap.
	// Needs tenant_header. Default 0.
	TenantTokensPerMinute int64 `json:"tenant_tokens_per_minute,omitempty"`
}

// coreConfig converts the handler's JSON configuration to the core schema,
// replacing global placeholders with repl. Zero values stay zero: core fills
// in the defaults.
func (h *Handler) coreConfig(repl *caddy.Replacer) core.Config {
	cfg := core.Config{
		Route:            h.Route,
		MaxAttempts:      h.MaxAttempts,
		Timeout:          time.Duration(h.Timeout),
		MinTimeLeft:      time.Duration(h.MinTimeLeft),
		MaxBody:          h.MaxBody,
		MaxPrefix:        h.MaxPrefix,
		MaxLine:          h.MaxLine,
		Methods:          h.Methods,
		PathPrefixes:     h.PathPrefixes,
		FirstEvent:       h.FirstEvent,
		ReportHeader:     h.ReportHeader,
		StreamErrorEvent: h.StreamErrorEvent,
	}
	for _, u := range h.Upstreams {
		if u == nil {
			continue
		}
		up := core.UpstreamConfig{
			Name:          u.Name,
			URL:           repl.ReplaceKnown(u.URL, ""),
			DeleteHeaders: u.DeleteHeaders,
			Model:         repl.ReplaceKnown(u.Model, ""),
		}
		if len(u.SetHeaders) > 0 {
			up.SetHeaders = make(map[string]string, len(u.SetHeaders))
			for name, value := range u.SetHeaders {
				up.SetHeaders[name] = repl.ReplaceKnown(value, "")
			}
		}
		cfg.Upstreams = append(cfg.Upstreams, up)
	}
	if d := h.Delay; d != nil {
		cfg.Delay = core.DelayConfig{
			Mode:       d.Mode,
			Fixed:      time.Duration(d.Fixed),
			Quantile:   d.Quantile,
			Min:        time.Duration(d.Min),
			Max:        time.Duration(d.Max),
			Window:     d.Window,
			MinSamples: d.MinSamples,
		}
	}
	if i := h.Idempotency; i != nil {
		cfg.Idempotency = core.IdempotencyConfig{
			Header:           i.Header,
			TTL:              time.Duration(i.TTL),
			MaxEntries:       i.MaxEntries,
			MaxBytes:         i.MaxBytes,
			MaxResponseBytes: i.MaxResponseBytes,
			ScopeHeaders:     i.ScopeHeaders,
		}
	}
	if b := h.Budget; b != nil {
		cfg.Budget = core.BudgetConfig{
			Ratio:                 b.Ratio,
			Burst:                 b.Burst,
			MaxConcurrentHedges:   b.MaxConcurrentHedges,
			CoolDown:              time.Duration(b.CoolDown),
			MaxCoolDown:           time.Duration(b.MaxCoolDown),
			OverloadRate:          b.OverloadRate,
			OverloadWindow:        b.OverloadWindow,
			BreakerFailures:       b.BreakerFailures,
			BreakerOpen:           time.Duration(b.BreakerOpen),
			TenantHeader:          b.TenantHeader,
			TenantTokensPerMinute: b.TenantTokensPerMinute,
		}
	}
	return cfg
}
