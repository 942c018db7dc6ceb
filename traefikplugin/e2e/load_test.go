package e2e

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
)

// loadResult is the outcome of a batch of streaming requests.
type loadResult struct {
	n         int
	whole     int // complete answers from one upstream
	truncated int // a 200 stream that ended before its answer was complete
	failed    int // no stream at all (an error status or a connection error)
	errors    map[string]int
	ttfts     []time.Duration
	totals    []time.Duration
	byID      map[string]streamed
	elapsed   time.Duration
}

// runLoad sends n streaming requests with ids prefix0..prefix(n-1) through
// c, concurrency at a time, and classifies every answer.
func runLoad(ctx context.Context, c openai.Client, n, concurrency int, prefix string, tokens int) loadResult {
	res := loadResult{n: n, errors: map[string]int{}, byID: map[string]streamed{}}
	var mu sync.Mutex
	next := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				id := fmt.Sprintf("%s%d", prefix, i)
				r := streamChat(ctx, c, id, "", nil)
				mu.Lock()
				res.byID[id] = r
				switch _, ok := r.whole(id, tokens); {
				case ok:
					res.whole++
					res.ttfts = append(res.ttfts, r.ttft)
					res.totals = append(res.totals, r.total)
				case r.header != nil && len(r.ids) > 0:
					res.truncated++
					res.errors[errText(r.err)]++
				default:
					res.failed++
					res.errors[errText(r.err)]++
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

// add accumulates r into acc (nil: a new total) and returns it.
func (acc *loadResult) add(r loadResult) *loadResult {
	if acc == nil {
		acc = &loadResult{errors: map[string]int{}, byID: map[string]streamed{}}
	}
	acc.n += r.n
	acc.whole += r.whole
	acc.truncated += r.truncated
	acc.failed += r.failed
	for k, c := range r.errors {
		acc.errors[k] += c
	}
	acc.ttfts = append(acc.ttfts, r.ttfts...)
	acc.totals = append(acc.totals, r.totals...)
	acc.elapsed += r.elapsed
	return acc
}

func errText(err error) string {
	if err == nil {
		return "ended early without an error"
	}
	s := err.Error()
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

func (r loadResult) String() string {
	return fmt.Sprintf("%d requests: %d whole, %d truncated (%.2f%%), %d failed; errors %v",
		r.n, r.whole, r.truncated, 100*float64(r.truncated)/float64(r.n), r.failed, r.errors)
}
