// Package stats summarizes latency samples (nearest-rank quantiles) and
// draws their distributions as SVG charts. llmhedge-tune reports with it,
// and the test kit and the demo share it, so the binary needs nothing from
// the test kit. Standard library only.
package stats

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Summary is the report of a set of durations.
type Summary struct {
	N                  int
	P50, P95, P99, Max time.Duration
}

// String formats s as "n=… p50=… p95=… p99=… max=…".
func (s Summary) String() string {
	return fmt.Sprintf("n=%d p50=%v p95=%v p99=%v max=%v", s.N, s.P50, s.P95, s.P99, s.Max)
}

// Summarize returns the count, nearest-rank p50/p95/p99 (see Quantile) and
// maximum of ds. ds is not modified. An empty ds gives a zero Summary.
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	s := sortedCopy(ds)
	n := len(s)
	return Summary{
		N:   n,
		P50: s[rankIndex(n, 0.50)],
		P95: s[rankIndex(n, 0.95)],
		P99: s[rankIndex(n, 0.99)],
		Max: s[n-1],
	}
}

// Quantile returns the nearest-rank q-quantile of ds: the smallest value v
// such that at least a fraction q of ds is <= v, i.e. the element of rank
// ceil(q*N) (1-based) in sorted order. q <= 0 gives the minimum, q >= 1 the
// maximum, an empty ds zero. ds is not modified.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return QuantileSorted(sortedCopy(ds), q)
}

// QuantileSorted is Quantile of an already sorted, non-empty s, for a
// caller that keeps a large sorted sample and asks it many quantiles.
func QuantileSorted(s []time.Duration, q float64) time.Duration {
	return s[rankIndex(len(s), q)]
}

// Successful returns the durations of the requests that succeeded: a
// failed request is recorded as 0 or less.
func Successful(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, 0, len(ds))
	for _, d := range ds {
		if d > 0 {
			out = append(out, d)
		}
	}
	return out
}

// rankIndex is the 0-based index of the nearest-rank q-quantile among n
// sorted values.
func rankIndex(n int, q float64) int {
	// The small epsilon keeps e.g. 0.95*100 = 95.00000000000001 at rank 95.
	r := int(math.Ceil(q*float64(n)-1e-9)) - 1
	if r < 0 {
		return 0
	}
	if r >= n {
		return n - 1
	}
	return r
}

func sortedCopy(ds []time.Duration) []time.Duration {
	s := make([]time.Duration, len(ds))
	copy(s, ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s
}
