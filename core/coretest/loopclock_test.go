package coretest

import (
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/core/config"
)

// loopClock is one fleet's clock on which the test runs the fleet's sync
// loop by hand: the loop's timer (the one armed with the fleet's
// sync_interval) never fires by itself, and round runs its callback, one
// whole round of the loop as a tick of the real loop would, in the test's
// goroutine. Now and every other timer (lease renewals) are base's. Each
// fleet needs a loopClock of its own (over a shared base where replicas
// share a time).
type loopClock struct {
	base     core.Clock
	interval time.Duration // the fleet's sync_interval

	mu    sync.Mutex
	armed *loopTimer // the loop's pending timer (nil: not armed)
	clash bool       // a second timer of sync_interval was armed beside a pending one
}

// loopTimer is the loop's pending timer on a loopClock.
type loopTimer struct {
	c *loopClock
	f func()
}

// newLoopClock is a loopClock over base for a fleet of cfg (its
// sync_interval, defaults applied).
func newLoopClock(base core.Clock, cfg config.FleetConfig) *loopClock {
	return &loopClock{base: base, interval: time.Duration(cfg.WithDefaults().SyncInterval)}
}

func (c *loopClock) Now() time.Time { return c.base.Now() }

func (c *loopClock) AfterFunc(d time.Duration, f func()) core.Timer {
	if d != c.interval {
		return c.base.AfterFunc(d, f)
	}
	t := &loopTimer{c: c, f: f}
	c.mu.Lock()
	if c.armed != nil {
		c.clash = true
	}
	c.armed = t
	c.mu.Unlock()
	return t
}

// Stop forgets the timer if it is still pending.
func (t *loopTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.c.armed == t {
		t.c.armed = nil
		return true
	}
	return false
}

// round runs one round of the fleet's sync loop now (the callback the
// loop armed, which arms the next) and returns when it is done. It fails
// the test when the loop is not armed: no request attached a route to the
// fleet yet (the loop starts with a route's first request), or the fleet
// is closed.
func (c *loopClock) round(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	armed, clash := c.armed, c.clash
	c.armed = nil
	c.mu.Unlock()
	if clash {
		t.Fatalf("two timers of the sync interval %v were armed at once on a fleet's loopClock: another timer (a lease renewal?) has the loop's duration", c.interval)
	}
	if armed == nil {
		t.Fatalf("the fleet's sync loop is not armed (no timer of its sync interval %v): no request attached a route to the fleet yet, or the fleet is closed", c.interval)
	}
	armed.f()
}
