//go:build gc
// +build gc

// Compiled only: it is a test for the race detector, which Yaegi does not
// have, and its real upstreams would only slow make yaegi down.

package core

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// Primaries whose first token comes around the hedge delay, on a real
// clock and many at once: the routing must read only what the race loop
// owns of an attempt (under -race, reading attempt 0's first-event time
// at the hedge timer was a data race with the attempt's goroutine).
func TestRouteHedgeTimerRacesFirstToken(t *testing.T) {
	var n int64
	up := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		// 1.6ms to 2.4ms: the delay is 2ms.
		time.Sleep(time.Duration(1600+atomic.AddInt64(&n, 1)%800) * time.Microsecond)
		io.WriteString(w, tokenChunk("x")+"data: [DONE]\n\n")
	}
	a := httptest.NewServer(http.HandlerFunc(up))
	defer a.Close()
	b := httptest.NewServer(http.HandlerFunc(up))
	defer b.Close()
	cfg := config.Config{Primary: config.PrimaryFastest, Upstreams: []config.UpstreamConfig{{Name: "A", URL: a.URL}, {Name: "B", URL: b.URL}},
		Delay: config.DelayConfig{Fixed: config.Duration(2 * time.Millisecond)}, Budget: config.BudgetConfig{Ratio: -1}}
	h, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for c := 0; c < 8; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				rec := httptest.NewRecorder()
				h.Handle(rec, chatRequest(""))
				if rec.Code != 200 {
					t.Errorf("status %d, want 200", rec.Code)
					return
				}
			}
		}()
	}
	wg.Wait()
}
