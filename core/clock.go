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

// clockNow reads h's clock. The system clock is read directly: under Yaegi
// a call through the Clock interface into interpreted code costs several
// times a call to time.Now, and a request reads the clock about six times.
func clockNow(h *Hedger) time.Time {
	if h.systemClock {
		return time.Now()
	}
	return injectedNow(h)
}

// injectedNow reads a clock that is not the system's (tests). Its own
// function: the selectors it takes would be frame slots of every clockNow.
func injectedNow(h *Hedger) time.Time { return h.opts.Clock.Now() }

// clockAfterFunc is h's clock's AfterFunc, the system clock's called
// directly for the same reason as clockNow.
func clockAfterFunc(h *Hedger, d time.Duration, f func()) Timer {
	if h.systemClock {
		var t Timer = time.AfterFunc(d, f) // a typed local: see SystemClock.AfterFunc
		return t
	}
	t := h.opts.Clock.AfterFunc(d, f)
	return t
}
