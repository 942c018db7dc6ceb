// Package coretest holds the core's tests that need more than the standard
// library or real sockets: the reference-workload benchmark, the
// goroutine-leak check under injected faults. They live outside package core
// so that `yaegi test ./core` (which cannot load third-party test
// dependencies) stays meaningful.
package coretest
