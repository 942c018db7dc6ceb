package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/envgate"
	"github.com/llmhedge/llmhedge/internal/testkit/lightload"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestBenchHeyOverhead is TestBenchLightOverhead measured with an
// independent client, hey (Debian's package, or HEY=/path): requests/s
// through the plugin and through Traefik's plain load balancer on the same
// Traefik and the same fast upstream (no hedge fires), in alternating
// rounds of `hey -c 20 -z 4s` after a warm-up of each, and Traefik's CPU
// per request from /proc. Two workloads: a streaming Chat Completions call
// answered with 20 tokens, and a non-streaming one answered with 1 token.
//
//	LLMHEDGE_BENCH=1 go test ./traefikplugin/e2e -run TestBenchHeyOverhead -v
func TestBenchHeyOverhead(t *testing.T) {
	envgate.Bench(t)
	hey := heyPath(t)
	const rounds, conns = 3, 20
	dur := 4 * time.Second
	if v, err := time.ParseDuration(os.Getenv("LLMHEDGE_BENCH_HEY_DURATION")); err == nil && v > 0 {
		dur = v
	}
	one := llmsim.Fast()
	one.Tokens = 1
	f, f1 := llmsim.Start("F", llmsim.Fast()), llmsim.Start("F1", one)
	defer f.Close()
	defer f1.Close()
	d := newDynamic("hey").
		loadBalancer("fast", f.URL).
		route("plain", "fast").
		hedge("hedge", pluginConfig([][2]string{{"F", f.URL}, {"F", f.URL}}, "delay: 30s", "log: off")).
		route("hedge", "noop@internal", "hedge").
		loadBalancer("one", f1.URL).
		route("plain1", "one").
		hedge("hedge1", pluginConfig([][2]string{{"F1", f1.URL}, {"F1", f1.URL}}, "delay: 30s", "log: off")).
		route("hedge1", "noop@internal", "hedge1")
	// LLMHEDGE_BENCH_PROFILE=dir: Traefik's CPU profile of each
	// workload's first plugin round, written to dir (pprof's format).
	profileDir := os.Getenv("LLMHEDGE_BENCH_PROFILE")
	tr, adminURL := launchTraefik(t, "ERROR", d, profileDir != "")
	oneBody := `{"model":"bench","stream":false,"messages":[{"role":"user","content":"Say something."}]}`
	for wi, w := range []struct {
		name, plugin, plain, body string
		sim                       *llmsim.Running
	}{
		{"streaming, 20 tokens", "hedge", "plain", lightload.ChatStreamBody, f},
		{"non-streaming, 1 token", "hedge1", "plain1", oneBody, f1},
	} {
		run := func(route string, d time.Duration) heyResult {
			cpu0 := tr.cpuTime()
			r := runHey(t, hey, tr.URL+"/"+route+"/v1/chat/completions", w.body, conns, d)
			r.cpu = tr.cpuTime() - cpu0
			return r
		}
		run(w.plugin, time.Second) // the warm-up, the interpreter's too
		run(w.plain, time.Second)
		w.sim.ResetCounters()
		var sum [2]heyResult // plugin, plain
		var ratios []string
		for r := 0; r < rounds; r++ {
			var res [2]heyResult
			// Alternate which goes first, so that bursts of other load
			// on a shared machine hit both alike.
			for k := 0; k < 2; k++ {
				i := (r + k) % 2
				var profiled chan struct{}
				if profileDir != "" && r == 0 && i == 0 {
					profiled = profileTraefik(t, adminURL, dur-time.Second, fmt.Sprintf("%s/traefik-plugin-%d.pprof", profileDir, wi))
				}
				res[i] = run([]string{w.plugin, w.plain}[i], dur)
				if profiled != nil {
					<-profiled
				}
				sum[i].add(res[i])
			}
			ratios = append(ratios, fmt.Sprintf("%.0f/%.0f=%.3f", res[0].rps(), res[1].rps(), res[0].rps()/res[1].rps()))
		}
		for i, name := range []string{"plugin", "plain LB"} {
			if sum[i].failed != 0 {
				t.Errorf("%s, %s: %d requests not answered 200 (%s)", w.name, name, sum[i].failed, sum[i].errors)
			}
		}
		if served, sent := w.sim.Served(), int64(sum[0].ok+sum[0].failed+sum[1].ok+sum[1].failed); served > sent {
			t.Errorf("%s: the upstream served %d requests for %d sent: a hedge fired", w.name, served, sent)
		}
		t.Logf("hey -c %d -z %v, %s, no hedge: plugin %.0f req/s (Traefik CPU %v/request), plain LB %.0f req/s (%v/request): ratio %.3f; rounds plugin/plain %s",
			conns, dur, w.name, sum[0].rps(), sum[0].cpuPerRequest(), sum[1].rps(), sum[1].cpuPerRequest(),
			sum[0].rps()/sum[1].rps(), strings.Join(ratios, " "))
	}
}

// profileTraefik writes Traefik's CPU profile over the next d to path,
// closing the channel it returns once written.
func profileTraefik(t *testing.T, adminURL string, d time.Duration, path string) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Get(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", adminURL, int(d.Seconds())))
		if err != nil {
			t.Errorf("profile: %v", err)
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil {
			err = os.WriteFile(path, b, 0o644)
		}
		if err != nil {
			t.Errorf("profile: %v", err)
		}
	}()
	return done
}

// heyPath finds hey: $HEY, then PATH, then Debian's /usr/bin/hey and Go's
// bin directory; the benchmark is skipped without it.
func heyPath(t *testing.T) string {
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
			return c
		}
	}
	t.Skip("hey not found (apt-get install hey, go install github.com/rakyll/hey@latest, or HEY=/path)")
	return ""
}

// heyResult is one or more runs of hey: answers by status, its wall time.
type heyResult struct {
	ok, failed int
	errors     string
	wall, cpu  time.Duration
}

func (r *heyResult) add(o heyResult) {
	r.ok += o.ok
	r.failed += o.failed
	r.wall += o.wall
	r.cpu += o.cpu
	if r.errors == "" {
		r.errors = o.errors
	}
}

func (r heyResult) rps() float64 { return float64(r.ok) / r.wall.Seconds() }

func (r heyResult) cpuPerRequest() time.Duration {
	if r.ok == 0 {
		return 0
	}
	return r.cpu / time.Duration(r.ok)
}

var (
	heyTotal  = regexp.MustCompile(`Total:\s+([0-9.]+) secs`)
	heyStatus = regexp.MustCompile(`\[(\d+)\]\s+(\d+) responses`)
	heyErrors = regexp.MustCompile(`(?s)Error distribution:\n(.*)`)
)

// runHey runs hey's summary mode against url and parses its report.
func runHey(t *testing.T, hey, url, body string, conns int, dur time.Duration) heyResult {
	ctx, cancel := context.WithTimeout(t.Context(), dur+time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, hey, "-c", strconv.Itoa(conns), "-z", dur.String(), "-m", "POST",
		"-T", "application/json", "-d", body, url).CombinedOutput()
	if err != nil {
		t.Fatalf("hey: %v\n%s", err, out)
	}
	var r heyResult
	m := heyTotal.FindSubmatch(out)
	if m == nil {
		t.Fatalf("hey printed no total time:\n%s", out)
	}
	secs, _ := strconv.ParseFloat(string(m[1]), 64)
	r.wall = time.Duration(secs * float64(time.Second))
	for _, s := range heyStatus.FindAllSubmatch(out, -1) {
		n, _ := strconv.Atoi(string(s[2]))
		if string(s[1]) == "200" {
			r.ok += n
		} else {
			r.failed += n
		}
	}
	if e := heyErrors.FindSubmatch(out); e != nil {
		r.errors = strings.TrimSpace(string(e[1]))
		for _, line := range strings.Split(r.errors, "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "[") {
				n, _ := strconv.Atoi(strings.Trim(f[0], "[]"))
				r.failed += n
			}
		}
	}
	return r
}
