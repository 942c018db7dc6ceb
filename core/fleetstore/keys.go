package fleetstore

import "strings"

// fleetTag is the hash tag of the fleet-wide keys.
const fleetTag string = "{fleet}"

// SwitchKey is the Redis key of route's fleet-wide switch (a string in
// EncodeSwitch's form); route SwitchAllRoutes is the switch of every route.
func SwitchKey(prefix, route string) string { return prefix + "{r:" + route + "}:switch" }

// SwitchRoute is the route of a switch key (SwitchKey's
// inverse); ok is false for another key.
func SwitchRoute(prefix, key string) (route string, ok bool) {
	head := prefix + "{r:"
	const tail = "}:switch"
	if len(key) < len(head)+len(tail) || !strings.HasPrefix(key, head) || !strings.HasSuffix(key, tail) {
		return "", false
	}
	return key[len(head) : len(key)-len(tail)], true
}

// ReplicaKey is the Redis key of a replica's heartbeat (a string in
// ReplicaStatus's JSON form, PX HeartbeatTTL).
func ReplicaKey(prefix, replica string) string { return prefix + fleetTag + ":replica:" + replica }

// ReplicaPattern matches every heartbeat key of the fleet (for SCAN;
// prefix with its glob characters escaped). On a Redis Cluster they are on
// one slot: one master holds them all.
func ReplicaPattern(prefix string) string { return prefix + fleetTag + ":replica:*" }

// SwitchPattern matches every switch key of the fleet (for SCAN, on
// every master of a Redis Cluster: each route's switch is on its slot).
func SwitchPattern(prefix string) string { return prefix + "{r:*}:switch" }

// The keys of one identity share the hash tag {<identity>} so that a Redis
// Cluster keeps them on one slot:
//
//	<prefix>{<id>}:lease       the leader's claim: "<holder> <fingerprint>", PX lease
//	<prefix>{<id>}:done        the stored complete answer, PX ttl
//	<prefix>{<id>}:s:<holder>  the stream of one generation (one leader)
//	<prefix>{<id>}:readers     hash: holder -> followers reading its stream, PX stream linger
//
// A stream per generation means a follower can only ever read one
// generation's bytes: a new leader after a takeover or a cut writes a
// stream of its own. Every entry carries its sequence number (field n,
// from 1, the head first), so a follower sees any gap.
//
// Fencing: every write of a leader (head, data, end, done) is a script
// that first checks the lease still holds this leader's value; a leader
// that lost it (paused past its lease, Redis lost its data) writes nothing
// more, and no append re-creates a stream that vanished.
type Keys struct {
	tag     string
	Lease   string
	Done    string
	Readers string // followers per generation
}

func NewKeys(prefix, identity string) Keys {
	id := identity
	if len(id) > 32 {
		id = id[:32] // 128 bits of the SHA-256: plenty, and shorter keys
	}
	tag := prefix + "{" + id + "}"
	return Keys{tag: tag, Lease: tag + ":lease", Done: tag + ":done", Readers: tag + ":readers"}
}

// Stream is the key of holder's generation stream.
func (k Keys) Stream(holder string) string { return k.tag + ":s:" + holder }

// The keys of routes. A route's keys
// share the hash tag {r:<route>} (RouteTag), so that each script's
// keys are on one slot of a Redis Cluster while routes spread over its
// masters; the fleet-wide keys (the live set, the heartbeats) share the
// tag {fleet}.
func RouteTag(prefix, route string) string  { return prefix + "{r:" + route + "}" }
func BudgetKey(prefix, route string) string { return RouteTag(prefix, route) + ":budget" }
func HealthKey(prefix, route string) string { return RouteTag(prefix, route) + ":health" }
func HealthMarkKey(prefix, route string) string {
	return RouteTag(prefix, route) + ":healthmark"
}

// SpendBase and TenantBase are what syncScript names the spend
// and tenant keys from: <base>:<hour> and <base>:<minute>:<tenant hash>,
// the hour and the minute Redis'.
func SpendBase(prefix, route string) string  { return RouteTag(prefix, route) + ":spend" }
func TenantBase(prefix, route string) string { return RouteTag(prefix, route) + ":tenant" }
func LiveKey(prefix string) string           { return prefix + fleetTag + ":live" }

// HealthMarkOf is the health mark key of the health key healthKey.
func HealthMarkOf(healthKey string) string {
	return strings.TrimSuffix(healthKey, ":health") + ":healthmark"
}

// StoreKeys are the keys of storeBudgetScript for a route and a
// caller: the route's hash tag, so that one script reaches them on a Redis
// Cluster.
func StoreKeys(prefix, route, caller string) []string {
	tag := prefix + "{store:" + route + "}"
	return []string{tag + ":set", tag + ":bytes", tag + ":set:" + caller, tag + ":bytes:" + caller}
}
