package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
)

// mainEnv makes the test binary run the command's main instead of the
// tests, so a test can send it a real SIGINT.
const mainEnv = "LLMHEDGE_TUNE_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		main()
		return
	}
	// The simulated upstreams draw a request's latencies from its id: the
	// tests name request i as the samples CSV does, so they can compute
	// the truth from the same draws. Only here, never in the command.
	tagRequest = simRequestID
	os.Exit(m.Run())
}

func simRequestID(req *http.Request, i int) {
	req.Header.Set(llmsim.HeaderRequest, requestIDPrefix+strconv.Itoa(i))
}

// TestCtrlC sends SIGINT to the running command: it stops, cancels the
// requests in flight, prints the partial report and exits 130.
func TestCtrlC(t *testing.T) {
	proc.SkipShort(t, "the command (this test binary) as a child process")
	w := llmsim.Reference(21, 0.05)
	a, b := llmsim.Start("ca", w), llmsim.Start("cb", w)
	defer a.Close()
	defer b.Close()
	cmd := exec.Command(os.Args[0],
		"-endpoint", endpointFlag("ca", a.URL), "-endpoint", endpointFlag("cb", b.URL),
		"-n", "5000", "-concurrency", "4", "-yes", "-out", t.TempDir())
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.WaitFor(ctx, func() bool { return a.Served() >= 40 }); err != nil {
		_ = cmd.Process.Kill()
		t.Fatalf("the command did not get going: %v\n%s", err, stderr.String())
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitInterrupted {
		t.Fatalf("exit %v, want status %d\n%s\n%s", err, exitInterrupted, stdout.String(), stderr.String())
	}
	for _, want := range []string{"Interrupted: the report covers the", "Recommended hedge delay", "Chart: "} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("partial report lacks %q:\n%s", want, stdout.String())
		}
	}
	// Nothing is left running against the endpoints.
	for _, s := range []*llmsim.Running{a, b} {
		if err := s.WaitFor(ctx, func() bool { return s.InFlight() == 0 }); err != nil {
			t.Errorf("%s still has %d requests in flight", s.Name, s.InFlight())
		}
		if s.Served() >= 5000 {
			t.Errorf("%s served all %d requests", s.Name, s.Served())
		}
	}
}

// TestProgressBarOnTerminal: on a terminal the bar is redrawn in place,
// at most every progressRedraw, and the last state is always drawn.
func TestProgressBarOnTerminal(t *testing.T) {
	var buf bytes.Buffer
	clock := time.Unix(0, 0)
	p := &progress{w: &buf, tty: true, total: 100, start: clock, now: func() time.Time { return clock }}
	for i := 0; i < 100; i++ {
		clock = clock.Add(10 * time.Millisecond)
		p.done()
	}
	p.finish()
	out := buf.String()
	draws := strings.Count(out, "\r")
	if draws < 10 || draws > 12 || strings.Contains(strings.TrimSuffix(out, "\n"), "\n") {
		t.Errorf("%d redraws (want about 100 x 10ms / 100ms), output %q", draws, out)
	}
	if !strings.HasSuffix(out, "[==============================] 100/100 100%  elapsed 1s  ETA 0s \n") {
		t.Errorf("final state %q", out[strings.LastIndex(out, "\r"):])
	}
	if !strings.Contains(out, "\r[===============>              ] 51/100  51%  elapsed 1s  ETA 0s ") {
		t.Errorf("no midway state with an ETA: %q", out)
	}
}

// TestRefusesWithoutTerminal: without -yes and without a terminal on stdin
// (a pipe, as in "echo n | llmhedge-tune ..." or "echo y | ..."), the
// command refuses with a clear message and a non-zero exit, and sends
// nothing.
func TestRefusesWithoutTerminal(t *testing.T) {
	s := llmsim.Start("paid", llmsim.Reference(4, 0.02))
	defer s.Close()
	for _, answer := range []string{"n\n", "y\n", ""} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{"-endpoint", endpointFlag("paid", s.URL), "-n", "3", "-out", t.TempDir()},
			strings.NewReader(answer), &stdout, &stderr)
		if code == exitOK {
			t.Errorf("stdin %q without -yes: exit %d, want non-zero", answer, code)
		}
		if !strings.Contains(stderr.String(), "stdin is not a terminal") || !strings.Contains(stderr.String(), "-yes") {
			t.Errorf("stdin %q: stderr %q does not say why and that -yes sends", answer, stderr.String())
		}
	}
	if n := s.Served(); n != 0 {
		t.Errorf("%d requests sent without a confirmation, want 0", n)
	}
}
