package resp

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/llmhedge/llmhedge/core"
)

// Client is a pooled Redis client, safe for concurrent use. It dials
// nothing until the first command.
type Client struct {
	ep        endpoint
	opts      Options
	tlsConfig *tls.Config
	general   *pool // ordinary commands
	blocking  *pool // XREAD BLOCK, BLPOP, ...: they hold a connection while they wait
}

var _ core.RedisClient = (*Client)(nil)

// New checks opts and returns a client. It does not connect.
func New(opts Options) (*Client, error) {
	ep, resolved, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	c := &Client{ep: ep, opts: resolved}
	if ep.useTLS {
		var cfg *tls.Config
		if resolved.TLSConfig != nil {
			cfg = resolved.TLSConfig.Clone()
		} else {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		if cfg.ServerName == "" {
			cfg.ServerName = ep.host
		}
		c.tlsConfig = cfg
	}
	c.general = newPool(resolved.MaxOpen, resolved.MaxIdle, resolved.IdleTimeout)
	c.blocking = newPool(resolved.MaxBlocking, resolved.MaxIdle, resolved.IdleTimeout)
	return c, nil
}

// Addr is the server's host:port (no credentials), for logs.
func (c *Client) Addr() string { return c.ep.addr }

// Close closes idle connections now and the others when their command
// returns; later commands fail.
func (c *Client) Close() error {
	closePool(c.general)
	closePool(c.blocking)
	return nil
}

// Stats are the client's connection counters.
type Stats struct {
	// Dials counts the connections ever dialed, failed attempts included
	// (both pools).
	Dials uint64
	// Open counts connections open now, Idle those of them not in use.
	Open int
	Idle int
}

// Stats reads the connection counters.
func (c *Client) Stats() Stats {
	var s Stats
	d1, o1, i1 := poolStats(c.general)
	d2, o2, i2 := poolStats(c.blocking)
	s.Dials = d1 + d2
	s.Open = o1 + o2
	s.Idle = i1 + i2
	return s
}

// Do sends one command and returns its reply; a Redis error reply is
// returned as an *Error.
func (c *Client) Do(ctx context.Context, args ...string) (core.RedisValue, error) {
	var zero core.RedisValue
	if len(args) == 0 {
		return zero, errors.New("resp: empty command")
	}
	cmds := [][]string{args}
	values, err := run(c, ctx, cmds, isBlocking(args))
	if err != nil {
		return zero, err
	}
	return values[0], nil
}

// Pipeline sends cmds in one write and reads their replies in order. The
// first error reply fails the call (after every reply has been read, so the
// connection stays usable); the replies are returned with it.
func (c *Client) Pipeline(ctx context.Context, cmds [][]string) ([]core.RedisValue, error) {
	if len(cmds) == 0 {
		return nil, nil
	}
	blocking := false
	for _, cmd := range cmds {
		if len(cmd) == 0 {
			return nil, errors.New("resp: empty command in pipeline")
		}
		if isBlocking(cmd) {
			blocking = true
		}
	}
	return run(c, ctx, cmds, blocking)
}

// run takes a connection, exchanges cmds on it and gives it back (closed
// when anything but a Redis error reply went wrong).
func run(c *Client, ctx context.Context, cmds [][]string, blocking bool) ([]core.RedisValue, error) {
	if err := context.Cause(ctx); err != nil {
		// Taken connection or not, the command could not be sent.
		return nil, fmt.Errorf("resp: %s at %s: %w", cmds[0][0], c.ep.addr, err)
	}
	p := c.general
	if blocking {
		p = c.blocking
	}
	cn, err := acquire(c, ctx, p)
	if err != nil {
		return nil, err
	}
	values, replyErr, ioErr, reusable := exchange(c, ctx, cn, cmds, blocking)
	releaseConn(p, cn, !reusable)
	if ioErr != nil {
		return nil, opError(c, ctx, cmds[0][0], ioErr)
	}
	if replyErr != nil {
		return values, replyErr
	}
	return values, nil
}

// acquire takes a pooled connection, dials a new one, or waits for one
// until ctx ends.
func acquire(c *Client, ctx context.Context, p *pool) (*conn, error) {
	cn, slot, w, err := takeConn(p)
	if err != nil {
		return nil, err
	}
	if cn != nil {
		return cn, nil
	}
	if w != nil {
		g := waitForConn(c, ctx, p, w)
		if g.err != nil {
			return nil, g.err
		}
		if g.c != nil {
			return g.c, nil
		}
		slot = g.slot
	}
	if !slot {
		return nil, errors.New("resp: internal error: no connection granted")
	}
	cn, err = dial(c, ctx)
	if err != nil {
		releaseConn(p, nil, true)
		return nil, err
	}
	return cn, nil
}

// waitForConn waits for w's answer. The wait ends with an error when ctx
// ends or, for a context without a deadline, after ReadTimeout. A wait that
// outlasted its deadline wraps core.ErrRedisBusy (the command never reached
// Redis: every connection was in use, which says nothing of Redis' health)
// and the context's error.
func waitForConn(c *Client, ctx context.Context, p *pool, w *waiter) grant {
	stop := context.AfterFunc(ctx, func() {
		abandonWait(p, w, waitError(c, ctx, p))
	})
	var timer *time.Timer
	if _, ok := ctx.Deadline(); !ok && c.opts.ReadTimeout > 0 {
		timer = time.AfterFunc(c.opts.ReadTimeout, func() {
			abandonWait(p, w, fmt.Errorf("resp: waiting for a connection to %s: all %d in use for %s: %w", c.ep.addr, p.maxOpen, c.opts.ReadTimeout, core.ErrRedisBusy))
		})
	}
	g := <-w.ch
	stop()
	if timer != nil {
		timer.Stop()
	}
	return g
}

// waitError is the error of a wait for a connection that ctx ended: busy
// when its deadline passed, the cancellation's cause otherwise (the caller
// left).
func waitError(c *Client, ctx context.Context, p *pool) error {
	cause := context.Cause(ctx)
	if ctx.Err() == context.DeadlineExceeded {
		return fmt.Errorf("resp: waiting for a connection to %s (all %d in use): %w (%w)", c.ep.addr, p.maxOpen, core.ErrRedisBusy, cause)
	}
	return fmt.Errorf("resp: waiting for a connection to %s: %w", c.ep.addr, cause)
}

// dial connects, completes TLS, and authenticates and selects the database
// in one round trip, all within DialTimeout and ctx.
func dial(c *Client, ctx context.Context) (*conn, error) {
	dialCtx := ctx
	if c.opts.DialTimeout > 0 {
		var cancel context.CancelFunc
		dialCtx, cancel = context.WithTimeout(ctx, c.opts.DialTimeout)
		defer cancel()
	}
	var d net.Dialer
	nc, err := d.DialContext(dialCtx, "tcp", c.ep.addr)
	if err != nil {
		return nil, opError(c, dialCtx, "dial", err)
	}
	if c.tlsConfig != nil {
		tc := tls.Client(nc, c.tlsConfig)
		if err := tc.HandshakeContext(dialCtx); err != nil {
			_ = nc.Close()
			return nil, opError(c, dialCtx, "TLS handshake", err)
		}
		nc = tc
	}
	cn := &conn{nc: nc, r: bufio.NewReaderSize(nc, 16<<10)}
	var setup [][]string
	if c.ep.password != "" {
		if c.ep.user != "" {
			setup = append(setup, []string{"AUTH", c.ep.user, c.ep.password})
		} else {
			setup = append(setup, []string{"AUTH", c.ep.password})
		}
	}
	if c.ep.db != 0 {
		setup = append(setup, []string{"SELECT", strconv.Itoa(c.ep.db)})
	}
	if len(setup) == 0 {
		return cn, nil
	}
	_, replyErr, ioErr, reusable := exchange(c, dialCtx, cn, setup, false)
	if ioErr == nil && !reusable {
		ioErr = errors.New("interrupted")
	}
	if ioErr != nil {
		_ = nc.Close()
		return nil, opError(c, dialCtx, setup[0][0], ioErr)
	}
	if replyErr != nil {
		_ = nc.Close()
		// Redis' AUTH errors (WRONGPASS, ERR AUTH <password> called without
		// any password configured) never contain the password.
		return nil, errors.New("resp: connection setup at " + c.ep.addr + ": " + replyErr.Error())
	}
	return cn, nil
}

// exchange writes cmds in one write, then reads one reply per command. It
// returns the first Redis error reply and, separately, a network or
// protocol error (after which cn must be closed), and whether cn may be
// reused.
func exchange(c *Client, ctx context.Context, cn *conn, cmds [][]string, blocking bool) ([]core.RedisValue, error, error, bool) {
	// A cancelled (not only expired) context interrupts blocked I/O by
	// moving the deadline into the past.
	var stop func() bool
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() { _ = cn.nc.SetDeadline(time.Unix(1, 0)) })
	}
	values, replyErr, ioErr := writeAndRead(c, ctx, cn, cmds, blocking)
	reusable := ioErr == nil
	if stop != nil && !stop() {
		// The interruption ran (or runs): whether or not the replies had
		// all arrived, the connection's deadline may have been moved.
		reusable = false
	}
	return values, replyErr, ioErr, reusable
}

func writeAndRead(c *Client, ctx context.Context, cn *conn, cmds [][]string, blocking bool) ([]core.RedisValue, error, error) {
	buf := cn.wbuf[:0]
	for _, cmd := range cmds {
		buf = appendCommand(buf, cmd)
	}
	if err := cn.nc.SetWriteDeadline(ioDeadline(ctx, c.opts.WriteTimeout, 0)); err != nil {
		return nil, nil, err
	}
	if _, err := cn.nc.Write(buf); err != nil {
		return nil, nil, err
	}
	if cap(buf) <= maxKeptWriteBuffer {
		cn.wbuf = buf[:0]
	} else {
		cn.wbuf = nil
	}
	var extra time.Duration
	readTimeout := c.opts.ReadTimeout
	if blocking {
		extra = blockDuration(cmds)
		if extra < 0 {
			readTimeout = -1 // BLOCK 0 or a blocking list command: the context alone bounds it
		}
	}
	if err := cn.nc.SetReadDeadline(ioDeadline(ctx, readTimeout, extra)); err != nil {
		return nil, nil, err
	}
	values := make([]core.RedisValue, len(cmds))
	var firstReplyErr error
	for i := range cmds {
		v, replyErr, ioErr := readReply(cn.r)
		if ioErr != nil {
			return nil, nil, ioErr
		}
		if replyErr != nil && firstReplyErr == nil {
			firstReplyErr = replyErr
		}
		values[i] = v
	}
	return values, firstReplyErr, nil
}

// ioDeadline is the earlier of ctx's deadline and now + timeout + extra
// (timeout ≤ 0: none). The zero time means no deadline.
func ioDeadline(ctx context.Context, timeout, extra time.Duration) time.Time {
	deadline, hasDeadline := ctx.Deadline()
	if timeout <= 0 {
		if hasDeadline {
			return deadline
		}
		return time.Time{}
	}
	own := time.Now().Add(timeout + extra)
	if hasDeadline && deadline.Before(own) {
		return deadline
	}
	return own
}

// isBlocking reports whether cmd may hold its connection while the server
// waits (those run on the blocking pool).
func isBlocking(cmd []string) bool {
	if cmd[0] == "" {
		return false
	}
	switch cmd[0][0] {
	case 'X', 'x', 'B', 'b', 'W', 'w':
	default:
		return false // most commands: no upper-casing needed
	}
	name := strings.ToUpper(cmd[0])
	switch name {
	case "XREAD", "XREADGROUP":
		for _, a := range cmd[1:] {
			if strings.EqualFold(a, "BLOCK") {
				return true
			}
		}
		return false
	case "BLPOP", "BRPOP", "BRPOPLPUSH", "BLMOVE", "BLMPOP", "BZPOPMIN", "BZPOPMAX", "BZMPOP", "WAIT", "WAITAOF":
		return true
	}
	return false
}

// blockDuration is the longest XREAD BLOCK of cmds, added to the read
// timeout; -1 when a command may block without a bound of its own (BLOCK 0,
// the list and sorted-set commands, whose timeouts are in seconds).
func blockDuration(cmds [][]string) time.Duration {
	var longest time.Duration
	for _, cmd := range cmds {
		if !isBlocking(cmd) {
			continue
		}
		name := strings.ToUpper(cmd[0])
		if name != "XREAD" && name != "XREADGROUP" {
			return -1
		}
		for i := 1; i+1 < len(cmd); i++ {
			if !strings.EqualFold(cmd[i], "BLOCK") {
				continue
			}
			ms, err := strconv.ParseInt(cmd[i+1], 10, 64)
			if err != nil || ms <= 0 {
				return -1
			}
			d := time.Duration(ms) * time.Millisecond
			if d > longest {
				longest = d
			}
			break
		}
	}
	return longest
}

// opError describes a failed operation by its name and the server's
// address (never its arguments or credentials). When ctx has ended, its
// cause is what is wrapped, so callers can test for
// context.DeadlineExceeded.
func opError(c *Client, ctx context.Context, op string, err error) error {
	if cause := context.Cause(ctx); cause != nil {
		return fmt.Errorf("resp: %s at %s: %w (%v)", op, c.ep.addr, cause, err)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		// The I/O deadline was ctx's and passed a moment before ctx's own
		// timer marked it done.
		if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
			return fmt.Errorf("resp: %s at %s: %w (%v)", op, c.ep.addr, context.DeadlineExceeded, err)
		}
		return fmt.Errorf("resp: %s at %s: timeout: %w", op, c.ep.addr, err)
	}
	return fmt.Errorf("resp: %s at %s: %w", op, c.ep.addr, err)
}
