package envoyfilter

import (
	"context"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/internal/zapfields"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/fleetredis"
)

// serverFleet is one Redis client and the core.Fleet on it, shared by the
// routes with the same fleet settings and kept across reloads (its
// connections and its breaker's state with it).
type serverFleet struct {
	client *fleetredis.Client
	fleet  *core.Fleet
}

// close stops the fleet's sync loop and closes its client.
func (f *serverFleet) close() {
	f.fleet.Close()
	_ = f.client.Close()
}

// fleetKey identifies a fleet's settings (defaults applied). It holds the
// URL, maybe with a password: it is never logged.
func fleetKey(cfg config.FleetConfig) string { return cfg.Key() }

// fleetPicker hands out the fleets of one configuration being built:
// those of the running configuration where the settings are unchanged,
// new ones otherwise. Call with reloadMu held.
type fleetPicker struct {
	s    *Server
	used map[string]*serverFleet
	made []*serverFleet
}

func (p *fleetPicker) fleet(cfg config.FleetConfig) (*core.Fleet, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	key := fleetKey(cfg)
	if f, ok := p.used[key]; ok {
		return f.fleet, nil
	}
	f, ok := p.s.fleets[key]
	if !ok {
		client, err := fleetredis.New(cfg)
		if err != nil {
			return nil, err
		}
		// A URL whose kind does not fit the server (redis:// at a Redis
		// Cluster node, redis+cluster:// at a plain server) fails the
		// start; a Redis that does not answer within a second does not.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = client.Check(ctx)
		cancel()
		if err != nil {
			_ = client.Close()
			return nil, err
		}
		log := p.s.log.Named("fleet")
		f = &serverFleet{client: client, fleet: core.NewFleet(client, cfg, core.FleetOptions{
			Clock: p.s.clock, Metrics: p.s.metrics.Set, Kind: "envoy", Log: func(fields []core.LogField) { zapfields.LogFleetState(log, fields) }})}
		p.made = append(p.made, f)
	}
	p.used[key] = f
	return f.fleet, nil
}

// commit makes the picked fleets the server's and closes the clients of
// the fleets no route uses any more.
func (p *fleetPicker) commit() {
	for key, f := range p.s.fleets {
		if _, ok := p.used[key]; !ok {
			f.close()
		}
	}
	p.s.fleets = p.used
}

// abort closes the clients made for a configuration that failed to build.
func (p *fleetPicker) abort() {
	for _, f := range p.made {
		f.close()
	}
}

// closeFleets closes every fleet client (at shutdown).
func (s *Server) closeFleets() {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	for _, f := range s.fleets {
		f.close()
	}
	s.fleets = nil
}
