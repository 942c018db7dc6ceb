package core

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gatedClock is a fakeClock whose Now can be held: while gated, every Now
// call posts a release channel to calls and waits until the test closes
// it. A request of a Hedger on this clock then stops at a known point.
type gatedClock struct {
	fake  *fakeClock
	mu    sync.Mutex
	gated bool
	calls chan chan struct{}
}

func newGatedClock() *gatedClock {
	return &gatedClock{fake: newFakeClock(), calls: make(chan chan struct{}, 16)}
}

func (g *gatedClock) Now() time.Time {
	g.mu.Lock()
	gated := g.gated
	g.mu.Unlock()
	if gated {
		release := make(chan struct{})
		g.calls <- release
		<-release
	}
	return g.fake.Now()
}

func (g *gatedClock) AfterFunc(d time.Duration, f func()) Timer {
	t := g.fake.AfterFunc(d, f)
	return t
}

func (g *gatedClock) setGated(on bool) {
	g.mu.Lock()
	g.gated = on
	g.mu.Unlock()
}

// held returns the release channel of the next Now call that waits.
func (g *gatedClock) held() chan struct{} {
	release := <-g.calls // (yaegi v0.16.1 panics on `return <-ch`)
	return release
}

// serveOn runs one request on h in the background.
func serveOn(h *Hedger, r *http.Request) chan served {
	out := make(chan served, 1)
	go func() {
		rec := httptest.NewRecorder()
		err := h.Handle(rec, r)
		out <- served{rec, err}
	}()
	return out
}

// max_concurrent_hedges is checked and taken in one step: a hedge that
// passed the check holds its slot before it starts, so another request's
// hedge in that moment is denied. Two Hedgers share one State (one cap),
// each with its own clock and transport, so the test knows whose request
// it holds.
func TestMaxConcurrentHedgesCheckAndTakeAtOnce(t *testing.T) {
	cfg := testConfig()
	cfg.Budget.MaxConcurrentHedges = 1
	state := NewState(cfg, nil)
	clock1, clock2 := newGatedClock(), newGatedClock()
	tr1, tr2 := newScriptTransport(), newScriptTransport()
	reports := make(chan *Report, 4)
	observer := ObserverFunc(func(r *Report) { reports <- r })
	h1, err := New(cfg, Options{Transport: tr1, Clock: clock1, Observer: observer, State: state})
	if err != nil {
		t.Fatal(err)
	}
	h2, err := New(cfg, Options{Transport: tr2, Clock: clock2, Observer: observer, State: state})
	if err != nil {
		t.Fatal(err)
	}

	out1 := serveOn(h1, chatRequest(""))
	primary1 := tr1.next(t)
	clock1.fake.waitArmed(t, 1)
	req2 := chatRequest("")
	out2 := serveOn(h2, req2)
	primary2 := tr2.next(t)
	clock2.fake.waitArmed(t, 1)

	// Request 1's hedge timer fires; its hedge passes every check and is
	// held where launch reads the clock, just before the attempt exists.
	clock1.setGated(true)
	clock1.fake.Advance(100 * time.Millisecond)
	close(clock1.held()) // tryLaunch reads the clock
	inLaunch := clock1.held()
	clock1.setGated(false)

	// Request 2's hedge timer fires now, then its primary fails. Exactly
	// one more attempt of request 2 reaches its upstream either way: the
	// hedge if it was let through, else the retry after the failure.
	clock2.fake.Advance(100 * time.Millisecond)
	primary2.respond(500, "application/json")
	primary2.end()
	second2 := tr2.next(t)

	close(inLaunch)
	hedge1 := tr1.next(t)
	if n := h1.HedgesInFlight(); n != 1 {
		t.Errorf("hedges in flight = %d with max_concurrent_hedges 1, want 1", n)
	}

	primary1.respond(200, "text/event-stream")
	primary1.write(tokenChunk("a"))
	primary1.end()
	hedge1.waitCancelled()
	<-out1
	second2.respond(200, "text/event-stream")
	second2.write(tokenChunk("b"))
	second2.end()
	<-out2
	for i := 0; i < 2; i++ {
		rep := <-reports
		if rep.Request != req2 {
			continue
		}
		if len(rep.Denials) == 0 {
			t.Errorf("request 2: len(rep.Denials) = 0, want != 0")
		} else if rep.Denials[0] != DenyConcurrency {
			t.Errorf("request 2: rep.Denials[0] = %v, want %v", rep.Denials[0], DenyConcurrency)
		}
	}
	if n := h1.HedgesInFlight(); n != 0 {
		t.Errorf("hedges in flight after both requests = %d, want 0", n)
	}
}

// slotWorker takes and releases hedge slots, recording the most held at once.
func slotWorker(st *State, limit int, rounds int, holding, most *int64, wg *sync.WaitGroup) {
	for i := 0; i < rounds; i++ {
		if !takeHedgeSlot(st, limit) {
			continue
		}
		n := atomic.AddInt64(holding, 1)
		for {
			seen := atomic.LoadInt64(most)
			if n <= seen || atomic.CompareAndSwapInt64(most, seen, n) {
				break
			}
		}
		atomic.AddInt64(holding, -1)
		releaseHedgeSlot(st)
	}
	wg.Done()
}

// Many goroutines racing for hedge slots never hold more than the cap,
// and every slot taken is given back.
func TestHedgeSlotsNeverExceedCap(t *testing.T) {
	st := NewState(testConfig(), newFakeClock())
	var holding, most int64
	var wg sync.WaitGroup
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go slotWorker(st, 1, 200, &holding, &most, &wg)
	}
	wg.Wait()
	if most != 1 {
		t.Errorf("most hedge slots held at once = %d with a cap of 1, want 1", most)
	}
	if n := atomic.LoadInt64(&st.hedgesInFlight); n != 0 {
		t.Errorf("hedge slots held after every release = %d, want 0", n)
	}
	// No cap: every take succeeds, and is still counted.
	if !takeHedgeSlot(st, -1) {
		t.Errorf("uncapped take: hedges in flight = %d, want 1", atomic.LoadInt64(&st.hedgesInFlight))
	} else if atomic.LoadInt64(&st.hedgesInFlight) != 1 {
		t.Errorf("uncapped take: atomic.LoadInt64(&st.hedgesInFlight) = %v, want 1", atomic.LoadInt64(&st.hedgesInFlight))
	}
	releaseHedgeSlot(st)
}
