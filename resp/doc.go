// Package resp is a Redis client written with the standard library only,
// for hosts that interpret Go: the Traefik plugin, which Yaegi v0.16.1 runs
// and which cannot use go-redis or rueidis (they import unsafe). It
// implements fleetstore.RedisClient, the command interface of the fleet protocol,
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
//     and a wait past it returns an error wrapping fleetstore.ErrRedisBusy); a
//     dial is not cut short by its caller's deadline: it goes on within
//     DialTimeout and its connection goes to the pool, while the caller
//     gets fleetstore.ErrRedisBusy (the last dial's failure, when it failed), so
//     a replica too busy to connect within one operation's time still
//     connects, and is not taken for Redis away; a
//     connection that saw a network error, a protocol error, a timeout or a
//     cancellation is closed, never reused; an idle connection the server
//     closes is noticed at once (a goroutine waits in a Read on each idle
//     connection) and dropped, and so is one unused for IdleTimeout.
//   - Timeouts from the context's deadline (and DialTimeout, ReadTimeout,
//     WriteTimeout when they are earlier); a cancelled context interrupts
//     the connection's I/O through context.AfterFunc. A reply whose read
//     deadline passed gets one more look, 10ms long: a replica too busy to
//     run before its deadline (a follower storm, a throttled CPU) still
//     reads what Redis answered in time, so a claim's answer counts and
//     the fleet's breaker is not opened by the replica's own delay.
//   - Pipeline writes every command in one write and then reads every
//     reply.
//   - Blocking commands (XREAD BLOCK, BLPOP, ...) run on connections of
//     their own pool (at most MaxBlocking, default 256, each of which may
//     stay idle until IdleTimeout, so a follower's next read does not
//     redial), so long waits
//     never starve ordinary commands, and a full blocking pool delays only
//     the readers that wait for it. An XREAD BLOCK whose BLOCK time would
//     outlast its context's deadline (less 200ms for Redis' timeout tick)
//     blocks only for what is left, so it ends with Redis' nil reply, not
//     a deadline error; after a wait for a connection with no time left,
//     it is not sent and returns an error wrapping fleetstore.ErrRedisBusy.
//   - Redis Cluster, with redis+cluster://[user:password@]host:port,...
//     (rediss+cluster:// for TLS; database 0 only). See below.
//
// # Redis Cluster
//
// A cluster client keeps a map from the 16384 hash slots to their masters,
// read with CLUSTER SLOTS (Redis 3+, where CLUSTER SHARDS needs 7.0) from
// any node it knows, and a node per master, each with its own two pools
// (MaxOpen, MaxBlocking and MaxIdle are per node). A command goes to the
// master of its first key's slot: CRC16 (XMODEM) of the key, or of its
// hash tag, the text between the first "{" and the next "}" when that is
// not empty, modulo 16384. EVAL and EVALSHA route by their first key
// (none: any node), XREAD by its first stream; commands without keys
// (PING, INFO, SCRIPT, CLUSTER ...) go to the node that last served the
// map. Redirections:
//
//   - MOVED: the slot is recorded at its new master, the command is sent
//     there, and the whole map is read again in the background.
//   - ASK (a slot being migrated): the command is sent once to the target,
//     after ASKING on the same connection; the map is not changed.
//   - A master that cannot be dialed (killed, its replica not yet
//     promoted): nothing was sent, so the map is read again (one read at a
//     time, waited for within the caller's deadline) and the command goes
//     to the slot's new master if there is one, else its dial error is
//     returned. A failure after the command was written is returned as is
//     (it may have run) and the map is read again in the background.
//
// At most 5 redirections are followed per call. A pipeline runs on one
// node, so its commands with keys must all be on one slot (give the keys
// one hash tag): otherwise the call fails before sending anything, with an
// error wrapping ErrCrossSlot. Inside a pipeline, commands redirected by
// ASK are sent again (after ASKING) and their replies put back in order.
// Stats counts the MOVED and ASK followed and the maps read. Over TLS each
// node's certificate is checked against the host the cluster names it by
// (an IP address unless cluster-announce-hostname and
// cluster-preferred-endpoint-type say otherwise), or against
// TLSConfig.ServerName when that is set.
//
// A redis:// (or rediss://) URL that names a cluster node is refused: the
// first connection asks INFO cluster, and cluster_enabled:1 (or a MOVED or
// ASK reply later) makes every command fail with an error that says to use
// redis+cluster://. A redis+cluster:// URL that names a server without
// cluster support is refused likewise once CLUSTER SLOTS has said so.
//
// Errors never contain the password: they name the operation and the
// server address only, and Redis' own error replies (WRONGPASS, NOAUTH)
// never echo it.
//
// The code follows the Yaegi subset of CONTRIBUTING.md ("Contributor
// notes: code that Yaegi runs"): no select, one assignment target per
// statement, no back pointers between structs.
package resp
