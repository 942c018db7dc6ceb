package traefikplugin

import (
	"io"
	"strconv"
	"sync"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/resp"
)

// Fleet mode shares keyed requests with the other replicas through Redis.
// The Redis client is package resp's (go-redis cannot run under Yaegi).
//
// Like the route states of shared.go, the fleet outlives handlers: Traefik
// calls New per router and on every reload and never closes a handler, so
// one resp.Client per Redis URL (and password variable) and one core.Fleet
// per fleet configuration are kept for the process, made on the first
// keyed request that needs them and shared by every router and every
// reload that names them. New only checks the configuration. A client
// nobody uses any more holds no connection: resp closes idle connections
// after resp.DefaultIdleTimeout, and its idle watchers end with them.

// fleetRegistry holds the process's fleets.
type fleetRegistry struct {
	mu      sync.Mutex
	clients map[string]*resp.Client // by clientKey
	fleets  map[string]*core.Fleet  // by fleetKey
}

var fleets = newFleetRegistry()

func newFleetRegistry() *fleetRegistry {
	return &fleetRegistry{clients: make(map[string]*resp.Client), fleets: make(map[string]*core.Fleet)}
}

// clientKey identifies a Redis connection: the URL (password included: it
// stays in memory, never in a log), the password variable and the bound of
// the blocking reads' pool (max_followers).
func clientKey(cfg config.FleetConfig) string {
	return cfg.URL + "\x00" + cfg.PasswordEnv + "\x00" + strconv.Itoa(cfg.WithDefaults().MaxFollowers)
}

// fleetKey identifies a fleet: its connection and the protocol's settings.
func fleetKey(cfg config.FleetConfig) string { return cfg.Key() }

// checkFleet reports what would keep the fleet's client from being made
// (an unset password variable), for New. It creates nothing that lasts.
func checkFleet(cfg config.FleetConfig) error {
	if !cfg.Enabled() {
		return nil
	}
	_, err := resp.New(fleetClientOptions(cfg))
	return err
}

// fleetClientOptions are the Redis client's options: the URL, the password
// variable, and as many connections for blocking reads as the fleet lets
// requests follow at once (max_followers).
func fleetClientOptions(cfg config.FleetConfig) resp.Options {
	return resp.Options{URL: cfg.URL, PasswordEnv: cfg.PasswordEnv, MaxBlocking: cfg.WithDefaults().MaxFollowers}
}

// fleetFor returns the fleet of cfg (defaults applied), making it and its
// client on first use. Fleet state changes are logged to logOut (nil: not
// logged) of the handler that made it, and counted in sharedMetrics.
func fleetFor(g *fleetRegistry, cfg config.FleetConfig, logOut io.Writer) (*core.Fleet, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	key := fleetKey(cfg)
	if f, ok := g.fleets[key]; ok {
		return f, nil
	}
	ck := clientKey(cfg)
	client, ok := g.clients[ck]
	if !ok {
		made, err := resp.New(fleetClientOptions(cfg))
		if err != nil {
			return nil, err
		}
		client = made
		g.clients[ck] = client
	}
	opts := core.FleetOptions{
		// Set explicitly, as for core.New (see registry.hedger).
		Clock:   core.SystemClock{},
		Metrics: sharedMetrics,
		Kind:    "traefik",
	}
	if logOut != nil {
		logger := &fleetLogger{out: logOut}
		opts.Log = logger.log
	}
	f := core.NewFleet(client, cfg, opts)
	g.fleets[key] = f
	return f, nil
}

// fleetLogger writes one JSON line per change of the fleet's state.
type fleetLogger struct {
	out io.Writer
}

// A line with a "msg" field is one of the engine's own (core's
// Options.Log, e.g. the spend cap reached).
func (l *fleetLogger) log(fields []core.LogField) {
	msg := "llmhedge fleet down: requests use this replica's own state"
	for i := range fields {
		if fields[i].Key == "state" && fields[i].Str == "up" {
			msg = "llmhedge fleet up: joins and replays are shared again"
		}
	}
	for i := range fields {
		if fields[i].Key == "msg" {
			msg = fields[i].Str
			fields = append(append([]core.LogField{}, fields[:i]...), fields[i+1:]...)
			break
		}
	}
	b := make([]byte, 0, 256)
	b = append(b, `{"msg":`...)
	b = appendJSONString(b, msg)
	b = appendLogFields(b, fields)
	b = append(b, '}', '\n')
	l.out.Write(b)
}
