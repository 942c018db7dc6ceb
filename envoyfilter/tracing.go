package envoyfilter

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/grpc/metadata"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/oteltrace"
)

// serverTracing is one tracing section's pipeline: an SDK tracer provider
// (batch span processor, OTLP exporter) and the core.Tracer over it that
// every route's hedger gets. Kept across reloads that leave the section
// unchanged.
type serverTracing struct {
	key    string                   // tracingKey of the section; it may hold header values: never logged
	tp     *sdktrace.TracerProvider // nil when off or injected (Options.TracerProvider)
	tracer core.Tracer              // nil when off
	// httpTransport is the OTLP/HTTP exporter's own: closed with the
	// pipeline, so that a replaced pipeline keeps no connection open.
	httpTransport *http.Transport
}

// shutdown flushes the spans the pipeline still holds to its exporter and
// closes it, within ctx.
func (st *serverTracing) shutdown(ctx context.Context, log *zap.Logger) {
	if st.tp == nil {
		return
	}
	if err := st.tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: flushing the last spans failed", zap.Error(err))
	}
	if st.httpTransport != nil {
		st.httpTransport.CloseIdleConnections()
	}
}

// tracingKey identifies a tracing section: equal keys, same pipeline. ""
// when tracing is off.
func tracingKey(c TracingConfig) string {
	if !c.On() {
		return ""
	}
	// The environment the section defers to is part of it (a process's
	// environment does not change, but a test's may).
	resolved := struct {
		C                 TracingConfig
		Proto, Service    string
		Endpoint, Headers string
	}{c, c.protocol(), c.serviceName(), envTracesEndpoint(), envHeaders()}
	b, _ := json.Marshal(resolved)
	return string(b)
}

// newServerTracing builds the pipeline of section c; nothing when tracing
// is off. The exporter connects lazily: a collector that does not answer
// fails exports (logged by OpenTelemetry's error handler, the spans
// dropped), never the start.
func newServerTracing(c TracingConfig) (*serverTracing, error) {
	key := tracingKey(c)
	if key == "" {
		return &serverTracing{}, nil
	}
	exp, httpTransport, err := newExporter(c)
	if err != nil {
		return nil, err
	}
	// service.name last: the section's (or OTEL_SERVICE_NAME's) wins over
	// OTEL_RESOURCE_ATTRIBUTES.
	res, err := resource.New(context.Background(), resource.WithTelemetrySDK(), resource.WithFromEnv(),
		resource.WithAttributes(attribute.String("service.name", c.serviceName())))
	if err != nil && res == nil {
		_ = exp.Shutdown(context.Background())
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(*c.SampleRatio))),
	)
	return &serverTracing{key: key, tp: tp, tracer: newExtprocTracer(tp), httpTransport: httpTransport}, nil
}

// newExporter builds the OTLP exporter of section c, and for
// OTLP/HTTP the transport it sends with. Options left out (endpoint,
// headers) are the exporter's own reading of the standard
// OTEL_EXPORTER_OTLP_* variables. TLS verifies with the system's roots.
func newExporter(c TracingConfig) (*otlptrace.Exporter, *http.Transport, error) {
	headers := make(map[string]string, len(c.Headers))
	for name, value := range c.Headers {
		v, err := expandEnv(value)
		if err != nil {
			return nil, nil, errors.New("headers " + name + ": " + err.Error())
		}
		headers[name] = v
	}
	timeout := time.Duration(c.Timeout)
	ctx := context.Background()
	if c.protocol() == TracingProtoGRPC {
		opts := []otlptracegrpc.Option{otlptracegrpc.WithTimeout(timeout)}
		if c.Endpoint != "" {
			u, err := tracingEndpoint(c.Endpoint, TracingProtoGRPC)
			if err != nil {
				return nil, nil, err
			}
			opts = append(opts, otlptracegrpc.WithEndpoint(u.Host))
			if u.Scheme == "http" {
				opts = append(opts, otlptracegrpc.WithInsecure())
			}
		}
		if len(headers) > 0 {
			opts = append(opts, otlptracegrpc.WithHeaders(headers))
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		return exp, nil, err
	}
	// The exporter's default transport is shared by every exporter of the
	// process and never closed: its own one is closed with the pipeline.
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithTimeout(timeout),
		// No redirects: one to another host would carry the headers there.
		otlptracehttp.WithHTTPClient(&http.Client{Transport: tr, Timeout: timeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }})}
	if c.Endpoint != "" {
		u, err := tracingEndpoint(c.Endpoint, TracingProtoHTTP)
		if err != nil {
			return nil, nil, err
		}
		path := u.Path
		if path == "" || path == "/" {
			path = "/v1/traces"
		}
		opts = append(opts, otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(path))
		if u.Scheme == "http" {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
	}
	if len(headers) > 0 {
		opts = append(opts, otlptracehttp.WithHeaders(headers))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	return exp, tr, err
}

// envTracesEndpoint and envHeaders are the environment's exporter
// settings, for tracingKey.
func envTracesEndpoint() string {
	return os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") + " " + os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
}

func envHeaders() string {
	return os.Getenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS") + " " + os.Getenv("OTEL_EXPORTER_OTLP_HEADERS")
}

// tracingFlushTimeout bounds the flush of a tracer provider being shut
// down.
const tracingFlushTimeout = 5 * time.Second

// extprocTracer is oteltrace's tracer (each request's span a child of the
// trace context of its headers) that first looks where Envoy puts its own
// context. Envoy's ext_proc filter opens the gRPC stream with the
// request's active span as parent: its gRPC client starts a child span
// ("async envoy.service.ext_proc.v3.ExternalProcessor.Process egress") and
// injects that span's context into the stream's initial metadata
// (source/common/grpc/async_client_impl.cc, AsyncStreamImpl::initialize;
// ext_proc.cc openStream, setParentSpan). The request headers the filter
// sends are those of the client: Envoy writes its traceparent into them
// only later, in the router, when it forwards the request upstream.
type extprocTracer struct {
	inner core.Tracer
}

func newExtprocTracer(tp trace.TracerProvider) *extprocTracer {
	return &extprocTracer{inner: oteltrace.New(tp)}
}

// Start implements core.Tracer: the parent is the traceparent of the
// stream's gRPC metadata (Envoy's ext_proc span) when it holds a valid
// one, else that of the request headers (the client's), else none.
func (t *extprocTracer) Start(r *http.Request, start time.Time) core.Trace {
	if md, ok := metadata.FromIncomingContext(r.Context()); ok {
		if parent := md.Get("traceparent"); len(parent) == 1 && validTraceparent(parent[0]) {
			r = withTraceContext(r, parent[0], md.Get("tracestate"))
		}
	}
	return t.inner.Start(r, start)
}

// validTraceparent reports whether v is a W3C traceparent OpenTelemetry
// accepts.
func validTraceparent(v string) bool {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": v})
	return trace.SpanContextFromContext(ctx).IsValid()
}

// withTraceContext is r whose trace headers are traceparent and
// tracestate, for Start only: a shallow copy with its own header map, so
// that r's headers (which go to the upstreams) stay the client's.
func withTraceContext(r *http.Request, traceparent string, tracestate []string) *http.Request {
	h := r.Header.Clone()
	h["Traceparent"] = []string{traceparent}
	delete(h, "Tracestate")
	if len(tracestate) > 0 {
		h["Tracestate"] = tracestate
	}
	r2 := new(http.Request)
	*r2 = *r
	r2.Header = h
	return r2
}
