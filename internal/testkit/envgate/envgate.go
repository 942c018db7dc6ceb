// Package envgate skips the long forms of tests (benchmarks, acceptance
// counts) unless their environment variable is set to 1.
package envgate

import (
	"os"
	"testing"
)

// Require skips t with the message skip unless the environment variable
// name is "1".
func Require(t testing.TB, name, skip string) {
	t.Helper()
	if os.Getenv(name) != "1" {
		t.Skip(skip)
	}
}

// Bench skips t unless LLMHEDGE_BENCH=1: the benchmarks through the real
// proxies, long and heavy on the machine.
func Bench(t testing.TB) {
	t.Helper()
	Require(t, "LLMHEDGE_BENCH", "benchmark: set LLMHEDGE_BENCH=1")
}

// FleetBench skips t unless LLMHEDGE_FLEET_BENCH=1: the fleet benchmarks
// through real proxies and a real Redis.
func FleetBench(t testing.TB) {
	t.Helper()
	Require(t, "LLMHEDGE_FLEET_BENCH", "fleet benchmark: set LLMHEDGE_FLEET_BENCH=1")
}
