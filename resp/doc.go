// Package resp is a Redis client written with the standard library only,
// for hosts that interpret Go: the Traefik plugin, which Yaegi v0.16.1 runs
// and which cannot use go-redis or rueidis (they import unsafe). It
// implements core.RedisClient, the command interface of the fleet protocol,
// for Redis 6.2+ and Valkey.
//
// It speaks RESP2, the protocol every Redis and Valkey version accepts
// (RESP3 servers too, unless the client sends HELLO 3; this one never
// does). Its reader also understands the RESP3 reply types, so a proxy that
// answers in RESP3 is read correctly.
//
// What it does:
//
//   - URLs redis://[user:password@]host:port/db and rediss:// (TLS); the
//     password may come from an environment variable instead of the URL.
//   - AUTH (user and password, or password only) and SELECT on every new
//     connection, in one round trip.
//   - A bounded pool: connections are reused (at most MaxIdle kept idle, at
//     most MaxOpen open, callers beyond that wait until their deadline,
//     and a wait past it returns an error wrapping core.ErrRedisBusy); a
//     connection that saw a network error, a protocol error, a timeout or a
//     cancellation is closed, never reused; an idle connection the server
//     closes is noticed at once (a goroutine waits in a Read on each idle
//     connection) and dropped, and so is one unused for IdleTimeout.
//   - Timeouts from the context's deadline (and DialTimeout, ReadTimeout,
//     WriteTimeout when they are earlier); a cancelled context interrupts
//     the connection's I/O through context.AfterFunc.
//   - Pipeline writes every command in one write and then reads every
//     reply.
//   - Blocking commands (XREAD BLOCK, BLPOP, ...) run on connections of
//     their own pool (at most MaxBlocking, default 256), so long waits
//     never starve ordinary commands, and a full blocking pool delays only
//     the readers that wait for it.
//
// Errors never contain the password: they name the operation and the
// server address only, and Redis' own error replies (WRONGPASS, NOAUTH)
// never echo it.
//
// The code follows the Yaegi subset of the project README ("Contributor
// notes: code that Yaegi runs"): no select, one assignment target per
// statement, no back pointers between structs.
package resp
