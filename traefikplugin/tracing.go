package traefikplugin

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"

	"github.com/llmhedge/llmhedge/lighttrace"
)

// Tracing: a span per request and per attempt, exported over OTLP/HTTP
// (JSON) by package lighttrace, the standard-library tracer Yaegi can run
// (OpenTelemetry's SDK cannot be interpreted). Off unless
// tracing.otlp.http.endpoint is set; then each attempt also sends its own
// traceparent. The options are spelled like Traefik's own static tracing
// options. The plugin cannot see Traefik's span (it lives in the request's
// context as OpenTelemetry types Yaegi cannot import), so the request's
// span is a child of the request's traceparent header, the client's span.
//
// Like the fleets of fleet.go, exporters outlive handlers: one per
// (endpoint, serviceName, headers), made on the first request of a handler
// that names it and shared by every router and reload. New only checks
// the options. An exporter starts its goroutine with its first span and
// ends it when its queue is empty.

// Tracing is the tracing section of the configuration.
type Tracing struct {
	// ServiceName is the spans' service.name. Default "traefik", Traefik's.
	ServiceName string `json:"serviceName,omitempty" yaml:"serviceName,omitempty" core:"-"`
	// SampleRate is the share of new traces sampled (0 to 1, default 1); a
	// request with a traceparent follows its sampled flag.
	SampleRate float64 `json:"sampleRate,omitempty" yaml:"sampleRate,omitempty" core:"-"`
	// OTLP is where the spans go.
	OTLP TracingOTLP `json:"otlp,omitempty" yaml:"otlp,omitempty"`
}

// TracingOTLP is tracing.otlp.
type TracingOTLP struct {
	HTTP TracingOTLPHTTP `json:"http,omitempty" yaml:"http,omitempty"`
}

// TracingOTLPHTTP is tracing.otlp.http: the collector's OTLP/HTTP
// receiver.
type TracingOTLPHTTP struct {
	// Endpoint is the collector's URL, http or https: without a path,
	// spans go to /v1/traces; with one, to that path. Setting it turns
	// tracing on.
	Endpoint string `json:"endpoint,omitempty" yaml:"endpoint,omitempty" core:"-"`
	// Headers are sent with every post; their values are never logged.
	Headers map[string]string `json:"headers,omitempty" yaml:"headers,omitempty" core:"-"`
}

// Tracing defaults (Traefik's).
const (
	defaultTraceService = "traefik"
	defaultSampleRate   = 1.0
)

// tracingOn reports whether c turns tracing on.
func tracingOn(c *Tracing) bool { return strings.TrimSpace(c.OTLP.HTTP.Endpoint) != "" }

// tracingErrors are the problems of the tracing options, each naming the
// option; never a header's value.
func tracingErrors(c *Tracing) []error {
	if !tracingOn(c) {
		return nil
	}
	var errs []error
	if _, err := lighttrace.TracesURL(c.OTLP.HTTP.Endpoint); err != nil {
		errs = append(errs, fmt.Errorf("tracing.otlp.http.endpoint: %w", err))
	}
	if err := lighttrace.CheckHeaders(c.OTLP.HTTP.Headers); err != nil {
		errs = append(errs, fmt.Errorf("tracing.otlp.http.headers: %w", err))
	}
	if r := c.SampleRate; math.IsNaN(r) || r < 0 || r > 1 {
		errs = append(errs, fmt.Errorf("tracing.sampleRate %v: want a share from 0 to 1", r))
	}
	return errs
}

// traceSettings are a handler's checked tracing options.
type traceSettings struct {
	key        string // the exporter's, see exporterKey
	endpoint   string
	service    string
	headers    map[string]string
	sampleRate float64
}

// traceSettingsOf returns the settings of a checked configuration; nil
// when tracing is off.
func traceSettingsOf(c *Tracing) *traceSettings {
	if !tracingOn(c) {
		return nil
	}
	s := &traceSettings{endpoint: strings.TrimSpace(c.OTLP.HTTP.Endpoint), service: strings.TrimSpace(c.ServiceName),
		sampleRate: c.SampleRate}
	if s.service == "" {
		s.service = defaultTraceService
	}
	s.headers = make(map[string]string, len(c.OTLP.HTTP.Headers))
	for k, v := range c.OTLP.HTTP.Headers {
		s.headers[k] = v
	}
	s.key = exporterKey(s)
	return s
}

// exporterKey identifies an exporter: endpoint, service and headers (the
// values included: they stay in memory, never in a log).
func exporterKey(s *traceSettings) string {
	names := make([]string, 0, len(s.headers))
	for k := range s.headers {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString(s.endpoint)
	b.WriteString("\x00")
	b.WriteString(s.service)
	for _, k := range names {
		b.WriteString("\x00")
		b.WriteString(k)
		b.WriteString("\x01")
		b.WriteString(s.headers[k])
	}
	return b.String()
}

// exporterRegistry holds the process's exporters.
type exporterRegistry struct {
	mu        sync.Mutex
	exporters map[string]*lighttrace.Exporter // by exporterKey
}

var exporters = &exporterRegistry{exporters: make(map[string]*lighttrace.Exporter)}

// tracerFor returns a tracer of s on its shared exporter, making the
// exporter on first use (which starts nothing).
func tracerFor(g *exporterRegistry, s *traceSettings) (*lighttrace.Tracer, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e, ok := g.exporters[s.key]
	if !ok {
		made, err := lighttrace.NewExporter(lighttrace.Options{Endpoint: s.endpoint, ServiceName: s.service, Headers: s.headers})
		if err != nil {
			return nil, err
		}
		e = made
		g.exporters[s.key] = e
	}
	return lighttrace.NewTracer(e, s.sampleRate), nil
}

// traceStats sums the counts of every exporter; ok is false when there
// is none (tracing never used).
func traceStats(g *exporterRegistry) (lighttrace.Stats, bool) {
	var sum lighttrace.Stats
	g.mu.Lock()
	n := len(g.exporters)
	for _, e := range g.exporters {
		s := e.Stats()
		sum.Exported += s.Exported
		sum.Dropped += s.Dropped
		sum.FailedPosts += s.FailedPosts
		sum.FailedSpans += s.FailedSpans
	}
	g.mu.Unlock()
	return sum, n > 0
}
