// Package traefikplugin is llmhedge as a Traefik middleware plugin: it races
// a second upstream attempt against a slow first one, decides the race on
// the first real output token of an LLM stream (not on response headers),
// cancels the loser and streams the winner to the client.
//
// Traefik runs plugins in the Yaegi interpreter, so this package and core/
// use the standard library only, avoid `select` (unsafe under concurrent
// interpretation in Yaegi v0.16.1) and start nothing in New: Traefik calls New
// per router and on every reload and never closes a handler.
package traefikplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
)

// Hedge is the middleware's handler.
type Hedge struct {
	name        string
	next        http.Handler
	cfg         config.Config
	passThrough bool
	logOut      io.Writer      // nil: no log lines
	metricsPath string         // "": no metrics (see metrics.go)
	tracing     *traceSettings // nil: no traces (see tracing.go)

	// stateKey keys the route's shared state; newSeq is this handler's New
	// in the registry's count (see shared.go).
	stateKey string
	newSeq   uint64

	mu     sync.Mutex
	hedger *core.Hedger // built on the first request
	entry  *sharedEntry // the shared state's entry, with hedger
	reg    *registry    // the registry that holds entry
}

// New validates config and returns the middleware. It starts no goroutine
// and opens nothing: the transport and the route's shared state are taken
// on the first request.
func New(ctx context.Context, next http.Handler, config *Config, name string) (http.Handler, error) {
	if config == nil {
		config = CreateConfig()
	}
	cfg, err := config.coreConfig(name)
	if err != nil {
		return nil, fmt.Errorf("llmhedge middleware %q: invalid configuration: %w", name, err)
	}
	if p := config.MetricsPath; p != "" && !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("llmhedge middleware %q: invalid configuration: metricsPath %q must start with /", name, p)
	}
	if err := checkFleet(cfg.Fleet); err != nil {
		return nil, fmt.Errorf("llmhedge middleware %q: invalid configuration: fleet: %w", name, err)
	}
	h := &Hedge{name: name, next: next, cfg: cfg.WithDefaults(), passThrough: config.PassThrough, metricsPath: config.MetricsPath}
	h.tracing = traceSettingsOf(&config.Tracing)
	h.stateKey = core.StateKey(h.cfg)
	// A New is a use of the route's state: Traefik calls New for every
	// live middleware on every reload, so an unchanged route keeps it.
	h.newSeq = shared.touch(h.cfg.Route, h.stateKey)
	dest, _ := logDestination(config.Log) // coreConfig has checked it
	switch dest {
	case logStdout:
		h.logOut = os.Stdout
	case logStderr:
		h.logOut = os.Stderr
	}
	return h, nil
}

// ServeHTTP hedges r, or hands it to the next handler once when it is not
// eligible and PassThrough is set (an opted-out request only when no
// upstream rewrites the model: next would not rewrite it). The rare
// branches are functions of their own: under Yaegi a call allocates every
// slot of its frame, taken branch or not.
func (h *Hedge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.metricsPath != "" && servedMetrics(h, w, r) {
		return
	}
	// Read under the lock without a deferred unlock or a method call:
	// under Yaegi both cost more than the rest of this function.
	h.mu.Lock()
	engine := h.hedger
	entry := h.entry
	h.mu.Unlock()
	if engine == nil {
		engine = firstEngine(h, w)
		if engine == nil {
			return // answered
		}
	} else if atomic.AddUint32(&entry.requests, 1)&sweepEveryRequests == 0 {
		// Requests are uses (the registry keeps states in use), and now
		// and then one sweeps it.
		sweepFromRequest(h.reg) // set with entry, never changed
	}
	if h.passThrough && passedToNext(h, engine, w, r) {
		return
	}
	// w is Traefik's own (compiled) writer. The engine flushes it after
	// every chunk it copies through http.Flusher, the compiled interface
	// Yaegi matches on compiled writers (core's flusherFor).
	// core.HandleRequest, not engine.Handle: under Yaegi a method of an
	// interpreted type is called through reflect.
	if err := core.HandleRequest(engine, w, r); err != nil {
		abortIfCut(w, err)
	}
}

// servedMetrics answers r when it asks for the metrics path.
func servedMetrics(h *Hedge, w http.ResponseWriter, r *http.Request) bool {
	if r.URL.Path != h.metricsPath {
		return false
	}
	serveMetrics(sharedMetrics, w, r)
	return true
}

// firstEngine builds the engine on the first request; nil: it could not,
// and the client has its answer.
func firstEngine(h *Hedge, w http.ResponseWriter) *core.Hedger {
	built, err := h.engine()
	if err != nil {
		http.Error(w, "llmhedge: "+err.Error(), http.StatusInternalServerError)
		return nil
	}
	return built
}

// passedToNext hands a request the engine would not hedge to the router's
// service, and reports whether it did.
func passedToNext(h *Hedge, engine *core.Hedger, w http.ResponseWriter, r *http.Request) bool {
	if !engine.ForNext(r) {
		return false
	}
	// The opt-out header is the plugin's own and is never forwarded, not
	// even to the router's service.
	r.Header.Del(core.HeaderHedge)
	h.next.ServeHTTP(w, r)
	return true
}

// abortIfCut ends the response abruptly when the winner failed after its
// answer started.
func abortIfCut(w http.ResponseWriter, err error) {
	if errors.Is(err, core.ErrStreamAborted) {
		abortResponse(w)
	}
}

// engine returns the hedger, building it on first use with the shared
// transport and the route's shared state.
func (h *Hedge) engine() (*core.Hedger, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hedger != nil {
		return h.hedger, nil
	}
	reg := shared
	engine, entry, err := reg.hedger(h)
	if err != nil {
		return nil, err
	}
	h.reg = reg
	h.entry = entry
	h.hedger = engine
	return engine, nil
}
