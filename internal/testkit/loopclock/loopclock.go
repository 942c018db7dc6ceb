// Package loopclock gives tests a fleet clock on which they run the
// fleet's sync loop by hand.
package loopclock

import (
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/core/config"
)

// Clock is one fleet's clock (core.FleetOptions.Clock) on which the test
// runs the fleet's sync loop by hand: the loop's timer (the one armed with
// the fleet's sync_interval) never fires by itself, and Round runs its
// callback, one whole round of the loop as a tick of the real loop would,
// in the caller's goroutine. Now and every other timer (lease renewals,
// hedge delays) are base's. Each fleet needs a Clock of its own (over a
// shared base where replicas share a time).
type Clock struct {
	base     core.Clock
	interval time.Duration // the fleet's sync_interval

	mu    sync.Mutex
	armed *timer // the loop's pending timer (nil: not armed)
	clash bool   // a second timer of sync_interval was armed beside a pending one
}

// timer is the loop's pending timer on a Clock.
type timer struct {
	c *Clock
	f func()
}

// New is a Clock over base for a fleet of cfg (its sync_interval, defaults
// applied).
func New(base core.Clock, cfg config.FleetConfig) *Clock {
	return &Clock{base: base, interval: time.Duration(cfg.WithDefaults().SyncInterval)}
}

// Base is the clock this one runs over (for a hedger of the same
// replica, whose timers must fire).
func (c *Clock) Base() core.Clock { return c.base }

// Now is base's time.
func (c *Clock) Now() time.Time { return c.base.Now() }

// AfterFunc holds a timer of the sync interval for Round; others are
// base's.
func (c *Clock) AfterFunc(d time.Duration, f func()) core.Timer {
	if d != c.interval {
		return c.base.AfterFunc(d, f)
	}
	t := &timer{c: c, f: f}
	c.mu.Lock()
	if c.armed != nil {
		c.clash = true
	}
	c.armed = t
	c.mu.Unlock()
	return t
}

// Stop forgets the timer if it is still pending.
func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.c.armed == t {
		t.c.armed = nil
		return true
	}
	return false
}

// Round runs one round of the fleet's sync loop now (the callback the loop
// armed, which arms the next) and returns when it is done. It fails the
// test when the loop is not armed: no request attached a route to the
// fleet yet (the loop starts with a route's first request), or the fleet
// is closed; or when two timers of the sync interval were pending at once
// (another timer has the loop's duration: the test must choose another
// lease). Errorf and a return, not Fatalf: rigs call it from their
// clients' goroutines.
func (c *Clock) Round(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	armed, clash := c.armed, c.clash
	c.armed = nil
	c.mu.Unlock()
	if clash {
		t.Errorf("two timers of the sync interval %v were armed at once on a fleet's loop clock: another timer (a lease renewal?) has the loop's duration", c.interval)
		return
	}
	if armed == nil {
		t.Errorf("the fleet's sync loop is not armed (no timer of its sync interval %v): no request attached a route to the fleet yet, or the fleet is closed", c.interval)
		return
	}
	armed.f()
}
