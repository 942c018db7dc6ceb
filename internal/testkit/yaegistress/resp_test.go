package yaegistress

import (
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
	"github.com/llmhedge/llmhedge/internal/testkit/yaegistress/respcheck"
)

// TestRespUnderConcurrentInterpretation runs the Traefik plugin's Redis
// client (package resp) interpreted as Traefik loads it, from 50 goroutines
// at once against a real redis-server: every call must get its own replies
// (Yaegi has returned one concurrent call's values to another), and the
// pool must keep the connections to MaxOpen. It logs commands/s and
// connections opened, compiled and interpreted, and for comparison with a
// new connection per call (the CrowdSec bouncer plugin's way).
// LLMHEDGE_STRESS=full runs ten times as many calls.
//
// The client has no timeouts of its own (respcheck's options): on a
// starved machine a call is slow, not failed, so that a failed call is a
// defect and wrong replies are never hidden among timeouts.
func TestRespUnderConcurrentInterpretation(t *testing.T) {
	const workers = 50
	const maxOpen = 16
	calls := 4000
	perConnectionCalls := 1000
	if os.Getenv("LLMHEDGE_STRESS") == "full" {
		calls = 40000
		perConnectionCalls = 10000
	}
	srv := redisproc.Start(t, redisproc.Options{})
	i := newInterpreter(t, newGoPath(t), "internal/testkit/yaegistress/respcheck")

	type mode struct {
		name      string
		open      func(string, int) string
		close     func()
		dials     func() int
		roundtrip func(int) int
		perConn   func(int) int
	}
	modes := []mode{
		{"compiled", respcheck.Open, respcheck.Close, respcheck.Dials, respcheck.Roundtrip, respcheck.RoundtripNewConnection},
		{"interpreted",
			evalAs[func(string, int) string](t, i, "respcheck.Open"),
			evalAs[func()](t, i, "respcheck.Close"),
			evalAs[func() int](t, i, "respcheck.Dials"),
			evalAs[func(int) int](t, i, "respcheck.Roundtrip"),
			evalAs[func(int) int](t, i, "respcheck.RoundtripNewConnection")},
	}
	var failedCalls atomic.Int64
	// counted takes failed calls out of runProbe's wrong answers: they
	// are counted apart, with respcheck.FirstError to name one.
	counted := func(fn func(int) int) func(int) int {
		return func(id int) int {
			v := fn(id)
			if v == respcheck.Failed {
				failedCalls.Add(1)
				return id
			}
			return v
		}
	}
	checkFailed := func(name, how string) {
		if n := failedCalls.Swap(0); n != 0 {
			t.Errorf("resp %s %s: %d calls failed with an error, want 0; first: %s", name, how, n, respcheck.FirstError())
		}
	}
	for _, m := range modes {
		if msg := m.open(srv.URL(), maxOpen); msg != "" {
			t.Fatalf("%s: Open: %s", m.name, msg)
		}
		st := runProbe(counted(m.roundtrip), workers, calls, respHangAfter)
		dials := m.dials()
		t.Logf("resp %s, pooled (MaxOpen %d), %d goroutines: %d calls, %.0f commands/s, %d connections opened; %v",
			m.name, maxOpen, workers, st.calls, commandsPerSecond(st), dials, st)
		if st.bad() != 0 || st.calls != int64(calls) {
			t.Errorf("resp %s pooled: %v", m.name, st)
		}
		checkFailed(m.name, "pooled")
		if dials > maxOpen {
			t.Errorf("resp %s pooled: %d connections opened, want ≤ MaxOpen %d", m.name, dials, maxOpen)
		}
		m.close()

		st = runProbe(counted(m.perConn), workers, perConnectionCalls, respHangAfter)
		t.Logf("resp %s, a new connection per call, %d goroutines: %d calls, %.0f commands/s, %d connections opened; %v",
			m.name, workers, st.calls, commandsPerSecond(st), st.calls, st)
		if st.bad() != 0 {
			t.Errorf("resp %s per connection: %v", m.name, st)
		}
		checkFailed(m.name, "per connection")
	}
}

// respHangAfter is the hang guard of one call: far above the slowest call
// seen with both cores busy (a few seconds, interpreted), as the client
// has no timeout of its own.
const respHangAfter = 2 * time.Minute

func commandsPerSecond(st *probeStats) float64 {
	if st.wall <= 0 {
		return 0
	}
	return float64(st.calls*respcheck.CommandsPerCall) / st.wall.Seconds()
}
