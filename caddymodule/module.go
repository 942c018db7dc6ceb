// Package caddymodule is the Caddy v2 module http.handlers.llm_hedge and its
// Caddyfile directive llm_hedge: first-token hedging of LLM API requests
// inside Caddy. See README.md for the configuration, metrics, placeholders
// and log fields.
package caddymodule

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/internal/zapfields"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/oteltrace"
)

func init() {
	caddy.RegisterModule(Handler{})
	httpcaddyfile.RegisterHandlerDirective("llm_hedge", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("llm_hedge", httpcaddyfile.Before, "reverse_proxy")
}

// Handler hedges LLM API requests: it sends each request to its first
// upstream and, if no model output has arrived when the hedge delay passes
// (or the attempt failed in a retryable way), the same request to the next
// upstream; the first attempt with a real output event wins and is streamed
// to the client, the others are cancelled.
//
// The handler is terminal, like reverse_proxy: it answers every request it
// gets (requests it may not hedge are proxied once to the first healthy
// upstream) and never calls the next handler. Attempts go through the
// handler's own HTTP transport, never through Caddy's next handler.
type Handler struct {
	// The hedging options are config.Config's fields, in its snake_case
	// names (README.md lists them with their defaults). Global
	// placeholders ({env.*}, {system.*}, …) in an upstream's url,
	// set_headers values and model are replaced once, when the handler is
	// provisioned, so an API key can stay in the environment and out of
	// the adapted JSON.
	config.Config

	// Transport sends the attempts. Default: see config.TransportConfig.
	Transport *config.TransportConfig `json:"transport,omitempty"`

	// LogLevel of the per-request log line: auto, info or debug. Default
	// "auto" (info when a hedge started or was denied or the request did
	// not end ok, else debug).
	LogLevel string `json:"log_level,omitempty"`

	cfg          config.Config
	cfgErr       error
	transport    config.TransportConfig
	hedger       *core.Hedger
	httpTrans    *http.Transport
	stateKey     string
	transportKey string
	fleetKey     string
	metrics      *hedgeMetrics
	logger       *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.llm_hedge",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets up the handler: the core configuration (global
// placeholders replaced), the pooled transport and state, and the metrics.
// A configuration core rejects is reported by Validate.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.cfg = coreConfig(h.Config, caddy.NewReplacer())
	if h.Transport != nil {
		h.transport = *h.Transport
	}
	h.transport = h.transport.WithDefaults()
	h.cfgErr = h.cfg.Validate()
	if h.cfgErr != nil || h.transport.Validate() != nil {
		return nil // Validate reports every problem
	}
	caPEM, err := h.transport.ReadCACerts()
	if err != nil {
		return err
	}
	h.transportKey, h.httpTrans, err = acquireTransport(h.transport, caPEM)
	if err != nil {
		return err
	}
	var state *core.State
	h.stateKey, state, err = acquireState(h.cfg)
	if err != nil {
		return err
	}
	h.metrics = processMetrics()
	var fleet *core.Fleet
	if h.cfg.Fleet.Enabled() {
		h.fleetKey, fleet, err = acquireFleet(h.cfg.Fleet, h.metrics.Set)
		if err != nil {
			return err
		}
	}
	logger := h.logger
	h.hedger, err = core.New(h.cfg, core.Options{Transport: h.httpTrans, State: state, Observer: core.ObserverFunc(h.observe), Fleet: fleet, Switches: processSwitches,
		Tracer: tracer, Log: func(fields []core.LogField) { zapfields.LogFleetState(logger, fields) }})
	if err != nil {
		return err
	}
	h.cfg = h.hedger.Config()
	if err := h.metrics.register(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	h.metrics.live.add(h.hedger)
	return nil
}

// Validate reports what is wrong with the configuration, in core's words
// (every problem, joined).
func (h *Handler) Validate() error {
	var errs []error
	if h.cfgErr != nil {
		errs = append(errs, h.cfgErr)
	}
	if err := h.transport.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch h.LogLevel {
	case "", LogAuto, LogInfo, LogDebug:
	default:
		errs = append(errs, fmt.Errorf("log_level %q: want auto, info or debug", h.LogLevel))
	}
	if len(errs) == 0 && h.hedger == nil {
		errs = append(errs, errors.New("not provisioned"))
	}
	return errors.Join(errs...)
}

// Cleanup releases the pooled state and transport; they are destroyed when
// no loaded config uses them any more.
func (h *Handler) Cleanup() error {
	if h.hedger != nil && h.metrics != nil {
		h.metrics.live.remove(h.hedger)
	}
	var errs []error
	for _, key := range []string{h.stateKey, h.transportKey, h.fleetKey} {
		if key == "" {
			continue
		}
		if _, err := shared.Delete(key); err != nil {
			errs = append(errs, err)
		}
	}
	h.stateKey, h.transportKey, h.fleetKey = "", "", ""
	return errors.Join(errs...)
}

// tracer traces the requests that Caddy's tracing handler wraps: their
// context carries its recording span, the parent of the request's span
// (the attempts' spans nest under it), exported by the provider Caddy
// configured. Other requests cost one context lookup and send the
// client's trace headers unchanged. One instance: it holds no state.
var tracer = oteltrace.FromContext()

// ServeHTTP hedges r. It never calls next: the handler is terminal.
//
// When the winning upstream fails after the answer has started, the client
// must see a broken response, not a clean end: like reverse_proxy, the
// handler flushes what it has and panics with http.ErrAbortHandler, which
// net/http turns into an aborted connection (HTTP/1.1) or a reset stream
// (HTTP/2) without logging a stack. The request has been observed (metrics,
// placeholders, log line) before Handle returns.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if err := h.hedger.Handle(w, r); errors.Is(err, core.ErrStreamAborted) {
		//nolint:bodyclose // not a response body
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}
	return nil
}

// observe is the Hedger's Observer: core calls it on the request's
// goroutine when the request ends, with the request in the report.
func (h *Handler) observe(rep *core.Report) {
	h.metrics.Observe(rep)
	if rep.Request != nil {
		setPlaceholders(rep.Request, rep)
	}
	h.logReport(rep)
}

// parseCaddyfile unmarshals the llm_hedge directive.
func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	handler := new(Handler)
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return handler, err
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
