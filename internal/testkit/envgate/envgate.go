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
