package envoyfilter

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/llmhedge/llmhedge/core"
)

// App is the llmhedge-extproc process around a Server: the gRPC listener
// with the health service, the metrics endpoint, reload on SIGHUP and the
// drain on SIGTERM.
type App struct {
	// Server is the ExternalProcessor service.
	Server *Server

	log        *zap.Logger
	level      zap.AtomicLevel
	configPath string
	cfg        atomic.Pointer[FileConfig] // the configuration last loaded
	started    *FileConfig                // the one the process started with
	tls        atomic.Pointer[tls.Config] // what a handshake uses now

	grpc        *grpc.Server
	health      *health.Server
	metricsHTTP *http.Server
	adminHTTP   *http.Server
	grpcLis     net.Listener
	metricsLis  net.Listener
	adminLis    net.Listener
	serving     sync.WaitGroup
	serveErr    chan error
	clock       core.Clock // times the drain's health grace
}

// HTTP/2 flow-control windows of the gRPC listener.
const (
	streamWindow = 1 << 20
	connWindow   = 16 << 20
)

// NewApp builds the process for cfg, loaded from configPath (re-read on
// Reload). level is the logger's level, changed by reloads.
func NewApp(configPath string, cfg *FileConfig, log *zap.Logger, level zap.AtomicLevel, opts Options) (*App, error) {
	if opts.Logger == nil {
		opts.Logger = log
	}
	srv, err := NewServer(cfg, opts)
	if err != nil {
		return nil, err
	}
	a := &App{Server: srv, log: log, level: level, configPath: configPath, serveErr: make(chan error, 2), clock: opts.Clock}
	if a.clock == nil {
		a.clock = core.SystemClock{}
	}
	a.cfg.Store(cfg)
	a.started = cfg
	serverOpts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(int(cfg.GRPC.MaxRecvMsgSize)),
		// Fixed HTTP/2 windows: gRPC's dynamic (BDP) window grows up to
		// 16 MiB per stream, and a stream's transport keeps what arrived
		// within its window even while the stream is held back (a full body
		// pipe), so the window is part of each stream's memory bound.
		// 1 MiB per stream is ample on the loopback or LAN hop to Envoy.
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		// Envoy may ping idle HTTP/2 connections (connection_keepalive);
		// gRPC's default policy would answer pings closer than 5 minutes
		// with GOAWAY "too_many_pings".
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	if cfg.GRPC.MaxConcurrentStreams > 0 {
		serverOpts = append(serverOpts, grpc.MaxConcurrentStreams(cfg.GRPC.MaxConcurrentStreams))
	}
	if cfg.GRPC.TLS.Enabled() {
		tlsCfg, err := a.tlsConfig(cfg.GRPC.TLS)
		if err != nil {
			return nil, err
		}
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	a.grpc = grpc.NewServer(serverOpts...)
	extprocv3.RegisterExternalProcessorServer(a.grpc, srv)
	a.health = health.NewServer()
	healthpb.RegisterHealthServer(a.grpc, a.health)
	if cfg.Metrics.Listen != "off" {
		mux := http.NewServeMux()
		mux.Handle(cfg.Metrics.Path, promhttp.HandlerFor(srv.Metrics().Registry, promhttp.HandlerOpts{}))
		a.metricsHTTP = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	}
	if cfg.Admin.Enabled() {
		mux := http.NewServeMux()
		// The per-process switch; the same JSON as the Caddy module's
		// admin endpoint. Nothing else guards this listener: the Host
		// check too (the allowed hosts of the configuration in force).
		mux.HandleFunc("/switch", func(w http.ResponseWriter, r *http.Request) {
			core.ServeSwitchAdminListener(a.Server.switches, w, r, a.cfg.Load().Admin.AllowedHosts, "admin.allowed_hosts")
		})
		a.adminHTTP = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	}
	return a, nil
}

// tlsConfig is the listener's TLS: every handshake takes the certificate
// and client CAs loaded last (GetConfigForClient), so a reload can swap
// them without a restart.
func (a *App) tlsConfig(t TLSConfig) (*tls.Config, error) {
	cur, err := loadTLS(t)
	if err != nil {
		return nil, err
	}
	a.tls.Store(cur)
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return a.tls.Load(), nil },
	}, nil
}

// loadTLS reads the certificate, key and client CAs t names into the
// configuration of a handshake.
func loadTLS(t TLSConfig) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("grpc.tls: %w", err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		// The config returned by GetConfigForClient negotiates ALPN:
		// gRPC clients require h2.
		NextProtos: []string{"h2"},
	}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("grpc.tls.client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("grpc.tls.client_ca_file %s: no PEM certificate", t.ClientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Start opens the listeners and serves in the background.
func (a *App) Start() error {
	cfg := a.cfg.Load()
	lis, err := net.Listen("tcp", cfg.GRPC.Listen)
	if err != nil {
		return fmt.Errorf("grpc.listen: %w", err)
	}
	// gRPC closes the listener when it stops accepting (GracefulStop);
	// the log line marks that moment of the drain.
	lis = &loggedListener{Listener: lis, log: a.log}
	a.grpcLis = lis
	if a.metricsHTTP != nil {
		mlis, err := net.Listen("tcp", cfg.Metrics.Listen)
		if err != nil {
			lis.Close()
			return fmt.Errorf("metrics.listen: %w", err)
		}
		a.metricsLis = mlis
		a.serving.Add(1)
		go func() {
			defer a.serving.Done()
			if err := a.metricsHTTP.Serve(mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.serveErr <- fmt.Errorf("metrics: %w", err)
			}
		}()
	}
	if a.adminHTTP != nil {
		alis, err := net.Listen("tcp", cfg.Admin.Listen)
		if err != nil {
			lis.Close()
			if a.metricsLis != nil {
				a.metricsHTTP.Close()
			}
			return fmt.Errorf("admin.listen: %w", err)
		}
		a.adminLis = alis
		if !isLoopback(alis.Addr()) {
			a.log.Warn("the admin listener is not on loopback: anyone who reaches it can pause hedging",
				zap.String("admin", alis.Addr().String()))
		}
		a.serving.Add(1)
		go func() {
			defer a.serving.Done()
			if err := a.adminHTTP.Serve(alis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.serveErr <- fmt.Errorf("admin: %w", err)
			}
		}()
	}
	a.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	a.health.SetServingStatus(extprocv3.ExternalProcessor_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	a.serving.Add(1)
	go func() {
		defer a.serving.Done()
		if err := a.grpc.Serve(lis); err != nil {
			a.serveErr <- fmt.Errorf("grpc: %w", err)
		}
	}()
	a.log.Info("llmhedge-extproc serving", zap.String("grpc", lis.Addr().String()),
		zap.String("metrics", a.MetricsAddr()), zap.String("admin", a.AdminAddr()), zap.Bool("tls", cfg.GRPC.TLS.Enabled()), zap.Int("routes", len(cfg.Routes)))
	return nil
}

// GRPCAddr is the gRPC listener's address (after Start).
func (a *App) GRPCAddr() string { return a.grpcLis.Addr().String() }

// MetricsAddr is the metrics listener's address, "" when off.
func (a *App) MetricsAddr() string {
	if a.metricsLis == nil {
		return ""
	}
	return a.metricsLis.Addr().String()
}

// AdminAddr is the admin listener's address, "" when off.
func (a *App) AdminAddr() string {
	if a.adminLis == nil {
		return ""
	}
	return a.adminLis.Addr().String()
}

// isLoopback reports whether addr is a loopback address.
func isLoopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// Errors reports a listener that stopped serving on its own.
func (a *App) Errors() <-chan error { return a.serveErr }

// Reload re-reads the configuration file and switches to it. Streams in
// flight keep their configuration; an invalid file, or TLS files of the
// new configuration that do not load, change nothing. Settings a running
// process cannot change (restartOnly) are logged by name and keep their
// running values; the certificate, key and client CAs are read from the
// paths of the new configuration.
func (a *App) Reload() error {
	cfg, err := LoadConfig(a.configPath)
	var newTLS *tls.Config
	if err == nil && a.started.GRPC.TLS.Enabled() && cfg.GRPC.TLS.Enabled() {
		newTLS, err = loadTLS(cfg.GRPC.TLS)
	}
	if err == nil {
		err = a.Server.Reload(cfg)
	} else {
		a.Server.countReload(err)
	}
	if err != nil {
		a.log.Error("configuration reload failed; keeping the running configuration", zap.Error(err))
		return err
	}
	if fields := restartOnly(a.started, cfg, a.Server.ownTransport, a.Server.injectedTracing == nil); len(fields) > 0 {
		a.log.Warn("restart-only settings changed; they keep their running values until a restart",
			zap.Strings("fields", fields))
	}
	if lvl, err := parseLevel(cfg.Log.Level); err == nil {
		a.level.SetLevel(lvl)
	}
	if newTLS != nil {
		a.tls.Store(newTLS)
	}
	a.cfg.Store(cfg)
	a.log.Info("configuration reloaded", zap.Int("routes", len(cfg.Routes)))
	return nil
}

// restartOnly names the settings that differ between the configuration
// the process started with and next but that a reload cannot apply: the listeners and
// the gRPC server's options are fixed when it starts, and so are TLS on or
// off and the log format. transportReloads is false when the upstream
// transport was injected (Options.Transport) and the file's transport
// section is not used; tracingReloads likewise for Options.TracerProvider
// and the tracing section.
func restartOnly(running, next *FileConfig, transportReloads, tracingReloads bool) []string {
	var fields []string
	changed := func(name string, differs bool) {
		if differs {
			fields = append(fields, name)
		}
	}
	changed("grpc.listen", running.GRPC.Listen != next.GRPC.Listen)
	changed("grpc.max_recv_msg_size", running.GRPC.MaxRecvMsgSize != next.GRPC.MaxRecvMsgSize)
	changed("grpc.max_concurrent_streams", running.GRPC.MaxConcurrentStreams != next.GRPC.MaxConcurrentStreams)
	changed("grpc.tls (on/off)", running.GRPC.TLS.Enabled() != next.GRPC.TLS.Enabled())
	changed("metrics.listen", running.Metrics.Listen != next.Metrics.Listen)
	changed("metrics.path", running.Metrics.Path != next.Metrics.Path)
	changed("admin.listen", running.Admin.Listen != next.Admin.Listen)
	changed("log.format", running.Log.Format != next.Log.Format)
	changed("transport", !transportReloads &&
		config.TransportKey(running.Transport.TransportConfig, nil) != config.TransportKey(next.Transport.TransportConfig, nil))
	changed("tracing", !tracingReloads && tracingKey(running.Tracing) != tracingKey(next.Tracing))
	return fields
}

// Drain is what SIGTERM starts. Health turns NOT_SERVING at once while the
// listener keeps accepting streams for shutdown.health_grace, so that
// Envoy's health checker sees the server leave before a connection is
// refused and Envoy stops sending it requests (new streams in the grace
// are served as usual). Then Shutdown with shutdown.drain_timeout. A
// SIGTERM or SIGINT on signals (nil: none) during the grace ends it early.
func (a *App) Drain(signals <-chan os.Signal) {
	cfg := a.cfg.Load()
	grace := time.Duration(*cfg.Shutdown.HealthGrace)
	a.health.Shutdown()
	a.log.Info("health NOT_SERVING; still accepting streams for the grace",
		zap.Duration("health_grace", grace), zap.Int64("streams", a.Server.InFlight()))
	if grace > 0 {
		over := make(chan struct{})
		timer := a.clock.AfterFunc(grace, func() { close(over) })
	wait:
		for {
			select {
			case <-over:
				break wait
			case sig := <-signals:
				if sig != syscall.SIGHUP {
					a.log.Info("second signal; ending the health grace early", zap.String("signal", sig.String()))
					timer.Stop()
					break wait
				}
			}
		}
	}
	a.Shutdown(time.Duration(cfg.Shutdown.DrainTimeout))
}

// Shutdown stops at once: health turns NOT_SERVING, the listener stops
// taking new streams, streams in flight may finish within timeout, then
// the rest are cancelled (which cancels their upstream attempts). It
// returns once every stream has ended.
func (a *App) Shutdown(timeout time.Duration) {
	a.health.Shutdown()
	open := a.Server.InFlight()
	a.log.Info("draining", zap.Int64("streams", open), zap.Duration("timeout", timeout))
	// Stop, from the timer, ends a GracefulStop still waiting on streams.
	force := time.AfterFunc(timeout, func() {
		a.log.Warn("drain timeout; cancelling the streams still open", zap.Int64("streams", a.Server.InFlight()))
		a.grpc.Stop()
	})
	a.grpc.GracefulStop()
	force.Stop()
	for _, srv := range []*http.Server{a.metricsHTTP, a.adminHTTP} {
		if srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = srv.Shutdown(ctx) // best effort at exit
			cancel()
		}
	}
	a.serving.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
	a.Server.Close(ctx) // flushes the last spans
	cancel()
	a.log.Info("stopped")
}

// loggedListener logs when the gRPC server stops accepting connections.
type loggedListener struct {
	net.Listener
	log  *zap.Logger
	once sync.Once
}

func (l *loggedListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() { l.log.Info("listener closed; no new connections") })
	return err
}

// Run serves until SIGTERM or SIGINT (then drains) or a listener fails,
// reloading on SIGHUP. signals carries the notifications (signal.Notify).
func (a *App) Run(signals <-chan os.Signal) error {
	if err := a.Start(); err != nil {
		return err
	}
	for {
		select {
		case sig := <-signals:
			if sig == syscall.SIGHUP {
				_ = a.Reload() // logs and counts its own failure
				continue
			}
			a.Drain(signals)
			return nil
		case err := <-a.serveErr:
			a.Shutdown(0)
			return err
		}
	}
}
