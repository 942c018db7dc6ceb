package yaegistress

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// probeStats counts what went wrong in a probe run.
type probeStats struct {
	calls, wrong, panics, hangs int64
	example                     string // the first failure, for the log
	wall                        time.Duration
	slowest                     time.Duration // the longest call that returned
}

func (s *probeStats) String() string {
	return fmt.Sprintf("calls=%d wrong=%d panics=%d hangs=%d wall=%v slowest call=%v first failure: %s",
		s.calls, s.wrong, s.panics, s.hangs, s.wall.Round(time.Millisecond), s.slowest.Round(time.Millisecond), s.example)
}

func (s *probeStats) bad() int64 { return s.wrong + s.panics + s.hangs }

// runProbe calls fn(id) with ids 1..calls from `workers` goroutines at
// once. A call that returns anything but its id is wrong; one that has not
// returned after hangAfter is a hang (its goroutine is left behind: only
// the known-bad probes ever hang).
func runProbe(fn func(int) int, workers, calls int, hangAfter time.Duration) *probeStats {
	st := &probeStats{}
	var mu sync.Mutex
	note := func(counter *int64, msg string) {
		mu.Lock()
		defer mu.Unlock()
		*counter++
		if st.example == "" {
			st.example = msg
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			timer := time.NewTimer(hangAfter)
			defer timer.Stop()
			for {
				id := int(next.Add(1))
				if id > calls {
					return
				}
				type result struct {
					v      int
					panicV any
				}
				done := make(chan result, 1)
				go func() {
					var r result
					defer func() {
						r.panicV = recover()
						done <- r
					}()
					r.v = fn(id)
				}()
				timer.Reset(hangAfter)
				began := time.Now()
				select {
				case r := <-done:
					if !timer.Stop() {
						<-timer.C
					}
					took := time.Since(began)
					mu.Lock()
					st.slowest = max(st.slowest, took)
					mu.Unlock()
					switch {
					case r.panicV != nil:
						note(&st.panics, fmt.Sprintf("call %d panicked: %v", id, r.panicV))
					case r.v != id:
						note(&st.wrong, fmt.Sprintf("call %d returned %d", id, r.v))
					}
				case <-timer.C:
					note(&st.hangs, fmt.Sprintf("call %d did not return within %v", id, hangAfter))
				}
				atomic.AddInt64(&st.calls, 1)
			}
		}()
	}
	wg.Wait()
	st.wall = time.Since(start)
	return st
}
