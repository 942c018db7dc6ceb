package yaegistress

import (
	"os"
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
	for _, m := range modes {
		if msg := m.open(srv.URL(), maxOpen); msg != "" {
			t.Fatalf("%s: Open: %s", m.name, msg)
		}
		st := runProbe(m.roundtrip, workers, calls, 30*time.Second)
		dials := m.dials()
		t.Logf("resp %s, pooled (MaxOpen %d), %d goroutines: %d calls, %.0f commands/s, %d connections opened; %v",
			m.name, maxOpen, workers, st.calls, commandsPerSecond(st), dials, st)
		if st.bad() != 0 || st.calls != int64(calls) {
			t.Errorf("resp %s pooled: %v", m.name, st)
		}
		if dials > maxOpen {
			t.Errorf("resp %s pooled: %d connections opened, want ≤ MaxOpen %d", m.name, dials, maxOpen)
		}
		m.close()

		st = runProbe(m.perConn, workers, perConnectionCalls, 30*time.Second)
		t.Logf("resp %s, a new connection per call, %d goroutines: %d calls, %.0f commands/s, %d connections opened; %v",
			m.name, workers, st.calls, commandsPerSecond(st), st.calls, st)
		if st.bad() != 0 {
			t.Errorf("resp %s per connection: %v", m.name, st)
		}
	}
}

func commandsPerSecond(st *probeStats) float64 {
	if st.wall <= 0 {
		return 0
	}
	return float64(st.calls*respcheck.CommandsPerCall) / st.wall.Seconds()
}
