package proc

import (
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
