// Package proc holds what the end-to-end tests of every adapter need
// around the processes they run (a real Caddy, a real Traefik, the ext_proc
// server): free loopback ports, an output buffer that is safe to share
// with a child process's writers, and the process's memory from /proc
// (its CPU time is lightload.ProcessCPU).
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// FreePort is PickPort for a test: it fails t on an error.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := PickPort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// PickPort returns a loopback port that was free a moment ago and that no
// earlier call in this process returned: the kernel may hand out a port
// again as soon as it is closed, and two sites of one test on the same
// port do not start.
func PickPort() (int, error) {
	for try := 0; try < 100; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		portsMu.Lock()
		fresh := !portsGiven[port]
		portsGiven[port] = true
		portsMu.Unlock()
		if fresh {
			return port, nil
		}
	}
	return 0, errors.New("PickPort: the kernel returned only ports already handed out, 100 times")
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// Buffer collects output written from several goroutines (a process's
// stdout and stderr, a logger).
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Tail is the last n bytes of s, for failure messages that quote a
// process's output.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// RSS returns the resident set size of process pid in bytes, from
// /proc/<pid>/status.
func RSS(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d", &kb); err != nil {
				return 0, fmt.Errorf("VmRSS %q: %v", rest, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmRSS", pid)
}

// Stop asks process p to shut down with SIGTERM and kills it if exited is
// not closed within timeout. It returns once the process has exited, and
// whether it stopped by itself (a process that had already exited did).
func Stop(p *os.Process, exited <-chan struct{}, timeout time.Duration) bool {
	select {
	case <-exited:
		return true
	default:
	}
	p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return true
	case <-time.After(timeout):
		p.Kill()
		<-exited
		return false
	}
}

// WriteFile writes b to path, creating its folder.
func WriteFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// SkipShort skips t under -short (`make unit`): that lane starts no
// process outside the test binary, what names the one t would start.
func SkipShort(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: starts " + what)
	}
}

// ReadyTimeout bounds the wait for a process under test to say it is
// ready. Generous on purpose: a ready process ends the wait at once, so the
// bound only decides how long a broken start takes to fail, and Traefik
// interpreting the plugin under -race on a busy 2-core machine has taken
// over a minute.
const ReadyTimeout = 180 * time.Second

// LogLines is how many of a process's last output lines a not-ready
// failure quotes.
const LogLines = 20

// LastLines is the last n lines of s (all of s when it has fewer).
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// NotReadyError describes a process that never said it was ready: the
// command, why the wait ended, and the last LogLines lines of its output.
func NotReadyError(args []string, cause error, output string) error {
	return fmt.Errorf("%s: not ready: %v\nlast %d lines of its output:\n%s",
		strings.Join(args, " "), cause, LogLines, LastLines(output, LogLines))
}

// WaitReady polls ready until it returns nil (the process's own signal: a
// port that answers, a health check, a log line), the process exits
// (exited is closed) or ReadyTimeout passes. The error quotes the command
// args and the last lines of output().
func WaitReady(args []string, exited <-chan struct{}, output func() string, ready func() error) error {
	deadline := time.Now().Add(ReadyTimeout)
	tick := time.NewTicker(20 * time.Millisecond) // polling interval, bounded by deadline
	defer tick.Stop()
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return NotReadyError(args, fmt.Errorf("exited during start-up (last check: %v)", err), output())
		default:
		}
		if time.Now().After(deadline) {
			return NotReadyError(args, fmt.Errorf("no ready signal within %v (last check: %v)", ReadyTimeout, err), output())
		}
		select {
		case <-exited:
		case <-tick.C:
		}
	}
}

// HTTPReady is a WaitReady check: url answers 200 (a health endpoint, an
// admin API, a route that exists once the configuration is loaded).
func HTTPReady(url string) func() error {
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		req.Close = true // a process restarted on the same port gets a fresh connection
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

// PortReady is a WaitReady check: addr accepts TCP connections.
func PortReady(addr string) func() error {
	return func() error {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		return conn.Close()
	}
}

// AllReady is a WaitReady check that passes once every check does, e.g.
// an admin API and each port of a proxy.
func AllReady(checks ...func() error) func() error {
	return func() error {
		for _, check := range checks {
			if err := check(); err != nil {
				return err
			}
		}
		return nil
	}
}

// RunBuildScript runs a build script of the repository (bash script, in
// dir) that prints the built binary's path as its last line, and returns
// that path; the error carries the script's stderr.
func RunBuildScript(dir, script string) (string, error) {
	cmd := exec.Command("bash", script)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %v\n%s", filepath.Base(script), err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1]), nil
}
