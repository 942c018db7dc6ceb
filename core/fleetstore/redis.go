// Package fleetstore is the fleet's Redis side: the client interface and
// its values, the key layout, the Lua scripts and the wire formats that
// replicas of different versions and llmhedge-ctl share. It imports nothing
// of the engine.
package fleetstore

import (
	"context"
	"errors"
)

// RedisKind tells which RESP type a RedisValue holds. Explicit values: see
// eventKind in race.go for why typed iota constants are avoided.
type RedisKind int

const (
	// RedisNil is a null bulk string or null array (a missing key, a
	// timed-out XREAD BLOCK).
	RedisNil RedisKind = 0
	// RedisString is a simple or bulk string; Str holds its bytes.
	RedisString RedisKind = 1
	// RedisInt is an integer reply; Int holds it.
	RedisInt RedisKind = 2
	// RedisArray is an array reply; Array holds its elements.
	RedisArray RedisKind = 3
)

// RedisValue is one reply from Redis (or Valkey). Error replies are not
// values: RedisClient returns them as errors whose text starts with the
// server's error code ("NOSCRIPT No matching script...").
type RedisValue struct {
	Kind  RedisKind
	Str   string
	Int   int64
	Array []RedisValue
}

// RedisClient is the whole of what the fleet protocol needs from a Redis
// client: send one command, or several in one round trip. Arguments are
// binary-safe (a Go string may hold any bytes). Both methods must be safe for
// concurrent use and must return by ctx's deadline.
//
// The Caddy module and the Envoy server adapt a compiled Redis client to it;
// the Traefik plugin, which Yaegi interprets, uses the standard-library client
// in package resp.
type RedisClient interface {
	// Do sends one command and returns its reply. A Redis error reply is
	// returned as a non-nil error; so is a network failure or a timeout.
	// A blocking read (XREAD ... BLOCK) may hold its connection for its
	// block time: clients keep such reads on connections of their own, so
	// that followers never starve the claims and renewals. A command that
	// found no connection free by ctx's deadline returns ErrRedisBusy.
	Do(ctx context.Context, args ...string) (RedisValue, error)
	// Pipeline sends cmds in one round trip and returns one reply per
	// command, in order. The call fails as a whole (error non-nil) when any
	// command's reply is an error or the connection fails, so callers
	// pipeline only commands whose failures they treat alike.
	Pipeline(ctx context.Context, cmds [][]string) ([]RedisValue, error)
}

// ErrRedisBusy is what a RedisClient returns (wrapped or not) when its
// command never reached Redis because the client had no connection free
// within the deadline: the replica is busy, Redis is not failing, so it
// neither takes the fleet down nor counts as a fleet operation error.
var ErrRedisBusy = errors.New("llmhedge: no Redis connection free")
