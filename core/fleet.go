package core

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/fleetstore"
	"github.com/llmhedge/llmhedge/core/redact"
)

// A Fleet is one replica's connection to the shared Redis of a fleet of
// gateways: the protocol of fleetflight.go runs through it. Its
// fleetstore.Conn guards the connection with a breaker: while it is down,
// fleet operations fail at once and requests use this replica's own
// state. Routes that use the same Redis
// share one Fleet. It is safe for concurrent use.
type Fleet struct {
	cfg     config.FleetConfig
	name    string // host:port/db, for metrics and logs
	clock   Clock
	metrics MetricSink
	log     func(fields []LogField)
	// replica names this process in lease holders (random per Fleet).
	replica string
	// holders counts the flights this replica led, for unique holder ids.
	holders int64
	// followers counts this replica's requests following another's flight.
	followers int64
	// kind is the proxy, for the heartbeat (FleetOptions.Kind).
	kind string
	// sync is the sync loop's state (fleetsync.go).
	sync *fleetSync
	// policy is what the fleet read of Redis' maxmemory-policy
	// (fleetpolicy.go).
	policy *fleetPolicy

	// conn is the client behind the fleet's breaker (fleetstore.Conn).
	conn *fleetstore.Conn
}

// FleetOptions are what an adapter supplies to a Fleet besides its client.
type FleetOptions struct {
	// Clock drives the breaker's retry interval and the lease renewals.
	// Default SystemClock. Lease expiry itself is Redis' (PX), never a
	// clock shared between hosts.
	Clock Clock
	// Metrics receives the fleet's samples (MetricFleetUp,
	// MetricFleetErrors, MetricFleetDuration). Optional.
	Metrics MetricSink
	// Log receives one line's fields each time the fleet goes down or comes
	// back up (fleet, state, and on down the redacted error), and the
	// spend cap's line. Optional.
	Log func(fields []LogField)
	// Kind names the proxy in the replica's heartbeat: "caddy", "traefik"
	// or "envoy".
	Kind string
}

// NewFleet returns a Fleet over client for cfg (defaults applied). It does
// not touch Redis: the first keyed request does. It starts up.
func NewFleet(client fleetstore.RedisClient, cfg config.FleetConfig, opts FleetOptions) *Fleet {
	cfg = cfg.WithDefaults()
	if opts.Clock == nil {
		var c Clock = SystemClock{}
		opts.Clock = c
	}
	name := ""
	if a, err := config.ParseRedisURL(cfg.URL, ""); err == nil {
		name = a.Name()
	}
	var id [6]byte
	rand.Read(id[:])
	f := &Fleet{cfg: cfg, name: name, clock: opts.Clock, metrics: opts.Metrics,
		log: opts.Log, replica: hex.EncodeToString(id[:]), kind: opts.Kind, sync: newFleetSync(),
		policy: &fleetPolicy{due: true}}
	clock := opts.Clock
	f.conn = fleetstore.NewConn(client, fleetstore.ConnOptions{Timeout: time.Duration(cfg.Timeout),
		RetryInterval: time.Duration(cfg.RetryInterval), Now: clock.Now,
		Observe:      func(op string, seconds float64, failed bool) { fleetObserve(f, op, seconds, failed) },
		StateChanged: func(up bool, err error) { fleetStateChanged(f, up, err) }})
	if f.metrics != nil {
		f.metrics.Record(MetricFleetUp, []string{name}, 1)
	}
	return f
}

// Up reports whether the fleet is in use (the breaker is closed).
func (f *Fleet) Up() bool { return fleetstore.Up(f.conn) }

// Name is the Redis server as metrics and logs name it (host:port/db).
func (f *Fleet) Name() string { return f.name }

// Config returns the fleet's configuration, defaults applied.
func (f *Fleet) Config() config.FleetConfig { return f.cfg }

// fleetObserve records an operation's latency, and its error when it
// failed.
func fleetObserve(f *Fleet, op string, seconds float64, failed bool) {
	if f.metrics == nil {
		return
	}
	f.metrics.Record(MetricFleetDuration, []string{f.name, op}, seconds)
	if failed {
		f.metrics.Record(MetricFleetErrors, []string{f.name, op}, 1)
	}
}

// fleetStateChanged records and logs a change of the fleet's state.
func fleetStateChanged(f *Fleet, up bool, err error) {
	v := 0.0
	state := "down"
	if up {
		v = 1
		state = "up"
	}
	if f.metrics != nil {
		f.metrics.Record(MetricFleetUp, []string{f.name}, v)
	}
	if up {
		fleetPolicyDue(f) // the Redis back may be another one
	}
	if f.log == nil {
		return
	}
	fields := []LogField{stringField("fleet", f.name), stringField("state", state)}
	if err != nil {
		// Client errors name the address at most; redact.URLsIn removes a
		// URL's userinfo should one quote it.
		fields = append(fields, stringField("error", redact.URLsIn(err.Error())))
	}
	f.log(fields)
}

// fleetNewHolder returns a holder id unique to this flight.
func fleetNewHolder(f *Fleet) string {
	n := atomic.AddInt64(&f.holders, 1)
	return f.replica + "." + strconv.FormatInt(n, 36)
}
