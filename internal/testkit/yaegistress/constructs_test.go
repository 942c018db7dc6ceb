package yaegistress

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/yaegistress/probe"
)

// safeProbes are the constructs core and the plugin use. Each is run from
// many goroutines at once, compiled and interpreted, and must never return
// another call's value, panic or hang.
var safeProbes = []struct {
	name     string
	compiled func(int) int
}{
	{"GoroutinePlainReceive", probe.GoroutinePlainReceive},
	{"EventChannel", probe.EventChannel},
	{"DeferPost", probe.DeferPost},
	{"StructFieldsOnePerStatement", probe.StructFieldsOnePerStatement},
	{"InterfaceTimer", probe.InterfaceTimer},
	{"TimerChannelReceive", probe.TimerChannelReceive},
	{"MutexMap", probe.MutexMap},
	{"Atomics", probe.Atomics},
	{"CondFollow", probe.CondFollow},
	{"ContextValues", probe.ContextValues},
	{"GoroutinesInLoop", probe.GoroutinesInLoop},
	{"JSONAndFormatting", probe.JSONAndFormatting},
	{"BufioLines", probe.BufioLines},
	{"HTTPStream", probe.HTTPStream},
}

// constructCalls is the number of calls per probe and mode; constructWorkers
// call at once.
const (
	constructCalls   = 2000
	constructWorkers = 20
	probeHangAfter   = 10 * time.Second
)

// streamIDs answers /?id=N with three flushed SSE events "data: N".
func streamIDs(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if _, err := strconv.Atoi(id); err != nil {
		http.Error(w, "bad id", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	for i := 0; i < 3; i++ {
		fmt.Fprintf(w, "data: %s\n\n", id)
		if rc.Flush() != nil {
			return
		}
	}
}

// TestSafeConstructsUnderConcurrentInterpretation runs every construct core
// relies on from 20 goroutines at once, compiled and under Yaegi, and
// requires every call to return its own id.
func TestSafeConstructsUnderConcurrentInterpretation(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: concurrent interpretation under load, ~20 s under -race")
	}
	srv := httptest.NewServer(http.HandlerFunc(streamIDs))
	defer srv.Close()

	i := newInterpreter(t, newGoPath(t), "internal/testkit/yaegistress/probe")
	evalAs[func(string)](t, i, "probe.SetBaseURL")(srv.URL)
	defer evalAs[func()](t, i, "probe.CloseIdle")()
	probe.SetBaseURL(srv.URL)
	defer probe.CloseIdle()

	for _, p := range safeProbes {
		t.Run(p.name, func(t *testing.T) {
			modes := []struct {
				mode string
				fn   func(int) int
			}{
				{"compiled", p.compiled},
				{"interpreted", evalAs[func(int) int](t, i, "probe."+p.name)},
			}
			for _, m := range modes {
				st := runProbe(m.fn, constructWorkers, constructCalls, probeHangAfter)
				t.Logf("%s %s: %v", p.name, m.mode, st)
				if st.bad() != 0 || st.calls != constructCalls {
					t.Errorf("%s %s: %v", p.name, m.mode, st)
				}
			}
		})
	}

	// The shared state the probes updated saw every call exactly once.
	wantSum := int64(constructCalls) * (constructCalls + 1) / 2
	interpMutexSum := evalAs[func() (int64, int)](t, i, "probe.MutexSum")
	for _, c := range []struct {
		mode     string
		mutexSum func() (int64, int)
		atomic   func() int64
	}{
		{"compiled", probe.MutexSum, probe.AtomicSum},
		{"interpreted", interpMutexSum, evalAs[func() int64](t, i, "probe.AtomicSum")},
	} {
		sum, left := c.mutexSum()
		if sum != wantSum || left != 0 {
			t.Errorf("%s MutexMap: sum %d, %d entries left; want %d, 0", c.mode, sum, left, wantSum)
		}
		if got := c.atomic(); got != wantSum {
			t.Errorf("%s Atomics: sum %d, want %d", c.mode, got, wantSum)
		}
	}
}
