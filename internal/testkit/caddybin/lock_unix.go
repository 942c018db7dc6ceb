//go:build unix

package caddybin

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive flock on path (created if missing), blocking
// until it is free; the returned func releases it. build-caddy.sh and
// build-traefik.sh take the same kind of lock with flock(1).
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}
