package core

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/fleetstore"
	"github.com/llmhedge/llmhedge/core/redact"
)

// A Fleet is one replica's connection to the shared Redis of a fleet of
// gateways: the protocol of fleetflight.go runs through it. It guards the
// connection with a breaker: after fleetFailuresToOpen failures in a row
// it is down, fleet operations fail at once and requests use this
// replica's own state; one operation per RetryInterval probes Redis and the
// first success brings the fleet up again. Routes that use the same Redis
// share one Fleet. It is safe for concurrent use.
type Fleet struct {
	client  fleetstore.RedisClient
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

	mu        sync.Mutex
	up        bool
	failures  int
	nextProbe time.Time
	probing   bool
	// replies counts the operations Redis answered: a failed operation
	// during whose life Redis answered another one is not Redis away (a
	// replica too busy to read its reply in time, one master of a Cluster
	// failing over) and does not count towards taking the fleet down.
	replies uint64
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

// fleetFailuresToOpen failed operations in a row, with no reply from
// Redis to any operation meanwhile, take the fleet down.
const fleetFailuresToOpen int = 3

// Fleet operation names: the op label of the fleet metrics.
const (
	fleetOpClaim  = "claim"
	fleetOpAppend = "append"
	fleetOpFinish = "finish"
	fleetOpRenew  = "renew"
	fleetOpRead   = "read"
	fleetOpLease  = "lease"
)

// errFleetDown is the error of an operation the breaker did not let through.
var errFleetDown = errors.New("llmhedge: fleet down")

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
	f := &Fleet{client: client, cfg: cfg, name: name, clock: opts.Clock, metrics: opts.Metrics,
		log: opts.Log, replica: hex.EncodeToString(id[:]), up: true, kind: opts.Kind, sync: newFleetSync(),
		policy: &fleetPolicy{due: true}}
	if f.metrics != nil {
		f.metrics.Record(MetricFleetUp, []string{name}, 1)
	}
	return f
}

// Up reports whether the fleet is in use (the breaker is closed).
func (f *Fleet) Up() bool {
	f.mu.Lock()
	up := f.up
	f.mu.Unlock()
	return up
}

// Name is the Redis server as metrics and logs name it (host:port/db).
func (f *Fleet) Name() string { return f.name }

// Config returns the fleet's configuration, defaults applied.
func (f *Fleet) Config() config.FleetConfig { return f.cfg }

// fleetAllow reports whether an operation may go to Redis: always while
// the fleet is up; while it is down, one probe per retry interval. probe
// is true for that one; replies is the count of Redis' replies so far (see
// fleetResult).
func fleetAllow(f *Fleet) (allowed, probe bool, replies uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.up {
		return true, false, f.replies
	}
	if f.probing || f.clock.Now().Before(f.nextProbe) {
		return false, false, f.replies
	}
	f.probing = true
	return true, true, f.replies
}

// fleetResult feeds an operation's outcome to the breaker; replies is
// Redis' reply count when it was sent. A failure counts only when Redis
// answered nothing since: under a burst of operations some time out on a
// replica too busy to read their replies while the others are answered,
// and Redis is not away. Failures of a caller that gave up (its context
// ended) say nothing about Redis (see fleetObserve).
func fleetResult(f *Fleet, err error, probe bool, replies uint64) {
	f.mu.Lock()
	if probe {
		f.probing = false
	}
	changed := false
	if err == nil {
		f.replies++
		f.failures = 0
		if !f.up {
			f.up = true
			changed = true
		}
	} else if !f.up || f.replies == replies {
		// Counted: Redis answered no other operation meanwhile.
		f.failures++
		if f.up && f.failures >= fleetFailuresToOpen {
			f.up = false
			changed = true
		}
		if !f.up {
			f.nextProbe = f.clock.Now().Add(time.Duration(f.cfg.RetryInterval))
		}
	}
	up := f.up
	f.mu.Unlock()
	if changed {
		fleetStateChanged(f, up, err)
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
		// Client errors name the address at most; redactURLsIn removes a
		// URL's userinfo should one quote it.
		fields = append(fields, stringField("error", redact.URLsIn(err.Error())))
	}
	f.log(fields)
}

// fleetDo sends one command within the operation timeout and feeds the
// breaker. A blocking read (block > 0) gets twice its block time on top:
// Redis times blocked clients out on its own clock tick (hz), up to about
// 100ms late at the default hz.
func fleetDo(f *Fleet, parent context.Context, op string, block time.Duration, args ...string) (fleetstore.RedisValue, error) {
	allowed, probe, replies := fleetAllow(f)
	if !allowed {
		return fleetstore.RedisValue{}, errFleetDown
	}
	ctx, cancel := context.WithTimeout(parent, time.Duration(f.cfg.Timeout)+2*block)
	start := time.Now()
	v, err := f.client.Do(ctx, args...)
	cancel()
	fleetObserve(f, parent, op, start, err, probe, replies)
	return v, err
}

// fleetPipeline sends cmds in one round trip within the operation timeout.
func fleetPipeline(f *Fleet, parent context.Context, op string, cmds [][]string) ([]fleetstore.RedisValue, error) {
	allowed, probe, replies := fleetAllow(f)
	if !allowed {
		return nil, errFleetDown
	}
	ctx, cancel := context.WithTimeout(parent, time.Duration(f.cfg.Timeout))
	start := time.Now()
	v, err := f.client.Pipeline(ctx, cmds)
	cancel()
	fleetObserve(f, parent, op, start, err, probe, replies)
	return v, err
}

// fleetObserve records an operation's latency and error, and tells the
// breaker. An error reply such as NOSCRIPT proves the connection works.
func fleetObserve(f *Fleet, parent context.Context, op string, start time.Time, err error, probe bool, replies uint64) {
	busy := err != nil && errors.Is(err, fleetstore.ErrRedisBusy)
	if f.metrics != nil {
		f.metrics.Record(MetricFleetDuration, []string{f.name, op}, time.Since(start).Seconds())
		if err != nil && !busy && !isNoScript(err) { // fleetEval sends the script then
			f.metrics.Record(MetricFleetErrors, []string{f.name, op}, 1)
		}
	}
	if err != nil && (parent.Err() != nil || busy) {
		// The request left, or the client had no connection free:
		// nothing learnt about Redis.
		if probe {
			f.mu.Lock()
			f.probing = false
			f.mu.Unlock()
		}
		return
	}
	if err != nil && isNoScript(err) {
		err = nil
	}
	fleetResult(f, err, probe, replies)
}

func isNoScript(err error) bool { return strings.HasPrefix(err.Error(), "NOSCRIPT") }

// fleetScript is a Lua script sent by its SHA-1 (EVALSHA), and in full
// (EVAL, which also caches it) when Redis does not know it yet, e.g. after
// a restart.
type fleetScript struct {
	src string
	sha string
}

func newFleetScript(src string) *fleetScript {
	sum := sha1.Sum([]byte(src))
	return &fleetScript{src: src, sha: hex.EncodeToString(sum[:])}
}

// fleetScriptCmd is the command that runs a script: verb EVALSHA with its
// SHA-1, or EVAL with its source.
func fleetScriptCmd(verb, script string, keys, args []string) []string {
	cmd := make([]string, 0, 3+len(keys)+len(args))
	cmd = append(cmd, verb, script, strconv.Itoa(len(keys)))
	cmd = append(cmd, keys...)
	cmd = append(cmd, args...)
	return cmd
}

// fleetEval runs s with keys and args.
func fleetEval(f *Fleet, ctx context.Context, op string, s *fleetScript, keys []string, args ...string) (fleetstore.RedisValue, error) {
	cmd := fleetScriptCmd("EVALSHA", s.sha, keys, args)
	v, err := fleetDo(f, ctx, op, 0, cmd...)
	if err == nil || !isNoScript(err) {
		return v, err
	}
	cmd[0] = "EVAL"
	cmd[1] = s.src
	v2, err2 := fleetDo(f, ctx, op, 0, cmd...)
	return v2, err2
}

// fleetEvalAgain is fleetEval sent a second time when the first failed on
// the way (a timeout: it may or may not have run) while the fleet is up and
// ctx lives: for the scripts whose outcome decides what a client gets and
// that are safe to run twice (claim, finish, store budget). It returns
// when the reply's call was sent.
func fleetEvalAgain(f *Fleet, ctx context.Context, op string, s *fleetScript, keys []string, args ...string) (time.Time, fleetstore.RedisValue, error) {
	sent := f.clock.Now()
	v, err := fleetEval(f, ctx, op, s, keys, args...)
	if err != nil && err != errFleetDown && f.Up() && ctx.Err() == nil {
		sent = f.clock.Now()
		v, err = fleetEval(f, ctx, op, s, keys, args...)
	}
	return sent, v, err
}

// fleetNewHolder returns a holder id unique to this flight.
func fleetNewHolder(f *Fleet) string {
	n := atomic.AddInt64(&f.holders, 1)
	return f.replica + "." + strconv.FormatInt(n, 36)
}

// streamLinger is how long a generation's stream outlives its last
// renewal or its end, for followers still reading it; capped by the TTL.
const streamLinger = 60 * time.Second

func fleetStreamMillis(f *Fleet, ttl time.Duration) string {
	return fleetLingerMillis(streamLinger, ttl)
}

// fleetLingerMillis is d capped by the TTL, in milliseconds.
func fleetLingerMillis(d, ttl time.Duration) string {
	if ttl > 0 && ttl < d {
		d = ttl
	}
	return millisString(d)
}

func millisString(d time.Duration) string {
	ms := int64(d / time.Millisecond)
	if ms < 1 {
		ms = 1
	}
	return strconv.FormatInt(ms, 10)
}

// claimScript: KEYS lease, done, readers, sealed; ARGV holder,
// fingerprint, lease ms, readers ms. Returns {"replay", doneValue, pttl},
// {"conflict"}, {"lead", holder} or {"follow", holder}. A follower counts
// itself in the holder's field of readers (and uncounts itself when it
// stops reading), which tells a leader whose own client left whether
// others still read its answer. A sealed generation (its end marker went
// out: see renewScript) is followed even once its lease ran out: nobody
// leads a second generation of a key whose first was delivered whole.
var claimScript = newFleetScript(`
local d = redis.call('GET', KEYS[2])
if d then
  if string.sub(d, 1, #ARGV[2] + 1) ~= ARGV[2] .. '\n' then return {'conflict'} end
  return {'replay', d, redis.call('PTTL', KEYS[2])}
end
local l = redis.call('GET', KEYS[4])
if not l then
  if redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[2], 'NX', 'PX', ARGV[3]) then
    redis.call('DEL', KEYS[3])
    return {'lead', ARGV[1]}
  end
  l = redis.call('GET', KEYS[1])
end
local sp = string.find(l, ' ', 1, true)
if string.sub(l, sp + 1) ~= ARGV[2] then return {'conflict'} end
local holder = string.sub(l, 1, sp - 1)
redis.call('HINCRBY', KEYS[3], holder, 1)
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return {'follow', holder}
`)

// renewScript: ARGV lease value, lease ms, stream ms, holder, seal ms (""
// for none: the answer's end marker is about to go out). KEYS lease,
// stream, readers, sealed. Extends the lease (and the stream) only while
// this leader holds it, or sealed its generation: a seal marks the
// generation until its end is in (for the seal's time at most), so that no
// claim starts another while this leader finishes, however late. It never
// takes a missing lease: a leader whose claim timed out and never landed
// cannot tell whether another generation ran beside its race meanwhile.
// Returns {1, followers reading}, {0, 0} when the lease is another's,
// {-1, 0} when there is none.
var renewScript = newFleetScript(`
local l = redis.call('GET', KEYS[1])
if l ~= ARGV[1] and redis.call('GET', KEYS[4]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return {1, tonumber(redis.call('HGET', KEYS[3], ARGV[4]) or '0')}
end
if l == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  if ARGV[5] ~= '' then redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[5]) end
  return {1, tonumber(redis.call('HGET', KEYS[3], ARGV[4]) or '0')}
end
if not l then return {-1, 0} end
return {0, 0}
`)

// Results of the fenced writes (appendScript, finishScript).
const (
	fenceOK   = "ok"   // written
	fenceLost = "lost" // the lease is another leader's: nothing written
	fenceNone = "none" // there is no lease: nothing written
	fenceGone = "gone" // the lease holds but the stream vanished: nothing appended
)

// appendScript: KEYS lease, stream, sealed; ARGV lease value, stream ms,
// sequence number of the first entry, then kind and value of each entry.
// Appends only while this leader holds the lease (or sealed its
// generation), and creates the stream only with its first entry (the
// head): an append never re-creates a stream that vanished.
var appendScript = newFleetScript(`
local l = redis.call('GET', KEYS[1])
if l ~= ARGV[1] and redis.call('GET', KEYS[3]) == ARGV[1] then l = ARGV[1] end
if not l then return 'none' end
if l ~= ARGV[1] then return 'lost' end
local n = tonumber(ARGV[3])
if n > 1 and redis.call('EXISTS', KEYS[2]) == 0 then return 'gone' end
for i = 4, #ARGV, 2 do
  redis.call('XADD', KEYS[2], '*', 't', ARGV[i], 'v', ARGV[i + 1], 'n', n)
  n = n + 1
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 'ok'
`)

// finishScript: KEYS lease, stream, done, sealed; ARGV lease value, end kind, done
// value ("" for none), ttl ms, stream ms, sequence number of the first
// entry, last data ("" for none), linger ms of an ended stream, of a
// stored answer's, holder. While this leader holds the lease it
// appends the last data and the end (to a stream that still exists),
// stores the answer and releases the lease: the store comes first, so a
// claim finds the lease or the answer, never neither while a complete
// answer exists. An ended stream lingers only for the followers reading
// it (endLinger), a stored answer's only doneLinger (they finish from the
// stored answer), so Redis holds a stored answer once. A leader that lost
// the lease writes nothing, unless it sealed its generation (the seal is
// what it holds then). Sent again after a failure, it finds its own end (or
// its stored answer) and says ok. The end lifts the seal.
var finishScript = newFleetScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] and redis.call('GET', KEYS[4]) ~= ARGV[1] then
  local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if #last == 1 and last[1][2][2] == 'e' then return 'ok' end
  local d = redis.call('GET', KEYS[3])
  if d and string.find(d, '\n@' .. ARGV[10] .. '\n', 1, true) then return 'ok' end
  if not redis.call('GET', KEYS[1]) then return 'none' end
  return 'lost'
end
local n = tonumber(ARGV[6])
local res = 'ok'
if n == 1 or redis.call('EXISTS', KEYS[2]) == 1 then
  if ARGV[7] ~= '' then
    redis.call('XADD', KEYS[2], '*', 't', 'd', 'v', ARGV[7], 'n', n)
    n = n + 1
  end
  redis.call('XADD', KEYS[2], '*', 't', 'e', 'v', ARGV[2], 'n', n)
  redis.call('PEXPIRE', KEYS[2], ARGV[8])
else
  res = 'gone'
end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[9])
end
redis.call('DEL', KEYS[1], KEYS[4])
return res
`)

// An ended stream's readers are the followers that joined before its end:
// blocked ones get the end at once, others are catching up. It lingers
// endLinger for them, or doneLinger when the same bytes were stored (a
// follower further behind finishes from the stored answer); a new request
// after the end replays the stored answer or runs afresh, never reads it.
const (
	endLinger  = 10 * time.Second
	doneLinger = time.Second
)

// storeBudgetScript admits an answer to the fleet store within the
// route's and the caller's byte budgets (Redis' clock). KEYS route set,
// route total, caller set, caller total; ARGV size, ttl ms, member (the
// identity), route budget, caller budget. Each set holds "<size>:<member>"
// scored by its expiry; expired ones leave the totals first. Returns 1
// when the answer fits both (and counts it), else 0: a full store stores
// nothing new until stored answers expire.
var storeBudgetScript = newFleetScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function used(set, total)
  local gone = redis.call('ZRANGEBYSCORE', set, '-inf', now)
  if #gone > 0 then
    local sum = 0
    for _, m in ipairs(gone) do sum = sum + tonumber(string.match(m, '^(%d+):')) end
    redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
    redis.call('DECRBY', total, sum)
  end
  return tonumber(redis.call('GET', total) or '0')
end
local size = tonumber(ARGV[1])
if used(KEYS[1], KEYS[2]) + size > tonumber(ARGV[4]) then return 0 end
if used(KEYS[3], KEYS[4]) + size > tonumber(ARGV[5]) then return 0 end
for i = 1, 3, 2 do
  redis.call('ZADD', KEYS[i], now + tonumber(ARGV[2]), ARGV[1] .. ':' .. ARGV[3])
  redis.call('INCRBY', KEYS[i + 1], size)
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
  redis.call('PEXPIRE', KEYS[i + 1], ARGV[2])
end
return 1
`)
