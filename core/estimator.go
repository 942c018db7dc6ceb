package core

import (
	"sort"
	"sync"
	"time"
)

// ttftEstimator keeps the last `window` TTFT samples of one upstream in a
// ring and answers a quantile of them. Memory is constant (one float64 per
// slot); the sorted copy is refreshed at most every refreshEvery samples so
// the per-request cost stays small.
type ttftEstimator struct {
	mu       sync.Mutex
	ring     []float64
	next     int
	count    int
	sorted   []float64
	stale    int
	quantile float64
	cached   time.Duration
}

const refreshEvery = 16

func newTTFTEstimator(window int, quantile float64) *ttftEstimator {
	return &ttftEstimator{
		ring:     make([]float64, window),
		sorted:   make([]float64, 0, window),
		quantile: quantile,
	}
}

// addSample records one sample. (Functions, not methods, on the
// per-request path: see handle.)
func addSample(e *ttftEstimator, d time.Duration) {
	e.mu.Lock()
	e.ring[e.next] = float64(d)
	e.next = (e.next + 1) % len(e.ring)
	if e.count < len(e.ring) {
		e.count++
	}
	e.stale++
	e.mu.Unlock()
}

// quantile returns the configured quantile and the number of samples behind it.
func quantile(e *ttftEstimator) (time.Duration, int) {
	e.mu.Lock()
	q := refreshQuantile(e)
	n := e.count
	e.mu.Unlock()
	return q, n
}

// refreshQuantile returns the cached quantile, recomputed when stale; e.mu
// is held.
func refreshQuantile(e *ttftEstimator) time.Duration {
	if e.count == 0 {
		return 0
	}
	if e.stale >= refreshEvery || len(e.sorted) == 0 || e.count < len(e.ring) && e.stale > 0 {
		e.sorted = append(e.sorted[:0], e.ring[:e.count]...)
		sort.Float64s(e.sorted)
		// nearest rank
		rank := int(e.quantile*float64(len(e.sorted))+0.999999999) - 1
		if rank < 0 {
			rank = 0
		}
		if rank >= len(e.sorted) {
			rank = len(e.sorted) - 1
		}
		e.cached = time.Duration(e.sorted[rank])
		e.stale = 0
	}
	return e.cached
}
