package yaegistress

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Under -race the stress tests run their interpreted loads in a child `go
// test` of this package built without the race detector, and their
// compiled controls here. Why: Yaegi v0.16.1 builds an interpreted type's
// reflect type lazily and caches it without synchronisation
// (interp/type.go, refType, read at 2073, written at 2106-2126); the first
// concurrent uses of any code path race on that cache, every writer
// storing the same type. A warm-up that sends one request down each path
// first (warmUp) made that rare, but no warm-up reaches every path a
// loaded machine takes (a follower arriving while its leader renews, a
// hedge timer firing beside a stall...), and the race then failed the test
// on Yaegi's internals. The detector cannot tell those from a race in
// core's own code either: interpreted, core's variables are the
// interpreter's memory, so every report is in interp's frames. Core's own
// races are the compiled controls' to find (the same code under the same
// load, under -race); the interpreted loads are what they always were for,
// wrong answers, panics, hangs and leaks, which need no race detector.
//
// LLMHEDGE_STRESS_INPROCESS=1 keeps the interpreted loads in this process
// under -race after the warm-up (the detector as a guard over Yaegi's
// internals too, knowing it may trip on that cache);
// LLMHEDGE_STRESS_COLD=1 does without the warm-up, to see the race.
const (
	envInterpretedChild     = "LLMHEDGE_STRESS_INTERPRETED_CHILD"
	envInterpretedInProcess = "LLMHEDGE_STRESS_INPROCESS"
)

// stressModes reports whether a stress test's mode (named "... compiled"
// or "... interpreted") runs in this process, after running the
// interpreted ones in a child without -race when this binary has it (see
// above).
func stressModes(t *testing.T) func(mode string) bool {
	t.Helper()
	compiled, interpreted := true, true
	switch {
	case os.Getenv(envInterpretedChild) != "":
		compiled = false
	case raceEnabled && os.Getenv(envInterpretedInProcess) == "" && os.Getenv("LLMHEDGE_STRESS_COLD") == "":
		runInterpretedChild(t)
		interpreted = false
	}
	return func(mode string) bool {
		if strings.Contains(mode, "interpreted") {
			return interpreted
		}
		return compiled
	}
}

// runInterpretedChild runs t's interpreted loads in `go test` without
// -race and fails t with the child's output unless it passed.
func runInterpretedChild(t *testing.T) {
	t.Helper()
	timeout := 25 * time.Minute
	if d, ok := t.Deadline(); ok {
		timeout = time.Until(d) - 30*time.Second // the child fails before this test's deadline
	}
	cmd := exec.Command("go", "test", "-count=1", "-v", "-timeout", timeout.Round(time.Second).String(),
		"-run", "^"+regexp.QuoteMeta(t.Name())+"$", ".")
	env := []string{envInterpretedChild + "=1"}
	for _, kv := range os.Environ() {
		if v, ok := strings.CutPrefix(kv, "GOFLAGS="); ok {
			kv = "GOFLAGS=" + strings.Join(strings.Fields(strings.ReplaceAll(v, "-race", "")), " ")
		}
		env = append(env, kv)
	}
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	var runs []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, " run ") && strings.Contains(line, "requests=") {
			runs = append(runs, strings.TrimSpace(line))
		}
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Errorf("the interpreted loads without -race (go test -run %s, %s=1): %v\n%s", t.Name(), envInterpretedChild, err, out)
		return
	}
	t.Logf("interpreted, in a child without -race:\n%s", strings.Join(runs, "\n"))
}
