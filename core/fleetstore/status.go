package fleetstore

import "time"

// A replica writes its heartbeat every HeartbeatInterval with a TTL
// of HeartbeatTTL: a replica that stops is gone from status within it
// (one that closes removes its heartbeat at once). Every 2 s, not every
// second: the heartbeat is half of what the fleet costs Redis when no
// request is keyed, and nothing needs it sooner (the switch and health go
// with the sync; the live count only sizes the concurrent-hedge shares).
const (
	HeartbeatInterval time.Duration = 2 * time.Second
	HeartbeatTTL      time.Duration = 3 * HeartbeatInterval
)

// ReplicaStatus is one replica's heartbeat: what llmhedge-ctl status lists.
type ReplicaStatus struct {
	// ID names the replica in the fleet (random per process and fleet).
	ID string `json:"id"`
	// Kind is the proxy: "caddy", "traefik" or "envoy".
	Kind string `json:"kind"`
	// Host and PID locate the process.
	Host string `json:"host,omitempty"`
	PID  int    `json:"pid,omitempty"`
	// Started is when the replica joined the fleet (RFC 3339).
	Started string `json:"started,omitempty"`
	// Routes are the routes this replica serves.
	Routes []ReplicaRoute `json:"routes"`
}

// ReplicaRoute is one route as a replica sees it.
type ReplicaRoute struct {
	Name string `json:"name"`
	// Requests and Hedges this replica counted since it started.
	Requests int64 `json:"requests"`
	Hedges   int64 `json:"hedges"`
	// HedgeRate is hedges per request over the last minute on this replica.
	HedgeRate float64 `json:"hedge_rate"`
	// BudgetTokens is what this replica may spend on hedges now (its
	// leased share of the fleet bucket, or its local bucket).
	BudgetTokens float64 `json:"budget_tokens"`
	// Cooled and Open name the upstreams in a 429/503 cool-down and with an
	// open breaker, as this replica sees them (its own and the fleet's).
	Cooled []string `json:"cooled,omitempty"`
	Open   []string `json:"open,omitempty"`
	// Switch is the switch in force on this replica for the route (String form).
	Switch string `json:"switch"`
	// SpendTokens and SpendUSD are the fleet's estimated extra prompt tokens
	// in the current spend window as this replica last read them; SpendUSD
	// is 0 without a configured price.
	SpendTokens int64   `json:"spend_tokens"`
	SpendUSD    float64 `json:"spend_usd,omitempty"`
	// SpendCapped: the route's spend cap is reached; no hedge starts until
	// the window ends.
	SpendCapped bool `json:"spend_capped,omitempty"`
}
