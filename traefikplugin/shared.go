package traefikplugin

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/llmhedge/llmhedge/core"
)

// Traefik calls New for every router that uses the middleware and again on
// every configuration reload, and never tells a plugin that an old handler
// is gone. So nothing long-lived belongs to a handler: the upstream
// transport (its connection pool) and each route's learning (TTFT
// estimators, budgets, breakers, idempotency table) live here, are created
// on the first request that needs them, and are shared by every handler of
// the same route and shape. Nothing here starts a goroutine or a timer.

// maxSharedStates bounds the registry of route states. Each configuration
// change that alters a route's shape adds an entry; the oldest is forgotten
// first (handlers that still hold it keep working with it).
const maxSharedStates = 256

// registry holds what outlives a handler.
type registry struct {
	mu        sync.Mutex
	transport *http.Transport
	states    map[string]*core.State
	order     []string // keys of states, oldest first
}

var shared = &registry{}

// roundTripper returns the plugin's own transport, created on first use.
// Hedged attempts never go through Traefik's `next` handler, which must not
// be called concurrently for one request.
func (g *registry) roundTripper() http.RoundTripper {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.transport == nil {
		dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
		g.transport = &http.Transport{
			Proxy: http.ProxyFromEnvironment,
			// A closure, not the method value dialer.DialContext: Yaegi
			// v0.16.1 types a compiled method value as a method expression.
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return dialer.DialContext(ctx, network, addr)
			},
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          1024,
			MaxIdleConnsPerHost:   256, // LLM traffic is many long streams to few hosts
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
	}
	return g.transport
}

// state returns the shared state for route and cfg, creating it on first
// use. Handlers of the same route whose configurations have the same shape
// (see core.StateKey) share it, so a reload keeps the learned delay and
// does not refill the budget.
func (g *registry) state(route string, cfg core.Config) *core.State {
	key := route + "\x00" + core.StateKey(cfg)
	g.mu.Lock()
	defer g.mu.Unlock()
	if st, ok := g.states[key]; ok {
		return st
	}
	if g.states == nil {
		g.states = make(map[string]*core.State)
	}
	if len(g.order) >= maxSharedStates {
		delete(g.states, g.order[0])
		g.order = g.order[1:]
	}
	st := core.NewState(cfg, nil)
	g.states[key] = st
	g.order = append(g.order, key)
	return st
}

// size reports how many route states are held (for tests).
func (g *registry) size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.states)
}
