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

// IncidentEnvOptions are the options of an adapter's TestBenchIncident:
// the CI form (a few hundred requests a run, one run per variant, the
// clients taking turns, one seed, numbers only logged) unless
// LLMHEDGE_BENCH=1, the long form (4,000 requests a run, each variant
// with each client and three seeds, the bounds checked).
// LLMHEDGE_INCIDENT_VARIANTS (e.g. "a,g") runs only those variants.
func IncidentEnvOptions() IncidentOptions {
	opts := IncidentOptions{CI: true, Variants: os.Getenv("LLMHEDGE_INCIDENT_VARIANTS")}
	if os.Getenv("LLMHEDGE_BENCH") == "1" {
		opts.CI = false
		opts.Check = true
	}
	return opts
}
