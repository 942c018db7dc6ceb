package resp

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// Client is a pooled Redis client, safe for concurrent use. It dials
// nothing until the first command. It talks to one server (redis://,
// rediss://) or to a Redis Cluster (redis+cluster://, rediss+cluster://:
// one node per pool set, see cluster.go).
type Client struct {
	ep      endpoint
	opts    Options
	tlsBase *tls.Config   // nil without TLS; ServerName empty unless set by the caller
	single  *node         // the server (nil in cluster mode)
	cl      *clusterState // cluster mode (nil for one server)

	mu sync.Mutex
	// modeChecked: a connection of a single-server client has shown that
	// the server is no cluster node (INFO cluster, see dial).
	modeChecked bool
	// refused fails every command: the URL's kind does not match the
	// server (a cluster node behind redis://, a plain server behind
	// redis+cluster://).
	refused error
}

// node is one server's connections: ordinary commands and blocking ones on
// pools of their own.
type node struct {
	addr      string      // host:port
	tlsConfig *tls.Config // nil without TLS
	general   *pool       // ordinary commands
	blocking  *pool       // XREAD BLOCK, BLPOP, ...: they hold a connection while they wait

	mu          sync.Mutex
	lastDialErr error // the last dial's failure, nil once one connects
}

var _ fleetstore.RedisClient = (*Client)(nil)

// New checks opts and returns a client. It does not connect.
func New(opts Options) (*Client, error) {
	ep, resolved, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	c := &Client{ep: ep, opts: resolved}
	if ep.useTLS {
		if resolved.TLSConfig != nil {
			c.tlsBase = resolved.TLSConfig.Clone()
		} else {
			c.tlsBase = &tls.Config{MinVersion: tls.VersionTLS12}
		}
	}
	if ep.cluster {
		c.cl = newClusterState(ep.seeds)
	} else {
		c.single = newNode(c, ep.addr)
	}
	return c, nil
}

// newNode makes the pools of the server at addr. Its TLS ServerName is the
// caller's, or addr's host.
func newNode(c *Client, addr string) *node {
	n := &node{addr: addr}
	n.general = newPool(c.opts.MaxOpen, c.opts.MaxIdle, c.opts.IdleTimeout)
	// Every blocking connection may stay idle: a follower's next read comes
	// milliseconds after its last, and MaxIdle would close (and the next
	// read redial) all but a few. IdleTimeout still closes unused ones.
	n.blocking = newPool(c.opts.MaxBlocking, c.opts.MaxBlocking, c.opts.IdleTimeout)
	if c.tlsBase != nil {
		cfg := c.tlsBase.Clone()
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			cfg.ServerName = host
		}
		n.tlsConfig = cfg
	}
	return n
}

func closeNode(n *node) {
	closePool(n.general)
	closePool(n.blocking)
}

// Addr is the server's host:port (no credentials), for logs; for a
// cluster, the URL's nodes separated by commas.
func (c *Client) Addr() string {
	if c.cl != nil {
		return strings.Join(c.ep.seeds, ",")
	}
	return c.ep.addr
}

// Close closes idle connections now and the others when their command
// returns; later commands fail.
func (c *Client) Close() error {
	if c.cl != nil {
		closeCluster(c.cl)
		return nil
	}
	closeNode(c.single)
	return nil
}

// Stats are the client's connection counters.
type Stats struct {
	// Dials counts the connections ever dialed, failed attempts included
	// (both pools, every node of a cluster).
	Dials uint64
	// Open counts connections open now, Idle those of them not in use.
	Open int
	Idle int
	// Redis Cluster only: MOVED and ASK redirections followed, and slot
	// maps read (CLUSTER SLOTS).
	Moved    uint64
	Asked    uint64
	SlotMaps uint64
}

// Stats reads the connection counters.
func (c *Client) Stats() Stats {
	var s Stats
	var nodes []*node
	if c.cl != nil {
		nodes = clusterNodes(c.cl)
		moved, asked, slotMaps := clusterCounters(c.cl)
		s.Moved = moved
		s.Asked = asked
		s.SlotMaps = slotMaps
	} else {
		nodes = append(nodes, c.single)
	}
	for _, n := range nodes {
		d1, o1, i1 := poolStats(n.general)
		d2, o2, i2 := poolStats(n.blocking)
		s.Dials += d1 + d2
		s.Open += o1 + o2
		s.Idle += i1 + i2
	}
	return s
}

// refusal is the error that fails every command, if any.
func refusal(c *Client) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.refused
	return err
}

// refuse makes err fail every later command (the first refusal stays).
func refuse(c *Client, err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refused == nil {
		c.refused = err
	}
	first := c.refused
	return first
}

// Do sends one command and returns its reply; a Redis error reply is
// returned as an *Error.
func (c *Client) Do(ctx context.Context, args ...string) (fleetstore.RedisValue, error) {
	var zero fleetstore.RedisValue
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
// connection stays usable); the replies are returned with it. On a Redis
// Cluster every command with a key must be on one hash slot (an error
// wrapping ErrCrossSlot otherwise, before anything is sent).
func (c *Client) Pipeline(ctx context.Context, cmds [][]string) ([]fleetstore.RedisValue, error) {
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

// run sends cmds to the server, or to the cluster node of their slot.
func run(c *Client, ctx context.Context, cmds [][]string, blocking bool) ([]fleetstore.RedisValue, error) {
	if err := refusal(c); err != nil {
		return nil, err
	}
	if c.cl != nil {
		return clusterRun(c, ctx, cmds, blocking)
	}
	values, replyErrs, _, failure := roundTrip(c, ctx, c.single, cmds, blocking)
	if failure != nil {
		return nil, failure
	}
	for _, e := range replyErrs {
		if e == nil {
			continue
		}
		if _, _, _, redirected := parseRedirect(e.Error()); redirected {
			// The server is a cluster node after all (it became one
			// after the connection was checked).
			return nil, refuse(c, clusterNodeError(c))
		}
	}
	return values, firstError(replyErrs)
}

// How a round trip failed.
const (
	sentNothing = 1 // the context had ended, no connection was free, or the client is closed
	dialFailed  = 2 // no connection could be made: nothing was sent
	ioFailed    = 3 // the exchange failed: the commands may have run
)

// roundTrip takes a connection of n, exchanges cmds on it and gives it back
// (closed when anything but a Redis error reply went wrong). It returns the
// replies and each command's error reply (nil when there are none), or a
// failure and how it happened.
func roundTrip(c *Client, ctx context.Context, n *node, cmds [][]string, blocking bool) ([]fleetstore.RedisValue, []error, int, error) {
	if err := context.Cause(ctx); err != nil {
		// Taken connection or not, the command could not be sent.
		return nil, nil, sentNothing, fmt.Errorf("resp: %s at %s: %w", cmds[0][0], n.addr, err)
	}
	p := n.general
	if blocking {
		p = n.blocking
	}
	cn, waited, how, err := acquire(c, ctx, n, p)
	if err != nil {
		return nil, nil, how, err
	}
	if blocking {
		fitted, ok := fitBlock(ctx, cmds, waited)
		if !ok {
			releaseConn(p, cn, false)
			return nil, nil, sentNothing, fmt.Errorf("resp: %s at %s: no time left to block after waiting for a blocking connection (all %d in use): %w (%w)",
				cmds[0][0], n.addr, p.maxOpen, fleetstore.ErrRedisBusy, context.DeadlineExceeded)
		}
		cmds = fitted
	}
	values, replyErrs, ioErr, reusable := exchange(c, ctx, cn, cmds, blocking)
	releaseConn(p, cn, !reusable)
	if ioErr != nil {
		return nil, nil, ioFailed, opError(ctx, n.addr, cmds[0][0], ioErr)
	}
	return values, replyErrs, 0, nil
}

// firstError is the first non-nil of errs.
func firstError(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// acquire takes a pooled connection, dials a new one, or waits for one
// until ctx ends; waited tells whether it had to wait. A failure says how
// (sentNothing or dialFailed).
func acquire(c *Client, ctx context.Context, n *node, p *pool) (*conn, bool, int, error) {
	cn, slot, w, err := takeConn(p)
	if err != nil {
		return nil, false, sentNothing, err
	}
	if cn != nil {
		return cn, false, 0, nil
	}
	waited := w != nil
	if waited {
		g := waitForConn(c, ctx, n, p, w)
		if g.err != nil {
			return nil, true, sentNothing, g.err
		}
		if g.c != nil {
			return g.c, true, 0, nil
		}
		slot = g.slot
	}
	if !slot {
		return nil, waited, sentNothing, errors.New("resp: internal error: no connection granted")
	}
	cn, goesOn, err := dial(c, ctx, n, p)
	if err != nil {
		if !goesOn {
			releaseConn(p, nil, true) // a dial that goes on gives back its slot itself
		}
		if refusal(c) != nil || errors.Is(err, fleetstore.ErrRedisBusy) {
			return nil, waited, sentNothing, err
		}
		return nil, waited, dialFailed, err
	}
	return cn, waited, 0, nil
}

// blockSlack is the time an XREAD BLOCK leaves before its context's
// deadline: Redis times blocked clients out on its clock tick (hz), up to
// about 100ms late at the default hz 10, and the reply must still travel.
const blockSlack = 200 * time.Millisecond

// fitBlock shortens the XREAD BLOCK times of cmds that would outlast ctx's
// deadline (less blockSlack), so that a read that got its connection late
// (after a wait for the blocking pool) ends with Redis' own timeout, a nil
// reply, instead of the caller's deadline and a dropped connection; an
// XREAD BLOCK reply is "nothing yet" either way. ok is false when waited is
// true and no time is left to block at all. BLOCK 0 (until the context
// ends) is left alone, and so are commands when ctx has no deadline.
// Commands are copied, never changed in place.
func fitBlock(ctx context.Context, cmds [][]string, waited bool) ([][]string, bool) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return cmds, true
	}
	room := time.Until(deadline) - blockSlack
	var out [][]string
	for i, cmd := range cmds {
		at := xreadBlockArg(cmd)
		if at < 0 {
			continue
		}
		ms, err := strconv.ParseInt(cmd[at], 10, 64)
		if err != nil || ms <= 0 || time.Duration(ms)*time.Millisecond <= room {
			continue
		}
		if room < time.Millisecond {
			if waited {
				return nil, false
			}
			continue // the caller's own short deadline: as asked
		}
		if out == nil {
			out = make([][]string, len(cmds))
			copy(out, cmds)
		}
		fitted := make([]string, len(cmd))
		copy(fitted, cmd)
		fitted[at] = strconv.FormatInt(int64(room/time.Millisecond), 10)
		out[i] = fitted
	}
	if out == nil {
		return cmds, true
	}
	return out, true
}

// xreadBlockArg is the index of an XREAD or XREADGROUP command's BLOCK time
// (-1: none).
func xreadBlockArg(cmd []string) int {
	if !strings.EqualFold(cmd[0], "XREAD") && !strings.EqualFold(cmd[0], "XREADGROUP") {
		return -1
	}
	for i := 1; i+1 < len(cmd); i++ {
		if strings.EqualFold(cmd[i], "BLOCK") {
			return i + 1
		}
	}
	return -1
}

// waitForConn waits for w's answer. The wait ends with an error when ctx
// ends or, for a context without a deadline, after ReadTimeout. A wait that
// outlasted its deadline wraps fleetstore.ErrRedisBusy (the command never reached
// Redis: every connection was in use, which says nothing of Redis' health)
// and the context's error.
func waitForConn(c *Client, ctx context.Context, n *node, p *pool, w *waiter) grant {
	stop := context.AfterFunc(ctx, func() {
		abandonWait(p, w, waitError(ctx, n, p))
	})
	var timer *time.Timer
	if _, ok := ctx.Deadline(); !ok && c.opts.ReadTimeout > 0 {
		timer = time.AfterFunc(c.opts.ReadTimeout, func() {
			abandonWait(p, w, fmt.Errorf("resp: waiting for a connection to %s: all %d in use for %s: %w", n.addr, p.maxOpen, c.opts.ReadTimeout, fleetstore.ErrRedisBusy))
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
// when its deadline passed (the last dial's failure when it failed), the
// cancellation's cause otherwise (the caller left).
func waitError(ctx context.Context, n *node, p *pool) error {
	cause := context.Cause(ctx)
	if last := lastDialErr(n); ctx.Err() == context.DeadlineExceeded && last != nil {
		// The connections it waited for are dials that fail: Redis is
		// refusing or unreachable, not busy.
		return last
	}
	if ctx.Err() == context.DeadlineExceeded {
		return fmt.Errorf("resp: waiting for a connection to %s (all %d in use): %w (%w)", n.addr, p.maxOpen, fleetstore.ErrRedisBusy, cause)
	}
	return fmt.Errorf("resp: waiting for a connection to %s: %w", n.addr, cause)
}

// dial connects to n, completes TLS, and authenticates and selects the
// database in one round trip, all within DialTimeout and ctx. Until one
// connection has shown it, a single-server client also asks whether the
// server is a cluster node (INFO cluster): such a server is refused.
//
// A caller whose deadline comes before DialTimeout does not cut the dial
// short: the dial goes on, within DialTimeout, and a connection made after
// the caller left goes to the pool (p) for the next one. Otherwise a
// replica too busy to finish a connect within one operation's time (a
// follower storm dialing hundreds of connections at once, a throttled CPU)
// would start every dial anew and connect never. The caller that left
// gets fleetstore.ErrRedisBusy (a wait for a connection, not a Redis failure),
// unless the last dial to n failed: then that failure (Redis refused or
// unreachable within DialTimeout).
// goesOn reports a dial its caller left, which owns the pool slot now.
func dial(c *Client, ctx context.Context, n *node, p *pool) (cn *conn, goesOn bool, err error) {
	deadline, ok := ctx.Deadline()
	if !ok || c.opts.DialTimeout <= 0 || time.Until(deadline) >= c.opts.DialTimeout {
		cn, err := dialOnce(c, ctx, n)
		noteDial(n, err)
		return cn, false, err
	}
	d := &pendingDial{done: make(chan struct{})}
	go finishDial(c, n, p, d)
	stop := context.AfterFunc(ctx, func() {
		d.mu.Lock()
		if !d.ended {
			d.left = true
			close(d.done)
		}
		d.mu.Unlock()
	})
	<-d.done
	stop()
	d.mu.Lock()
	left := d.left
	cn, err = d.cn, d.err
	d.mu.Unlock()
	if !left {
		return cn, false, err
	}
	if cause := context.Cause(ctx); ctx.Err() != context.DeadlineExceeded {
		return nil, true, fmt.Errorf("resp: dial at %s: %w", n.addr, cause)
	}
	if last := lastDialErr(n); last != nil {
		return nil, true, last
	}
	return nil, true, fmt.Errorf("resp: dial at %s: not connected within the operation's deadline: %w (%w)", n.addr, fleetstore.ErrRedisBusy, context.DeadlineExceeded)
}

// pendingDial is a dial its caller may leave: ended (the dial's result is
// in) or left (the caller's context ended first), whichever comes first,
// closes done. Guarded by mu.
type pendingDial struct {
	mu          sync.Mutex
	done        chan struct{}
	ended, left bool
	cn          *conn
	err         error
}

// finishDial runs d's dial within DialTimeout and hands its result to the
// caller or, when the caller left, its connection to the pool (a failed
// dial gives back its slot).
func finishDial(c *Client, n *node, p *pool, d *pendingDial) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.DialTimeout)
	cn, err := dialOnce(c, ctx, n)
	cancel()
	noteDial(n, err)
	d.mu.Lock()
	left := d.left
	if !left {
		d.ended, d.cn, d.err = true, cn, err
		close(d.done)
	}
	d.mu.Unlock()
	if left {
		releaseConn(p, cn, err != nil)
	}
}

// lastDialErr is the last dial to n's failure (nil: it connected).
func lastDialErr(n *node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lastDialErr
}

// noteDial records the outcome of the last dial to n.
func noteDial(n *node, err error) {
	n.mu.Lock()
	n.lastDialErr = err
	n.mu.Unlock()
}

// dialOnce connects to n and sets the connection up (AUTH, SELECT, the
// mode check), within DialTimeout and ctx.
func dialOnce(c *Client, ctx context.Context, n *node) (*conn, error) {
	dialCtx := ctx
	if c.opts.DialTimeout > 0 {
		var cancel context.CancelFunc
		dialCtx, cancel = context.WithTimeout(ctx, c.opts.DialTimeout)
		defer cancel()
	}
	var d net.Dialer
	nc, err := d.DialContext(dialCtx, "tcp", n.addr)
	if err != nil {
		return nil, opError(dialCtx, n.addr, "dial", err)
	}
	if n.tlsConfig != nil {
		tc := tls.Client(nc, n.tlsConfig)
		if err := tc.HandshakeContext(dialCtx); err != nil {
			_ = nc.Close()
			return nil, opError(dialCtx, n.addr, "TLS handshake", err)
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
	c.mu.Lock()
	checkMode := c.cl == nil && !c.modeChecked
	c.mu.Unlock()
	if checkMode {
		setup = append(setup, []string{"INFO", "cluster"})
	}
	if len(setup) == 0 {
		return cn, nil
	}
	values, replyErrs, ioErr, reusable := exchange(c, dialCtx, cn, setup, false)
	if ioErr == nil && !reusable {
		ioErr = errors.New("interrupted")
	}
	if ioErr != nil {
		_ = nc.Close()
		return nil, opError(dialCtx, n.addr, setup[0][0], ioErr)
	}
	if checkMode && replyErrs != nil && replyErrs[len(replyErrs)-1] != nil && firstError(replyErrs[:len(replyErrs)-1]) == nil {
		// INFO refused (an ACL without it, a service that renames it):
		// nothing known, nothing refused; later connections ask again.
		return cn, nil
	}
	if replyErr := firstError(replyErrs); replyErr != nil {
		_ = nc.Close()
		if _, _, _, redirected := parseRedirect(replyErr.Error()); redirected || strings.Contains(replyErr.Error(), "SELECT is not allowed in cluster mode") {
			return nil, refuse(c, clusterNodeError(c))
		}
		// Redis' AUTH errors (WRONGPASS, ERR AUTH <password> called without
		// any password configured) never contain the password.
		return nil, errors.New("resp: connection setup at " + n.addr + ": " + replyErr.Error())
	}
	if checkMode {
		if strings.Contains(values[len(values)-1].Str, "cluster_enabled:1") {
			_ = nc.Close()
			return nil, refuse(c, clusterNodeError(c))
		}
		c.mu.Lock()
		c.modeChecked = true
		c.mu.Unlock()
	}
	return cn, nil
}

// clusterNodeError refuses a single-server URL that names a cluster node:
// such a client would reach only the keys of that node's slots.
func clusterNodeError(c *Client) error {
	scheme := "redis"
	if c.ep.useTLS {
		scheme = "rediss"
	}
	return errors.New("resp: " + c.ep.addr + " is a Redis Cluster node (cluster_enabled:1), but the URL is " + scheme +
		"://, a single server's: use " + scheme + "+cluster://" + c.ep.addr + "[,host:port...]/ so that the client follows the cluster's slots")
}

// exchange writes cmds in one write, then reads one reply per command. It
// returns the first Redis error reply and, separately, a network or
// protocol error (after which cn must be closed), and whether cn may be
// reused.
func exchange(c *Client, ctx context.Context, cn *conn, cmds [][]string, blocking bool) ([]fleetstore.RedisValue, []error, error, bool) {
	// A cancelled context interrupts blocked I/O by moving the deadline
	// into the past; an expired one needs not (the I/O deadlines are no
	// later than its own), and must not: see awaitReply.
	var stop func() bool
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() {
			if ctx.Err() != context.DeadlineExceeded {
				_ = cn.nc.SetDeadline(time.Unix(1, 0))
			}
		})
	}
	values, replyErrs, ioErr := writeAndRead(c, ctx, cn, cmds, blocking)
	reusable := ioErr == nil
	if stop != nil && !stop() {
		// The interruption ran (or runs): whether or not the replies had
		// all arrived, the connection's deadline may have been moved.
		reusable = false
	}
	return values, replyErrs, ioErr, reusable
}

// writeAndRead returns the replies, each command's error reply (nil when
// there is none) and a network or protocol error.
func writeAndRead(c *Client, ctx context.Context, cn *conn, cmds [][]string, blocking bool) ([]fleetstore.RedisValue, []error, error) {
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
	values := make([]fleetstore.RedisValue, len(cmds))
	var replyErrs []error
	for i := range cmds {
		if err := awaitReply(ctx, cn); err != nil {
			return nil, nil, err
		}
		v, replyErr, ioErr := readReply(cn.r)
		if ioErr != nil {
			return nil, nil, ioErr
		}
		if replyErr != nil {
			if replyErrs == nil {
				replyErrs = make([]error, len(cmds))
			}
			replyErrs[i] = replyErr
		}
		values[i] = v
	}
	return values, replyErrs, nil
}

// lateReplyGrace is how long a reply whose deadline passed gets to be read
// when it may already have arrived (see awaitReply).
const lateReplyGrace = 10 * time.Millisecond

// awaitReply waits for the first byte of the next reply. When the read
// deadline passes first, Redis may have answered in time and this process
// been too busy to read it (a starved replica: a follower storm, a
// throttled CPU); one more look, lateReplyGrace long, takes a reply that
// is already there, so that Redis' answer counts rather than the replica's
// delay (a claim's answer says whether it landed; a timeout says nothing).
// A paused or unreachable Redis still times out, lateReplyGrace later; a
// caller that cancelled gets no second look.
func awaitReply(ctx context.Context, cn *conn) error {
	_, err := cn.r.Peek(1)
	if err == nil || ctx.Err() == context.Canceled {
		return err
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	if cn.nc.SetReadDeadline(time.Now().Add(lateReplyGrace)) != nil {
		return err
	}
	if _, late := cn.r.Peek(1); late != nil {
		return err
	}
	return nil
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
		at := xreadBlockArg(cmd)
		if at < 0 {
			return -1 // a list or sorted-set command, WAIT
		}
		ms, err := strconv.ParseInt(cmd[at], 10, 64)
		if err != nil || ms <= 0 {
			return -1
		}
		d := time.Duration(ms) * time.Millisecond
		if d > longest {
			longest = d
		}
	}
	return longest
}

// opError describes a failed operation by its name and the server's
// address (never its arguments or credentials). When ctx has ended, its
// cause is what is wrapped, so callers can test for
// context.DeadlineExceeded.
func opError(ctx context.Context, addr, op string, err error) error {
	if cause := context.Cause(ctx); cause != nil {
		return fmt.Errorf("resp: %s at %s: %w (%v)", op, addr, cause, err)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		// The I/O deadline was ctx's and passed a moment before ctx's own
		// timer marked it done.
		if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
			return fmt.Errorf("resp: %s at %s: %w (%v)", op, addr, context.DeadlineExceeded, err)
		}
		return fmt.Errorf("resp: %s at %s: timeout: %w", op, addr, err)
	}
	return fmt.Errorf("resp: %s at %s: %w", op, addr, err)
}
