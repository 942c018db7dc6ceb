package envoyfilter

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/llmhedge/llmhedge/core"
)

// Server is the ExternalProcessor gRPC service. Each ext_proc stream is one
// HTTP request: a request a route matches is hedged here and answered with
// an immediate response; any other continues through Envoy untouched.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	log     *zap.Logger
	metrics *Metrics
	clock   core.Clock
	// switches are the server's kill switches, served on its admin
	// listener; they outlive reloads.
	switches *core.Switches
	extra    core.Observer

	reloadMu sync.Mutex // serializes Reload; guards the transport fields
	// transport sends upstream attempts. When the server built it
	// (ownTransport), a reload with another transport section builds a new
	// one for the new routes; an injected one (Options.Transport) is kept.
	transport    http.RoundTripper
	ownTransport bool
	transportKey string                  // config.TransportKey of the built transport
	fleets       map[string]*serverFleet // by fleetKey, the fleets in use
	// tracing is the pipeline of the tracing section in force; a reload
	// that changes the section retires it (retiredTracing) and builds
	// another. injectedTracing (Options.TracerProvider) replaces both.
	tracing         *serverTracing
	injectedTracing *serverTracing
	retiredTracing  map[*serverTracing]*time.Timer
	current         atomic.Pointer[settings]
	inFlight        atomic.Int64
}

// settings is everything a configuration decides, swapped whole on reload.
// A stream reads it once, when its request headers arrive, and keeps its
// route's hedger to the end: a reload never changes a request in flight.
type settings struct {
	table       *routeTable
	envoy       EnvoyConfig
	logRequests bool
}

// Options are the parts of a Server that do not come from the
// configuration file.
type Options struct {
	// Logger. Default: a no-op logger.
	Logger *zap.Logger
	// Metrics. Default: new metrics in their own registry.
	Metrics *Metrics
	// Transport sends upstream attempts. Default: core.NewTransport of
	// the file's transport section, rebuilt by a reload that changes it
	// (or the contents of its tls_trusted_ca_certs). An injected Transport is kept: the file's transport section is
	// then ignored, at start and on reload.
	Transport http.RoundTripper
	// Clock drives core's delays and budgets, and App's drain grace
	// (shutdown.health_grace). Default: the system clock.
	Clock core.Clock
	// Observer, if set, also receives every hedged request's report (after
	// the metrics and the request log). It must not block.
	Observer core.Observer
	// TracerProvider, if set, traces every hedged request (a span per
	// request and per attempt, parented as the tracing section describes)
	// whatever the file's tracing section says: the section is then
	// ignored, at start and on reload. The embedding program owns it: the
	// server never shuts it down. Default: the tracing section's.
	TracerProvider trace.TracerProvider
}

// NewServer builds a Server for cfg (as returned by LoadConfig or
// ParseConfig: defaults applied, validated).
func NewServer(cfg *FileConfig, opts Options) (*Server, error) {
	s := &Server{log: opts.Logger, metrics: opts.Metrics, transport: opts.Transport, clock: opts.Clock, extra: opts.Observer,
		switches: core.NewSwitches()}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if s.metrics == nil {
		s.metrics = NewMetrics(s.eachHedger)
	}
	s.ownTransport = s.transport == nil
	if opts.TracerProvider != nil {
		s.injectedTracing = &serverTracing{key: "injected", tracer: newExtprocTracer(opts.TracerProvider)}
	}
	if err := s.apply(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// Metrics returns the server's metrics.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Switches are the server's kill switches (its admin listener's /switch).
func (s *Server) Switches() *core.Switches { return s.switches }

// Reload switches to cfg. New streams use it at once; streams in flight
// finish with the configuration they started with. Routes whose name and
// upstreams are unchanged keep their learned state. On error nothing
// changes.
func (s *Server) Reload(cfg *FileConfig) error {
	err := s.apply(cfg)
	s.countReload(err)
	return err
}

// countReload counts one reload, failed when err is not nil (the file
// could not be read or parsed, or its routes not built).
func (s *Server) countReload(err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	s.metrics.reloads.WithLabelValues(result).Inc()
}

func (s *Server) apply(cfg *FileConfig) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	var prev *routeTable
	if cur := s.current.Load(); cur != nil {
		prev = cur.table
	}
	transport := s.transport
	transportKey := s.transportKey
	var fresh, retired *http.Transport
	if s.ownTransport {
		caPEM, err := cfg.Transport.ReadCACerts()
		if err != nil {
			return err
		}
		transportKey = config.TransportKey(cfg.Transport.TransportConfig, caPEM)
		if transportKey != s.transportKey {
			// Streams in flight keep the old transport through their
			// hedgers; its idle connections close now, the busy ones
			// keepalive_idle_timeout after their last request.
			fresh, err = core.NewTransport(cfg.Transport.TransportConfig, caPEM)
			if err != nil {
				return err
			}
			transport = fresh
			retired, _ = s.transport.(*http.Transport)
		}
	}
	tracing, freshTracing, err := s.pickTracing(cfg.Tracing)
	if err != nil {
		if fresh != nil {
			fresh.CloseIdleConnections()
		}
		return fmt.Errorf("tracing: %w", err)
	}
	fleets := &fleetPicker{s: s, used: map[string]*serverFleet{}}
	table, err := buildRoutes(cfg.Routes, prev, transport, s.clock, s.switches, core.ObserverFunc(s.observe), fleets.fleet, tracing.tracer)
	if err != nil {
		fleets.abort()
		if fresh != nil {
			fresh.CloseIdleConnections()
		}
		if freshTracing {
			tracing.shutdown(context.Background(), s.log) // it traced nothing
		}
		return err
	}
	fleets.commit()
	if freshTracing {
		if tracing.tp != nil {
			endpoint := cfg.Tracing.Endpoint
			if endpoint == "" {
				endpoint = "(the OTEL_EXPORTER_OTLP_* environment, else the exporter's default)"
			}
			s.log.Info("tracing on", zap.String("endpoint", endpoint), zap.String("protocol", cfg.Tracing.protocol()),
				zap.String("service", cfg.Tracing.serviceName()), zap.Float64("sample_ratio", *cfg.Tracing.SampleRatio))
		} else if s.tracing != nil && s.tracing.tp != nil {
			s.log.Info("tracing off")
		}
		s.retireTracing(time.Duration(cfg.Shutdown.DrainTimeout))
		s.tracing = tracing
	}
	s.transport = transport
	s.transportKey = transportKey
	if retired != nil {
		retired.CloseIdleConnections()
	}
	s.current.Store(&settings{table: table, envoy: cfg.Envoy, logRequests: cfg.Log.Requests == nil || *cfg.Log.Requests})
	return nil
}

// pickTracing returns the tracing pipeline of section c: the injected
// one, the one in force when the section is unchanged, else a new one
// (fresh). Call with reloadMu held.
func (s *Server) pickTracing(c TracingConfig) (tracing *serverTracing, fresh bool, err error) {
	if s.injectedTracing != nil {
		return s.injectedTracing, false, nil
	}
	if s.tracing != nil && s.tracing.key == tracingKey(c) {
		return s.tracing, false, nil
	}
	tracing, err = newServerTracing(c)
	return tracing, err == nil, err
}

// retireTracing shuts the pipeline in force down after drain (streams in
// flight keep their hedgers, and so its tracer: their spans are exported
// if they end within drain), or at Close. Call with reloadMu held.
func (s *Server) retireTracing(drain time.Duration) {
	old := s.tracing
	if old == nil || old.tp == nil {
		return
	}
	if s.retiredTracing == nil {
		s.retiredTracing = make(map[*serverTracing]*time.Timer)
	}
	s.retiredTracing[old] = time.AfterFunc(drain, func() {
		s.reloadMu.Lock()
		_, ok := s.retiredTracing[old]
		delete(s.retiredTracing, old)
		s.reloadMu.Unlock()
		if ok {
			ctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
			old.shutdown(ctx, s.log)
			cancel()
		}
	})
}

// Close releases what the server holds beside its streams: it flushes the
// spans its tracing pipelines still hold to their exporters and closes
// them (within ctx), and closes its fleet clients. Call it once every
// stream has ended (App.Shutdown does); an injected TracerProvider is left
// to its owner.
func (s *Server) Close(ctx context.Context) {
	s.reloadMu.Lock()
	var pipelines []*serverTracing
	if s.tracing != nil {
		pipelines = append(pipelines, s.tracing)
	}
	s.tracing = nil
	for st, timer := range s.retiredTracing {
		timer.Stop()
		pipelines = append(pipelines, st)
	}
	s.retiredTracing = nil
	s.reloadMu.Unlock()
	for _, st := range pipelines {
		st.shutdown(ctx, s.log)
	}
	s.closeFleets()
}

// observe receives every hedged request's report.
func (s *Server) observe(r *core.Report) {
	s.metrics.Observe(r)
	if cur := s.current.Load(); cur != nil && cur.logRequests {
		requestLogger{log: s.log}.Observe(r)
	}
	if s.extra != nil {
		s.extra.Observe(r)
	}
}

// eachHedger yields the routes in force, for the scrape-time gauges.
func (s *Server) eachHedger(yield func(route string, h *core.Hedger)) {
	cur := s.current.Load()
	if cur == nil {
		return
	}
	for _, r := range cur.table.routes {
		yield(r.name, r.hedger)
	}
}

// InFlight returns the number of ext_proc streams open now.
func (s *Server) InFlight() int64 { return s.inFlight.Load() }

// Process implements the ExternalProcessor service: one call per HTTP
// request passing Envoy's ext_proc filter.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	s.inFlight.Add(1)
	s.metrics.streamsInFlight.Inc()
	defer func() {
		s.inFlight.Add(-1)
		s.metrics.streamsInFlight.Dec()
	}()
	st := newProcessStream(s, stream)
	err := st.run()
	s.metrics.streams.WithLabelValues(st.kind).Inc()
	return err
}
