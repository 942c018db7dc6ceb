package regimeload

import "os"

// EnvOptions are the options of an adapter's TestBenchRegimeShift: a few
// hundred requests a route that are only logged in CI, the full count with
// the bounds checked under LLMHEDGE_BENCH=1. p99Bound and calmBound 0 keep
// the defaults.
func EnvOptions(p99Bound, calmBound float64) Options {
	if os.Getenv("LLMHEDGE_BENCH") == "1" {
		return Options{P99Bound: p99Bound, CalmBound: calmBound, Check: true}
	}
	return Options{N: 200, P99Bound: p99Bound, CalmBound: calmBound}
}
