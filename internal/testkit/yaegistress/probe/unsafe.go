package probe

import (
	"errors"
	"fmt"
	"time"
)

// The probes in this file reproduce bugs of Yaegi v0.16.1. Core and the
// plugin must not contain these constructs; see README.md for each root
// cause.

// SelectTwoChannels receives its own id from one of two channels with a
// select. Interpreted concurrently it returns other invocations' ids: Yaegi
// keeps one []reflect.SelectCase per select statement (built when the
// statement is compiled) and every running invocation overwrites its Chan
// fields before calling reflect.Select, so one invocation can wait on
// another's channels.
func SelectTwoChannels(id int) int {
	a := make(chan int, 1)
	b := make(chan int, 1)
	go func() { a <- id }()
	go func() { b <- id }()
	select {
	case v := <-a:
		return v
	case v := <-b:
		return v
	}
}

// selectTimerWait is the timer of SelectTimerAndResult. It is far longer
// than any correct call, so a call that took it is a hang, yet bounded, so
// a hung call does not leak its goroutine for ever.
const selectTimerWait = 20 * time.Second

// SelectTimerAndResult is the hedging shape: a select over an attempt's
// result and a timer. Interpreted concurrently, for the same reason as
// SelectTwoChannels, an invocation can take another's result (wrong answer)
// or end up waiting on channels that nobody will send to (a hang until the
// timer of the other invocation fires).
func SelectTimerAndResult(id int) int {
	res := make(chan int, 1)
	go func() { res <- id }()
	t := time.NewTimer(selectTimerWait)
	select {
	case v := <-res:
		return v
	case <-t.C:
		return -1
	}
}

// ReturnReceive returns a channel receive directly. Yaegi v0.16.1 panics
// even with one caller: "reflect.Value.Set using unaddressable value".
// Core receives into a variable first.
func ReturnReceive(id int) int {
	ch := make(chan int, 1)
	ch <- id
	return <-ch
}

// stamped is an attempt-like struct written by a multi-assignment.
type stamped struct {
	value *int
	at    time.Time
}

// nowFunc is called through an interface in core (Clock.Now); a function
// value reproduces the same call on the right-hand side.
var nowFunc = time.Now

// MultiAssignFieldsWithCall assigns two struct fields in one statement with
// a function call and a non-call expression on the right (core once had
// `a.resp, a.firstAt = resp, clock.Now()`). Yaegi v0.16.1 panics:
// "reflect: call of reflect.Value.Set on zero Value".
func MultiAssignFieldsWithCall(id int) int {
	s := &stamped{}
	v := id
	s.value, s.at = &v, nowFunc()
	if s.at.IsZero() {
		return -1
	}
	return *s.value
}

// one is a plain function call for MultiAssignMixedCall.
func one() int { return 1 }

// MultiAssignMixedCall is the silent form of the same bug: in `a, b = x,
// f()` (plain =, not :=) Yaegi v0.16.1 loses the value of every operand
// that is not a call, here leaving a at 0. When every operand is a call (or
// a conversion of one) it happens to work; core assigns one variable per
// statement instead of relying on that.
func MultiAssignMixedCall(id int) int {
	var a, b int
	a, b = id, one()
	if b != 1 {
		return -1
	}
	return a
}

// probeError is an error type defined by the interpreted code.
type probeError struct{ id int }

func (e *probeError) Error() string { return fmt.Sprintf("probe error %d", e.id) }

// ErrorsAsInterpretedType finds an interpreted error type in a chain with
// the compiled errors.As. Under Yaegi it panics ("errors: *target must be
// interface or implement error"): the compiled reflection cannot see the
// interpreted method set. Core uses type assertions instead.
func ErrorsAsInterpretedType(id int) int {
	err := fmt.Errorf("wrapped: %w", &probeError{id: id})
	var target *probeError
	if errors.As(err, &target) {
		return target.id
	}
	return -1
}

// RecoverValue recovers a panic(id) in a goroutine. Under Yaegi v0.16.1
// recover() returns the interpreter's reflect.Value instead of the value
// that was panicked, so the type assertion fails and the call returns 0.
// Core and the plugin never recover.
func RecoverValue(id int) int {
	out := make(chan int, 1)
	go func() {
		defer func() {
			r := recover()
			n, _ := r.(int)
			out <- n
		}()
		panic(id)
	}()
	v := <-out
	return v
}

// lenTable is read by ReturnLenSecond.
var lenTable = map[string]int{"a": 1}

// lenSecond returns a string and len() of a map: Yaegi v0.16.1 stores the
// len result into the first result's slot ("reflect: call of
// reflect.Value.SetInt on string Value"). Take len into a variable first.
func lenSecond() (string, int) {
	return "ok", len(lenTable)
}

// ReturnLenSecond calls lenSecond.
func ReturnLenSecond(id int) int {
	s, n := lenSecond()
	if s != "ok" || n != 1 {
		return -1
	}
	return id
}

// ClosuresInLoop starts goroutines from a func literal inside a loop, each
// capturing a per-iteration copy. Yaegi v0.16.1 stores the closure value in
// a slot of the creating frame and, when a closure returns, writes back into
// that slot the value it held when the closure was created
// (interp/run.go, getFunc: unlocked read at line 1890, write at 1922). A
// closure that finishes while the loop creates the next one races with it,
// and the race detector reports it; the next `go` statement can then start
// a stale closure. Start goroutines in loops with a named function and
// arguments (`go worker(i, ch)`), as core does with `go h.run(...)`.
func ClosuresInLoop(id int) int {
	ch := make(chan int, 8)
	for i := 0; i < 8; i++ {
		v := id*8 + i
		go func() { ch <- v }()
	}
	seen := 0
	for k := 0; k < 8; k++ {
		v := <-ch
		if v < id*8 || v >= id*8+8 || seen&(1<<(v-id*8)) != 0 {
			return -1
		}
		seen |= 1 << (v - id*8)
	}
	return id
}

// ticker is an interface defined by the interpreted code, like core's
// Clock and Timer.
type ticker interface{ Stop() bool }

// holder has an interface-typed field, like core.Options.Clock.
type holder struct {
	t ticker
}

// stopper0 is a struct type that implements ticker.
type stopper0 struct{ id int }

func (stopper0) Stop() bool { return true }

// CompositeToInterfaceField assigns a struct composite literal directly to
// an interface-typed struct field (core once had `opts.Clock =
// SystemClock{}`). Yaegi v0.16.1 panics: "reflect.Set: value of type
// interp.valueInterface is not assignable to type struct {...}". A variable
// of the interface type in between, an explicit conversion or &T{} work.
func CompositeToInterfaceField(id int) int {
	h := &holder{}
	h.t = stopper0{id: id}
	if !h.t.Stop() {
		return -1
	}
	return id
}

// newTicker returns a compiled value (a *time.Timer) directly as the
// interpreted interface ticker (core once had `return time.AfterFunc(d, f)`
// in SystemClock.AfterFunc).
func newTicker() ticker { return time.NewTimer(time.Hour) }

// InterfaceResultNilCompare compares such a result with nil (core's `if
// rc.timer != nil`). Yaegi v0.16.1 panics: "invalid memory address or nil
// pointer dereference"; calling its methods works. Assign the compiled
// value to a variable of the interface type before returning it.
func InterfaceResultNilCompare(id int) int {
	t := newTicker()
	if t != nil {
		t.Stop()
		return id
	}
	return -1
}

// kind is a typed enumeration like core's eventKind.
type kind int

const (
	kindA kind = iota + 1
	kindB
)

// TypedIotaConst compares a variable with a constant declared as `T = iota
// + 1` (implicitly repeated). Yaegi v0.16.1 finds them unequal, although
// both are 2 (a switch still matches). Core gives such constants explicit
// values; `kind(iota + 1)` also works.
func TypedIotaConst(id int) int {
	k := kind(2)
	if k != kindB || kindA != 1 {
		return -1
	}
	return id
}

// TaglessSwitchCaseList matches a tagless switch's case that lists two
// conditions, the second true. Yaegi v0.16.1 evaluates only the first
// condition of such a case list, so the case does not match. Core writes
// one condition per case, or joins them with ||.
func TaglessSwitchCaseList(id int) int {
	s := "second"
	switch {
	case s == "first", s == "second":
		return id
	}
	return -1
}
