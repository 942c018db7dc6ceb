package proc

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRSSOfThisProcess(t *testing.T) {
	rss, err := RSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if rss < 1<<20 {
		t.Fatalf("RSS = %d bytes, want at least 1 MiB", rss)
	}
}

func TestBufferConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				b.Write([]byte("x"))
			}
		}()
	}
	wg.Wait()
	if n := len(b.String()); n != 400 {
		t.Fatalf("len(String()) = %d, want 400", n)
	}
	if got := Tail(strings.Repeat("ab", 3), 3); got != "bab" {
		t.Fatalf("Tail = %q, want %q", got, "bab")
	}
}

func TestFreePortIsPositive(t *testing.T) {
	if p := FreePort(t); p <= 0 {
		t.Fatalf("FreePort = %d, want > 0", p)
	}
}

// sleep ends on SIGTERM: Stop reports that it stopped by itself.
func TestStopEndsAProcessOnSIGTERM(t *testing.T) {
	SkipShort(t, "sleep(1)")
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	if !Stop(cmd.Process, exited, 10*time.Second) {
		t.Fatal("Stop = false, want true: sleep ends on SIGTERM")
	}
	if !Stop(cmd.Process, exited, time.Second) {
		t.Fatal("Stop of an exited process = false, want true")
	}
}

// FreePort never returns a port twice in one process.
func TestFreePortNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for i := 0; i < 500; i++ {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("FreePort returned port %d twice (call %d)", p, i+1)
		}
		seen[p] = true
	}
}

// WaitReady returns as soon as the check passes.
func TestWaitReadyReturnsOnTheSignal(t *testing.T) {
	checks := 0
	err := WaitReady([]string{"server"}, nil, func() string { return "" }, func() error {
		checks++
		if checks < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || checks != 3 {
		t.Fatalf("WaitReady = %v after %d checks, want nil after 3", err, checks)
	}
}

// A process that exits before it is ready: the error names the command
// and quotes the last LogLines lines of its output, not more.
func TestWaitReadyQuotesTheCommandAndLastLines(t *testing.T) {
	var out strings.Builder
	for i := 1; i <= 30; i++ {
		fmt.Fprintf(&out, "line %d\n", i)
	}
	exited := make(chan struct{})
	close(exited)
	err := WaitReady([]string{"server", "--port", "1"}, exited, out.String, func() error { return errors.New("refused") })
	if err == nil {
		t.Fatal("WaitReady = nil for a process that exited")
	}
	msg := err.Error()
	for _, want := range []string{"server --port 1", "exited", "refused", "line 11\n", "line 30"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "line 10\n") {
		t.Errorf("error quotes more than the last %d lines:\n%s", LogLines, msg)
	}
}

// HTTPReady passes on 200 only; AllReady needs every check.
func TestHTTPReadyAndAllReady(t *testing.T) {
	status := http.StatusServiceUnavailable
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }))
	defer srv.Close()
	check := AllReady(PortReady(srv.Listener.Addr().String()), HTTPReady(srv.URL))
	if err := check(); err == nil {
		t.Fatal("ready on 503")
	}
	status = http.StatusOK
	if err := check(); err != nil {
		t.Fatalf("not ready on 200: %v", err)
	}
}
