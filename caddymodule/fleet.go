package caddymodule

import (
	"context"
	"reflect"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/internal/zapfields"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/fleetredis"
)

// pooledFleet is one Redis client and the core.Fleet on it, shared by every
// route (and every loaded config) with the same fleet settings, so that a
// reload keeps the connections and the breaker's state.
type pooledFleet struct {
	client *fleetredis.Client
	fleet  *core.Fleet
}

// Destruct stops the fleet's sync loop and closes the client when the
// last config using it is unloaded.
func (p *pooledFleet) Destruct() error {
	p.fleet.Close()
	return p.client.Close()
}

// checkFleet refuses, at Provision, a URL whose kind does not fit the
// server (redis:// at a Redis Cluster node, redis+cluster:// at a plain
// server). A Redis that does not answer within a second is no refusal.
func checkFleet(client *fleetredis.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return client.Check(ctx)
}

// fleetKey keys a fleet in the usage pool: its settings, defaults applied.
// It holds the URL (maybe with a password) but is never logged.
func fleetKey(cfg config.FleetConfig) string { return "fleet\x00" + cfg.Key() }

// acquireFleet returns the pooled fleet for cfg, creating it on first use.
// The caller must release key with shared.Delete.
func acquireFleet(cfg config.FleetConfig, metrics core.MetricSink) (key string, f *core.Fleet, err error) {
	key = fleetKey(cfg)
	v, _, err := shared.LoadOrNew(key, func() (caddy.Destructor, error) {
		client, err := fleetredis.New(cfg)
		if err != nil {
			return nil, err
		}
		if err := checkFleet(client); err != nil {
			_ = client.Close()
			return nil, err
		}
		logger := caddy.Log().Named("http.handlers.llm_hedge.fleet")
		fl := core.NewFleet(client, cfg, core.FleetOptions{Metrics: metrics, Kind: "caddy", Log: func(fields []core.LogField) {
			zapfields.LogFleetState(logger, fields)
		}})
		return &pooledFleet{client: client, fleet: fl}, nil
	})
	if err != nil {
		return "", nil, err
	}
	return key, v.(*pooledFleet).fleet, nil
}

// parseFleet reads `fleet <url> [{ ... }]` or `fleet { url <url> ... }`:
// the block's options are config.FleetConfig's JSON names.
func (h *Handler) parseFleet(p args) error {
	d := p.d
	values := d.RemainingArgs()
	switch len(values) {
	case 0:
	case 1:
		h.Fleet.URL = values[0]
	default:
		return d.Errf("fleet takes one URL (redis://host:port/db), got %d arguments", len(values))
	}
	v := reflect.ValueOf(&h.Fleet).Elem()
	return p.each(func(string) error { return p.jsonOption(v, "fleet") })
}
