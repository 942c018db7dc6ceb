package core

import "time"

// Clock is the time source of the engine. Tests inject a fake one; adapters
// use SystemClock.
type Clock interface {
	Now() time.Time
	// AfterFunc runs f in its own goroutine after d, like time.AfterFunc.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether it did.
	Stop() bool
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) Timer {
	// Through a typed local: under Yaegi v0.16.1 a compiled value returned
	// directly as an interpreted interface breaks later nil comparisons.
	var t Timer = time.AfterFunc(d, f)
	return t
}

// injectedNow reads a clock that is not the system's (tests), as h.now
// does then (see New): h.now is time.Now itself with the system clock, a
// compiled call, where under Yaegi a function of ours returning a
// time.Time cost four times as much, and a call through the Clock
// interface into interpreted code more.
func injectedNow(h *Hedger) time.Time { return h.opts.Clock.Now() }

// clockAfterFunc is h's clock's AfterFunc, the system clock's called
// directly for the same reason as h.now.
func clockAfterFunc(h *Hedger, d time.Duration, f func()) Timer {
	if h.systemClock {
		var t Timer = time.AfterFunc(d, f) // a typed local: see SystemClock.AfterFunc
		return t
	}
	t := h.opts.Clock.AfterFunc(d, f)
	return t
}
