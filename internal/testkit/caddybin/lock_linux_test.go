//go:build linux

package caddybin

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/proc"
)

// TestBuildScriptsWaitForTheBuildLock: while this process holds a build
// lock, build-caddy.sh and build-traefik.sh must wait for it rather than
// compile, then find the binary the lock holder left. Their go is a stub
// that fails on anything but `go env`, so a script that skipped the lock
// fails.
func TestBuildScriptsWaitForTheBuildLock(t *testing.T) {
	proc.SkipShort(t, "build-caddy.sh and build-traefik.sh")
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("flock(1) not installed")
	}
	if _, err := os.Stat("/proc/locks"); err != nil {
		t.Skip("no /proc/locks to see the script waiting")
	}
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	hash, err := SourceHash(root)
	if err != nil {
		t.Fatal(err)
	}
	realGo, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	stubs := t.TempDir()
	stub := "#!/bin/sh\nif [ \"$1\" = env ]; then exec " + realGo + " \"$@\"; fi\necho \"stub go: $*\" >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(stubs, "go"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ script, bin string }{
		{"examples/caddy/build-caddy.sh", "caddy-" + hash + "/caddy"},
		{"examples/traefik/build-traefik.sh", "traefik-v0.0.0-locktest/traefik"},
	} {
		t.Run(filepath.Base(c.script), func(t *testing.T) {
			cache := t.TempDir()
			bin := filepath.Join(cache, filepath.FromSlash(c.bin))
			if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
				t.Fatal(err)
			}
			unlock, err := lockFile(bin + ".lock")
			if err != nil {
				t.Fatal(err)
			}
			defer unlock()
			cmd := exec.Command(filepath.Join(root, filepath.FromSlash(c.script)))
			cmd.Env = append(os.Environ(), "LLMHEDGE_CACHE="+cache, "TRAEFIK_VERSION=v0.0.0-locktest",
				"PATH="+stubs+string(os.PathListSeparator)+os.Getenv("PATH"))
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			if err := waitForLockWaiter(bin+".lock", done); err != nil {
				t.Fatalf("%s never waited on the build lock: %v\nstderr: %s", c.script, err, stderr.String())
			}
			if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			unlock()
			if err := <-done; err != nil {
				t.Fatalf("%s after the lock was released: %v\nstderr: %s", c.script, err, stderr.String())
			}
			if got := strings.TrimSpace(stdout.String()); got != bin {
				t.Fatalf("%s printed %q, want the binary the lock holder left, %q", c.script, got, bin)
			}
		})
	}
}

// waitForLockWaiter polls /proc/locks until a process is blocked on the
// flock of path ("->" lines list waiters), or the script exits, or 20s pass.
func waitForLockWaiter(path string, exited <-chan error) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	ino := ":" + strconv.FormatUint(info.Sys().(*syscall.Stat_t).Ino, 10) + " "
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("the script exited first: %v", err)
		default:
		}
		locks, err := os.ReadFile("/proc/locks")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(locks), "\n") {
			if strings.Contains(line, "->") && strings.Contains(line, ino) {
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("no waiter on the lock after 20s")
}
