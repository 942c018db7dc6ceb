// Package heyload runs hey (Debian's package, or HEY=/path), the
// independent load client the overhead benchmarks run beside their own
// (internal/testkit/lightload), and reads its report.
package heyload

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/lightload"
)

// Find finds hey: $HEY, then PATH, then Debian's /usr/bin/hey and Go's
// bin directory.
func Find() (string, error) {
	candidates := []string{os.Getenv("HEY")}
	if p, err := exec.LookPath("hey"); err == nil {
		candidates = append(candidates, p)
	}
	candidates = append(candidates, "/usr/bin/hey")
	if home, err := os.UserHomeDir(); err == nil {
		candidates = append(candidates, home+"/go/bin/hey")
	}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			return c, nil
		}
	}
	return "", errors.New("hey not found (apt-get install hey, go install github.com/rakyll/hey@latest, or HEY=/path)")
}

// Path is Find for a benchmark that needs hey: it skips t without it.
func Path(t testing.TB) string {
	hey, err := Find()
	if err != nil {
		t.Skip(err)
	}
	return hey
}

// Result is one or more runs of hey: answers by status, their wall time,
// and the CPU time the caller charged to them (a proxy's, read around the
// run).
type Result struct {
	OK, Failed int
	Errors     string
	Wall, CPU  time.Duration
}

// Add sums o into r.
func (r *Result) Add(o Result) {
	r.OK += o.OK
	r.Failed += o.Failed
	r.Wall += o.Wall
	r.CPU += o.CPU
	if r.Errors == "" {
		r.Errors = o.Errors
	}
}

// RPS is the answers with status 200 per second of wall time.
func (r Result) RPS() float64 { return float64(r.OK) / r.Wall.Seconds() }

// CPUPerRequest is the CPU time charged per answer with status 200.
func (r Result) CPUPerRequest() time.Duration {
	if r.OK == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.OK)
}

var (
	heyTotal  = regexp.MustCompile(`Total:\s+([0-9.]+) secs`)
	heyStatus = regexp.MustCompile(`\[(\d+)\]\s+(\d+) responses`)
	heyErrors = regexp.MustCompile(`(?s)Error distribution:\n(.*)`)
)

// Run runs hey's summary mode (POST body as JSON, conns connections for
// dur) against url and parses its report.
func Run(t testing.TB, hey, url, body string, conns int, dur time.Duration) Result {
	ctx, cancel := context.WithTimeout(context.Background(), dur+time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, hey, "-c", strconv.Itoa(conns), "-z", dur.String(), "-m", "POST",
		"-T", "application/json", "-d", body, url).CombinedOutput()
	if err != nil {
		t.Fatalf("hey: %v\n%s", err, out)
	}
	r, err := parse(out)
	if err != nil {
		t.Fatalf("hey: %v:\n%s", err, out)
	}
	return r
}

// parse reads hey's summary report: the total time, the answers by
// status, and the error distribution (counted as failed).
func parse(out []byte) (Result, error) {
	var r Result
	m := heyTotal.FindSubmatch(out)
	if m == nil {
		return r, errors.New("no total time in its report")
	}
	secs, _ := strconv.ParseFloat(string(m[1]), 64)
	r.Wall = time.Duration(secs * float64(time.Second))
	for _, s := range heyStatus.FindAllSubmatch(out, -1) {
		n, _ := strconv.Atoi(string(s[2]))
		if string(s[1]) == "200" {
			r.OK += n
		} else {
			r.Failed += n
		}
	}
	if e := heyErrors.FindSubmatch(out); e != nil {
		r.Errors = strings.TrimSpace(string(e[1]))
		for _, line := range strings.Split(r.Errors, "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "[") {
				n, _ := strconv.Atoi(strings.Trim(f[0], "[]"))
				r.Failed += n
			}
		}
	}
	return r, nil
}

// Alternate runs hey against urls[0] and urls[1] in rounds after a
// one-second warm-up of each, alternating which goes first so that bursts
// of other load on a shared machine hit both alike. cpu[i], when not nil,
// reads the CPU time charged to side i's runs (its proxy process's). It
// returns each side's sums and the rounds' 0/1 ratios of requests per
// second.
func Alternate(t testing.TB, hey string, urls [2]string, body string, conns, rounds int, dur time.Duration, cpu [2]func() time.Duration) (sum [2]Result, ratios []string) {
	run := func(i int, d time.Duration) Result {
		var before time.Duration
		if cpu[i] != nil {
			before = cpu[i]()
		}
		r := Run(t, hey, urls[i], body, conns, d)
		if cpu[i] != nil {
			r.CPU = cpu[i]() - before
		}
		return r
	}
	run(0, time.Second)
	run(1, time.Second)
	for round := 0; round < rounds; round++ {
		var res [2]Result
		for k := 0; k < 2; k++ {
			i := (round + k) % 2
			res[i] = run(i, dur)
			sum[i].Add(res[i])
		}
		ratios = append(ratios, strconv.FormatFloat(res[0].RPS()/res[1].RPS(), 'f', 3, 64))
	}
	return sum, ratios
}

// Compare measures urls[0] against urls[1] with hey, when hey is installed
// (else it says so in the log): 3 alternating rounds of `hey -c 20 -z 4s`
// on the light client's streaming Chat call (lightload.ChatStreamBody),
// every answer a 200; it logs both sides' requests/s, their ratio and the
// rounds', and the CPU per request that cpu[i] (side i's proxy's CPU time,
// may be nil) charged.
func Compare(t testing.TB, names, urls [2]string, cpu [2]func() time.Duration, proxy string) {
	t.Helper()
	hey, err := Find()
	if err != nil {
		t.Logf("no hey run: %v", err)
		return
	}
	sum, ratios := Alternate(t, hey, urls, lightload.ChatStreamBody, 20, 3, 4*time.Second, cpu)
	for i, name := range names {
		if sum[i].Failed != 0 {
			t.Errorf("hey, %s: %d requests not answered 200 (%s)", name, sum[i].Failed, sum[i].Errors)
		}
	}
	t.Logf("hey -c 20 -z 4s: %s %.0f req/s (%s CPU %v/request), %s %.0f req/s (%v/request): ratio %.3f (rounds %s)",
		names[0], sum[0].RPS(), proxy, sum[0].CPUPerRequest(), names[1], sum[1].RPS(), sum[1].CPUPerRequest(),
		sum[0].RPS()/sum[1].RPS(), strings.Join(ratios, " "))
}
