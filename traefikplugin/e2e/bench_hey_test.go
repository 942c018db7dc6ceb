package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/envgate"
	"github.com/llmhedge/llmhedge/internal/testkit/heyload"
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
	hey := heyload.Path(t)
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
		run := func(route string, d time.Duration) heyload.Result {
			cpu0 := tr.cpuTime()
			r := heyload.Run(t, hey, tr.URL+"/"+route+"/v1/chat/completions", w.body, conns, d)
			r.CPU = tr.cpuTime() - cpu0
			return r
		}
		run(w.plugin, time.Second) // the warm-up, the interpreter's too
		run(w.plain, time.Second)
		w.sim.ResetCounters()
		var sum [2]heyload.Result // plugin, plain
		var ratios []string
		for r := 0; r < rounds; r++ {
			var res [2]heyload.Result
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
				sum[i].Add(res[i])
			}
			ratios = append(ratios, fmt.Sprintf("%.0f/%.0f=%.3f", res[0].RPS(), res[1].RPS(), res[0].RPS()/res[1].RPS()))
		}
		for i, name := range []string{"plugin", "plain LB"} {
			if sum[i].Failed != 0 {
				t.Errorf("%s, %s: %d requests not answered 200 (%s)", w.name, name, sum[i].Failed, sum[i].Errors)
			}
		}
		if served, sent := w.sim.Served(), int64(sum[0].OK+sum[0].Failed+sum[1].OK+sum[1].Failed); served > sent {
			t.Errorf("%s: the upstream served %d requests for %d sent: a hedge fired", w.name, served, sent)
		}
		t.Logf("hey -c %d -z %v, %s, no hedge: plugin %.0f req/s (Traefik CPU %v/request), plain LB %.0f req/s (%v/request): ratio %.3f; rounds plugin/plain %s",
			conns, dur, w.name, sum[0].RPS(), sum[0].CPUPerRequest(), sum[1].RPS(), sum[1].CPUPerRequest(),
			sum[0].RPS()/sum[1].RPS(), strings.Join(ratios, " "))
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
