package fleetstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"
)

// A Conn is one replica's use of a fleet's Redis: its client, guarded by a
// breaker. After FailuresToOpen failures in a row it is down: operations
// fail at once with ErrDown and the engine uses the replica's own state;
// one operation per retry interval probes Redis and the first success
// brings it up again. It is safe for concurrent use.
//
// Invariant: a failure counts towards taking the connection down only when
// Redis answered no operation during its life (replies unchanged), so a
// replica too busy to read its replies in time, or one Cluster master
// failing over, does not take the fleet down while Redis answers.
type Conn struct {
	client  RedisClient
	timeout time.Duration
	retry   time.Duration
	now     func() time.Time
	observe func(op string, seconds float64, failed bool)
	changed func(up bool, err error)

	mu        sync.Mutex
	up        bool
	failures  int
	nextProbe time.Time
	probing   bool
	replies   uint64 // operations Redis answered
}

// ConnOptions configure a Conn.
type ConnOptions struct {
	// Timeout bounds one operation (a blocking read gets its block time
	// twice on top). RetryInterval is the time between probes while down.
	Timeout, RetryInterval time.Duration
	// Now is the clock of the retry interval. Default time.Now.
	Now func() time.Time
	// Observe receives every operation's duration, and failed true when it
	// is an error of Redis or the connection (not NOSCRIPT, not the
	// client's own lack of a free connection). Optional.
	Observe func(op string, seconds float64, failed bool)
	// StateChanged is called, outside every lock, when the connection goes
	// down (with the error) or comes back up. Optional.
	StateChanged func(up bool, err error)
}

// FailuresToOpen failed operations in a row, with no reply from Redis to
// any operation meanwhile, take the connection down.
const FailuresToOpen int = 3

// ErrDown is the error of an operation the breaker did not let through.
var ErrDown = errors.New("llmhedge: fleet down")

// Operation names: the op label of the fleet metrics.
const (
	OpClaim     = "claim"
	OpAppend    = "append"
	OpFinish    = "finish"
	OpRenew     = "renew"
	OpRead      = "read"
	OpLease     = "lease"
	OpSync      = "sync"
	OpHeartbeat = "heartbeat"
	OpPublish   = "publish"
)

// NewConn returns a Conn over client. It does not touch Redis. It starts up.
func NewConn(client RedisClient, opts ConnOptions) *Conn {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Conn{client: client, timeout: opts.Timeout, retry: opts.RetryInterval, now: now,
		observe: opts.Observe, changed: opts.StateChanged, up: true}
}

// Up reports whether the connection is in use (the breaker is closed).
func Up(c *Conn) bool {
	c.mu.Lock()
	up := c.up
	c.mu.Unlock()
	return up
}

// allow reports whether an operation may go to Redis: always while up;
// while down, one probe per retry interval. probe is true for that one;
// replies is the count of Redis' replies so far (see result).
func allow(c *Conn) (allowed, probe bool, replies uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.up {
		return true, false, c.replies
	}
	if c.probing || c.now().Before(c.nextProbe) {
		return false, false, c.replies
	}
	c.probing = true
	return true, true, c.replies
}

// Result feeds an operation's outcome to the breaker; replies is Redis'
// reply count when it was sent (Replies). A failure counts only when Redis
// answered nothing since: under a burst of operations some time out on a
// replica too busy to read their replies while the others are answered,
// and Redis is not away.
func Result(c *Conn, err error, probe bool, replies uint64) {
	c.mu.Lock()
	if probe {
		c.probing = false
	}
	changed := false
	if err == nil {
		c.replies++
		c.failures = 0
		if !c.up {
			c.up = true
			changed = true
		}
	} else if !c.up || c.replies == replies {
		// Counted: Redis answered no other operation meanwhile.
		c.failures++
		if c.up && c.failures >= FailuresToOpen {
			c.up = false
			changed = true
		}
		if !c.up {
			c.nextProbe = c.now().Add(c.retry)
		}
	}
	up := c.up
	c.mu.Unlock()
	if changed && c.changed != nil {
		c.changed(up, err)
	}
}

// Replies is the count of operations Redis answered so far.
func Replies(c *Conn) uint64 {
	c.mu.Lock()
	n := c.replies
	c.mu.Unlock()
	return n
}

// Do sends one command within the operation timeout and feeds the
// breaker. A blocking read (block > 0) gets twice its block time on top:
// Redis times blocked clients out on its own clock tick (hz), up to about
// 100ms late at the default hz.
func Do(c *Conn, parent context.Context, op string, block time.Duration, args ...string) (RedisValue, error) {
	allowed, probe, replies := allow(c)
	if !allowed {
		return RedisValue{}, ErrDown
	}
	ctx, cancel := context.WithTimeout(parent, c.timeout+2*block)
	start := time.Now()
	v, err := c.client.Do(ctx, args...)
	cancel()
	observe(c, parent, op, start, err, probe, replies)
	return v, err
}

// Pipeline sends cmds in one round trip within the operation timeout.
func Pipeline(c *Conn, parent context.Context, op string, cmds [][]string) ([]RedisValue, error) {
	allowed, probe, replies := allow(c)
	if !allowed {
		return nil, ErrDown
	}
	ctx, cancel := context.WithTimeout(parent, c.timeout)
	start := time.Now()
	v, err := c.client.Pipeline(ctx, cmds)
	cancel()
	observe(c, parent, op, start, err, probe, replies)
	return v, err
}

// observe reports an operation's latency and error, and tells the
// breaker. An error reply such as NOSCRIPT proves the connection works.
// Failures of a caller that gave up (its context ended) say nothing about
// Redis.
func observe(c *Conn, parent context.Context, op string, start time.Time, err error, probe bool, replies uint64) {
	busy := err != nil && errors.Is(err, ErrRedisBusy)
	if c.observe != nil {
		c.observe(op, time.Since(start).Seconds(), err != nil && !busy && !isNoScript(err)) // Eval sends the script then
	}
	if err != nil && (parent.Err() != nil || busy) {
		// The request left, or the client had no connection free:
		// nothing learnt about Redis.
		if probe {
			c.mu.Lock()
			c.probing = false
			c.mu.Unlock()
		}
		return
	}
	if err != nil && isNoScript(err) {
		err = nil
	}
	Result(c, err, probe, replies)
}

func isNoScript(err error) bool { return strings.HasPrefix(err.Error(), "NOSCRIPT") }

// Eval runs s with keys and args: by its SHA-1 (EVALSHA), and in full
// (EVAL, which also caches it) when Redis does not know it yet, e.g. after
// a restart.
func Eval(c *Conn, ctx context.Context, op string, s *Script, keys []string, args ...string) (RedisValue, error) {
	cmd := scriptCmd("EVALSHA", s.sha, keys, args)
	v, err := Do(c, ctx, op, 0, cmd...)
	if err == nil || !isNoScript(err) {
		return v, err
	}
	cmd[0] = "EVAL"
	cmd[1] = s.src
	v2, err2 := Do(c, ctx, op, 0, cmd...)
	return v2, err2
}

// EvalAgain is Eval sent a second time when the first failed on the way
// (a timeout: it may or may not have run) while the connection is up and
// ctx lives: for the scripts whose outcome decides what a client gets and
// that are safe to run twice (claim, finish, store budget). It returns
// when the reply's call was sent.
func EvalAgain(c *Conn, ctx context.Context, op string, s *Script, keys []string, args ...string) (time.Time, RedisValue, error) {
	sent := c.now()
	v, err := Eval(c, ctx, op, s, keys, args...)
	if err != nil && err != ErrDown && Up(c) && ctx.Err() == nil {
		sent = c.now()
		v, err = Eval(c, ctx, op, s, keys, args...)
	}
	return sent, v, err
}

// ReadEvictionPolicy reads Redis' maxmemory-policy with CONFIG GET,
// around the breaker: an error reply (CONFIG refused, as managed Redis
// often does) says nothing about the fleet's health. It returns the
// policy in lower case, or the error reply's text (refusal; also for an
// answer without the parameter), or answered false when Redis did not
// answer at all or answered "not now".
func ReadEvictionPolicy(c *Conn) (policy, refusal string, answered bool) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	v, err := c.client.Do(ctx, "CONFIG", "GET", "maxmemory-policy")
	cancel()
	p, r, ok := policyOf(v, err)
	return p, r, ok
}
