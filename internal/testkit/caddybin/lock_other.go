//go:build !unix

package caddybin

// lockFile is a no-op where flock is missing: concurrent builds may then
// both compile, and the atomic rename still keeps the binary whole.
func lockFile(string) (unlock func(), err error) { return func() {}, nil }
