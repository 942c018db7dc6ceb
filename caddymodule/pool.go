package caddymodule

import (
	"net/http"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmhedge/llmhedge/core"
)

// shared holds what must survive a config reload: each route's core.State
// (TTFT estimators, hedge budget, cool-downs and breakers, the idempotency
// store) and the upstream transports with their keep-alive pools. Caddy
// provisions the new config before it cleans up the old one, so a value in
// use by both is never destroyed in between: the reload keeps the learned
// delay, the spent budget and the warm connections.
var shared = caddy.NewUsagePool()

// pooledState is a core.State in the usage pool.
type pooledState struct{ state *core.State }

// Destruct implements caddy.Destructor. The state holds no goroutines or
// connections; dropping the reference is enough.
func (*pooledState) Destruct() error { return nil }

// pooledTransport is an upstream transport in the usage pool.
type pooledTransport struct{ transport *http.Transport }

// Destruct closes the idle connections when the last config using the
// transport is unloaded. Requests still streaming keep their connections
// until they end.
func (p *pooledTransport) Destruct() error {
	p.transport.CloseIdleConnections()
	return nil
}

// acquireState returns the pooled state for cfg, creating it on first use.
// Its key, core.StateKey, is the route's name and what the state depends
// on, so a reload that changes the upstreams, windows or budgets starts
// afresh. config.TransportKey keys never equal a core.StateKey.
// The caller must release key with shared.Delete.
func acquireState(cfg config.Config) (key string, st *core.State, err error) {
	key = core.StateKey(cfg)
	v, _, err := shared.LoadOrNew(key, func() (caddy.Destructor, error) {
		return &pooledState{state: core.NewState(cfg, nil)}, nil
	})
	if err != nil {
		return "", nil, err
	}
	return key, v.(*pooledState).state, nil
}

// acquireTransport returns the pooled transport for t, creating it on first
// use; transports with the same settings and CA file contents are shared.
// The caller must release key with shared.Delete.
func acquireTransport(t config.TransportConfig, caPEM []byte) (key string, tr *http.Transport, err error) {
	key = config.TransportKey(t, caPEM)
	v, _, err := shared.LoadOrNew(key, func() (caddy.Destructor, error) {
		tr, err := core.NewTransport(t, caPEM)
		if err != nil {
			return nil, err
		}
		return &pooledTransport{transport: tr}, nil
	})
	if err != nil {
		return "", nil, err
	}
	return key, v.(*pooledTransport).transport, nil
}
