package resp

import (
	"bufio"
	"errors"
	"net"
	"sync"
	"time"
)

// conn is one connection to Redis. It is used by one caller at a time (the
// one that took it from the pool); it never points back at its pool.
type conn struct {
	nc    net.Conn
	r     *bufio.Reader
	wbuf  []byte    // reused write buffer
	watch chan bool // the idle watcher's verdict (see watchIdle)
}

// maxKeptWriteBuffer: a write buffer grown beyond this by a large command
// is not kept for the next one.
const maxKeptWriteBuffer = 64 << 10

// An idle connection is watched by a goroutine blocked in one Read: a
// server that closes it (a restart, its idle timeout, CLIENT KILL) ends the
// Read at once, and so does the caller that takes the connection, by moving
// the read deadline into the past. Redis sends nothing unasked (RESP2, no
// subscriptions), so any byte or error but that timeout means the
// connection is dead. (A Read under an already expired deadline would not
// reach the socket at all, and a short one costs a timer per command.)

// watchIdle reports on c.watch whether c was still open when its Read
// ended. A connection still idle when the Read ends (the server closed it,
// or it has been idle for the pool's idleTimeout) is taken out of the pool
// and closed here, so a restarted server's old connections go at once and
// a client nobody uses any more holds no connection.
func watchIdle(p *pool, c *conn) {
	var one [1]byte
	n, err := c.nc.Read(one[:])
	timedOut := false
	if n == 0 && err != nil {
		ne, isNet := err.(net.Error)
		timedOut = isNet && ne.Timeout()
	}
	removed := removeIdle(p, c)
	if removed {
		_ = c.nc.Close()
	}
	// Not removed and timed out: a caller took c and ended the Read.
	alive := timedOut && !removed
	c.watch <- alive
}

// removeIdle takes c out of the idle list if it is there (then its slot is
// freed for a waiter).
func removeIdle(p *pool, c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, other := range p.idle {
		if other != c {
			continue
		}
		copy(p.idle[i:], p.idle[i+1:])
		p.idle[len(p.idle)-1] = nil
		p.idle = p.idle[:len(p.idle)-1]
		p.open--
		if len(p.waiters) > 0 && !p.closed {
			p.open++
			p.dials++
			answerFirstWaiter(p, grant{slot: true})
		}
		return true
	}
	return false
}

// startWatch puts c under watch as it goes idle (called with p.mu held).
func startWatch(p *pool, c *conn) bool {
	if c.r.Buffered() > 0 {
		return false
	}
	var deadline time.Time // zero: none
	if p.idleTimeout > 0 {
		deadline = time.Now().Add(p.idleTimeout)
	}
	if err := c.nc.SetReadDeadline(deadline); err != nil {
		return false
	}
	if c.watch == nil {
		c.watch = make(chan bool, 1)
	}
	go watchIdle(p, c)
	return true
}

// stopWatch ends the watch of an idle connection taken for use and reports
// whether it is still open.
func stopWatch(c *conn) bool {
	if err := c.nc.SetReadDeadline(time.Unix(1, 0)); err != nil {
		_ = c.nc.Close()
	}
	alive := <-c.watch
	return alive
}

// grant is what a waiting caller receives: a connection, the right to dial
// one (slot), or an error (its context ended, the client closed).
type grant struct {
	c    *conn
	slot bool
	err  error
}

// waiter is a caller waiting for a connection. done is set, under the
// pool's lock, by whoever answers it first (a release or its abandonment);
// ch has room for that one answer, so no sender blocks.
type waiter struct {
	ch   chan grant
	done bool
}

// errClosed: the client was closed.
var errClosed = errors.New("resp: client closed")

// pool bounds and reuses connections. Every field is guarded by mu.
type pool struct {
	mu      sync.Mutex
	idle    []*conn // most recently used last
	open    int     // connections open or being dialed, idle included
	maxOpen int
	maxIdle int
	// idleTimeout closes a connection idle this long (0: never).
	idleTimeout time.Duration
	waiters     []*waiter // first come, first served
	closed      bool
	dials       uint64 // connections ever dialed
}

func newPool(maxOpen, maxIdle int, idleTimeout time.Duration) *pool {
	return &pool{maxOpen: maxOpen, maxIdle: maxIdle, idleTimeout: idleTimeout}
}

// take returns an idle connection, or slot true when the caller may dial a
// new one (the pool has counted it as open), or a waiter to wait on.
func takeConn(p *pool) (*conn, bool, *waiter, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, false, nil, errClosed
		}
		n := len(p.idle)
		if n > 0 {
			c := p.idle[n-1]
			p.idle[n-1] = nil
			p.idle = p.idle[:n-1]
			p.mu.Unlock()
			if stopWatch(c) {
				return c, false, nil, nil
			}
			_ = c.nc.Close()
			p.mu.Lock()
			p.open--
			p.mu.Unlock()
			continue
		}
		if p.open < p.maxOpen {
			p.open++
			p.dials++
			p.mu.Unlock()
			return nil, true, nil, nil
		}
		w := &waiter{ch: make(chan grant, 1)}
		p.waiters = append(p.waiters, w)
		p.mu.Unlock()
		return nil, false, w, nil
	}
}

// releaseConn returns c after use. A broken connection is closed and its
// slot handed to the first waiter (which then dials); a healthy one goes to
// the first waiter, or to the idle list, or is closed when the list is
// full. c nil with broken true gives back the slot of a failed dial.
func releaseConn(p *pool, c *conn, broken bool) {
	p.mu.Lock()
	if p.closed {
		broken = true
	}
	if broken {
		p.open--
		if len(p.waiters) > 0 && !p.closed {
			p.open++
			p.dials++
			answerFirstWaiter(p, grant{slot: true})
		}
		p.mu.Unlock()
		if c != nil {
			_ = c.nc.Close()
		}
		return
	}
	if len(p.waiters) > 0 {
		answerFirstWaiter(p, grant{c: c})
		p.mu.Unlock()
		return
	}
	if len(p.idle) < p.maxIdle {
		if startWatch(p, c) {
			p.idle = append(p.idle, c)
			p.mu.Unlock()
			return
		}
	}
	p.open--
	p.mu.Unlock()
	_ = c.nc.Close()
}

// answerFirstWaiter gives g to the longest waiting caller. Called with
// p.mu held and at least one waiter.
func answerFirstWaiter(p *pool, g grant) {
	w := p.waiters[0]
	p.waiters[0] = nil
	p.waiters = p.waiters[1:]
	w.done = true
	w.ch <- g
}

// abandonWait ends w's wait with err unless it has been answered already
// (then the answer stands and the caller takes it).
func abandonWait(p *pool, w *waiter, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if w.done {
		return
	}
	p.waiters = removeWaiter(p.waiters, w)
	w.done = true
	w.ch <- grant{err: err}
}

// removeWaiter returns list without w (in place, order kept).
func removeWaiter(list []*waiter, w *waiter) []*waiter {
	for i, other := range list {
		if other == w {
			copy(list[i:], list[i+1:])
			list[len(list)-1] = nil
			return list[:len(list)-1]
		}
	}
	return list
}

// closePool closes the idle connections and fails the waiters; connections
// in use are closed when they come back.
func closePool(p *pool) {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.open -= len(idle)
	p.closed = true
	for len(p.waiters) > 0 {
		answerFirstWaiter(p, grant{err: errClosed})
	}
	p.mu.Unlock()
	for _, c := range idle {
		_ = c.nc.Close()
	}
}

// poolStats reads the counters.
func poolStats(p *pool) (uint64, int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	dials := p.dials
	open := p.open
	idle := len(p.idle)
	return dials, open, idle
}

// poolWaiters counts the callers waiting for a connection.
func poolWaiters(p *pool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.waiters)
	return n
}
