// Package proc holds what the end-to-end tests of every adapter need
// around the processes they run (a real Caddy, a real Traefik, the ext_proc
// server): free loopback ports, an output buffer that is safe to share
// with a child process's writers, and the process's memory from /proc
// (its CPU time is lightload.ProcessCPU).
package proc

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
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
