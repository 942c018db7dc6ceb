// Package chaos is a fault-injection suite for the adapters: one scenario
// generator and one checker, run by a small test per adapter through the
// real proxy (Caddy, Traefik, the Envoy ext_proc server behind its driver).
//
// The suite starts two fault upstreams, A and B. The adapter's test builds
// its route from them with Route's values (upstream B gets a canary
// Authorization through set_headers and a canary provider key in its URL query),
// starts its proxy, and calls Run with the proxy's address and hooks to
// observe it. Every upstream answer embeds its generation id, the request
// it was produced for and a hash of the Authorization the upstream
// received, so the checker verifies each answer byte for byte.
//
// It is test support: nothing outside this module's tests imports it.
package chaos

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// T is the part of testing.TB the suite uses (its own tests pass a
// recorder, to see that the leak and canary checks fire).
type T interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// The route every adapter configures for the suite.
const (
	// Delay is the route's fixed hedge delay.
	Delay = 50 * time.Millisecond
	// Timeout is the route's deadline: the stalls outlive it.
	Timeout = 2 * time.Second
	// MaxAttempts per request.
	MaxAttempts = 3
	// Path is where the suite sends its requests.
	Path = "/v1/chat/completions"
	// canary values: they must appear in no response and no log line.
	canaryHeader = "CANARY-hdr-5e1f0c9a77d24b"
	canaryURLKey = "CANARY-url-0b93d6e1c4a85f"
)

// Env is the suite's upstreams and the values a route must use.
type Env struct {
	A, B *Upstream
	// URLA is upstream A's URL as the route must name it; URLB is B's,
	// with the canary as a provider key in its query.
	URLA, URLB string
	// AuthB is the Authorization value the route sets on upstream B.
	AuthB string
	reg   *Registry
}

// NewEnv starts the two fault upstreams; they stop at the end of the test.
func NewEnv(t T) *Env {
	t.Helper()
	reg := newRegistry()
	a, err := startUpstream("A", reg)
	if err != nil {
		t.Fatalf("starting upstream A: %v", err)
	}
	b, err := startUpstream("B", reg)
	if err != nil {
		t.Fatalf("starting upstream B: %v", err)
	}
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	urlB := b.URL + "?key=" + canaryURLKey
	return &Env{A: a, B: b, URLA: a.URL, URLB: urlB, AuthB: "Bearer " + canaryHeader, reg: reg}
}

// Canaries are the secret values the route configuration carries.
func (e *Env) Canaries() []string { return []string{canaryHeader, canaryURLKey} }

// Target is a running proxy serving the suite's route, and how to look at it.
type Target struct {
	// Name labels the report ("caddy", "traefik", "envoy").
	Name string
	// BaseURL is the proxy's address; requests go to BaseURL + Path.
	BaseURL string
	// PID is the process that holds the proxy's sockets (the test's own
	// for an in-process server); 0 skips the socket count.
	PID int
	// Goroutines returns the proxy's goroutine count; nil if not observable.
	Goroutines func() (int, error)
	// InProcess says the proxy runs in the test's process, so each upstream
	// connection's both ends count in PID's sockets and goroutines.
	InProcess bool
	// CloseIdle, if set, closes the proxy's idle upstream connections.
	CloseIdle func()
	// Logs returns everything the proxy logged so far.
	Logs func() string
}

// Requests is the run's size: 300 scenarios, or LLMHEDGE_CHAOS=full's 10,000.
func Requests() int {
	if os.Getenv("LLMHEDGE_CHAOS") == "full" {
		return 10_000
	}
	return 300
}

// Seed is the scenarios' seed: LLMHEDGE_CHAOS_SEED, or a fixed default.
func Seed() int64 {
	if s, err := strconv.ParseInt(os.Getenv("LLMHEDGE_CHAOS_SEED"), 10, 64); err == nil {
		return s
	}
	return 20260601
}

// settleDeadline bounds how long the proxy may take to wind down after the
// run: polled, never slept. A variable for the suite's own tests.
var settleDeadline = 20 * time.Second

// Run drives n seeded scenarios through target with 20 concurrent clients,
// checks every answer, then that connections and goroutines are back to
// their starting level and that no canary reached a response or a log.
func Run(t T, env *Env, target Target, n int, seed int64) {
	t.Helper()
	// The run takes a minute or more under -race on 2 cores: not for
	// `make unit`. A T without Skip (the suite's own fakes) runs it.
	if s, ok := t.(interface{ Skip(args ...any) }); ok && testing.Short() {
		s.Skip("-short: the chaos suite's long run (" + strconv.Itoa(n) + " scenarios)")
	}
	rn := newRunner(env, target)
	// Warm up with healthy requests, so lazily started parts of the proxy
	// count in the baseline, then take it.
	warm := Generate(seed^0x5eed, 4)
	for _, s := range warm {
		for _, r := range s.Reqs {
			// No key: a warm-up answer must never be replayed to the run.
			r.Plan = Plan{Default: Action{Kind: ActOK}}
			r.CancelAt = -1
			r.Slow = false
			r.Key = ""
			r.ID = "warm-" + r.ID
		}
		rn.scenario(s)
	}
	rn.closeIdle(target)
	base := quiet(t, env, target)
	t.Logf("%s: baseline %s", target.Name, base)

	scenarios := Generate(seed, n)
	start := time.Now()
	work := make(chan *Scenario)
	var wg sync.WaitGroup
	for i := 0; i < defaultConcurrency; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				rn.scenario(s)
			}
		}()
	}
	for _, s := range scenarios {
		work <- s
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)

	ck := newChecker(env.reg, scenarios, map[string]string{"B": env.AuthB}, env.Canaries(), Timeout)
	for _, s := range scenarios {
		ck.scenario(s)
	}
	requests := 0
	for _, s := range scenarios {
		requests += len(s.Reqs)
	}
	t.Logf("%s: %d scenarios, %d requests, %d upstream attempts in %v (seed %d)\n%s",
		target.Name, len(scenarios), requests, env.reg.Count(), elapsed.Round(time.Millisecond), seed, ck.table())

	rn.closeIdle(target)
	after := settle(t, rn, env, target, base)
	t.Logf("%s: after the run %s", target.Name, after)
	if after.busy > 0 {
		t.Errorf("%s: %d upstream connections still busy after %v (requests the proxy never ended)", target.Name, after.busy, settleDeadline)
		for _, line := range append(env.A.busyReport(), env.B.busyReport()...) {
			t.Logf("%s: busy: %s", target.Name, line)
		}
	}
	if target.PID != 0 && after.ownSockets(target) > base.ownSockets(target)+socketSlack {
		t.Errorf("%s: the proxy holds %d sockets besides its upstream pool, %d before the run (leaked connections)",
			target.Name, after.ownSockets(target), base.ownSockets(target))
	}
	if target.Goroutines != nil && after.ownGoroutines(target) > base.ownGoroutines(target)+goroutineSlack {
		t.Errorf("%s: %d goroutines besides the upstream pool's, %d before the run (leaked goroutines)",
			target.Name, after.ownGoroutines(target), base.ownGoroutines(target))
	}

	logHits := 0
	if target.Logs != nil {
		for _, line := range strings.Split(target.Logs(), "\n") {
			for _, canary := range env.Canaries() {
				if strings.Contains(line, canary) {
					logHits++
					if logHits <= 3 {
						t.Errorf("%s: a log line carries a canary credential: %s", target.Name, redact(line, env.Canaries()))
					}
				}
			}
		}
	}
	t.Logf("%s: canary hits: %d in responses, %d in log lines", target.Name, len(ck.violation[VCanary]), logHits)
	if logHits > 3 {
		t.Errorf("%s: %d log lines carry a canary credential in all", target.Name, logHits)
	}
	// The callers' own secrets: their API keys and raw idempotency keys
	// belong in no log line either.
	if target.Logs != nil {
		secrets := []string{"sk-chaos-caller-", "chaos-key-", "chaos-shared-"}
		hits := map[string]int{}
		first := map[string]string{}
		for _, line := range strings.Split(target.Logs(), "\n") {
			for _, secret := range secrets {
				if strings.Contains(line, secret) {
					if hits[secret] == 0 {
						first[secret] = line
					}
					hits[secret]++
				}
			}
		}
		for _, secret := range secrets {
			if hits[secret] > 0 {
				line := first[secret]
				at := strings.Index(line, secret)
				from := at - 80
				if from < 0 {
					from = 0
				}
				t.Errorf("%s: %d log lines carry a caller's secret (%s…); first: …%s", target.Name, hits[secret], secret, clip([]byte(line[from:])))
			}
		}
	}
	for _, kind := range sortedKeys(ck.violation) {
		list := ck.violation[kind]
		examples := list
		if len(examples) > 3 && os.Getenv("LLMHEDGE_CHAOS_VERBOSE") == "" {
			examples = examples[:3] // LLMHEDGE_CHAOS_VERBOSE=1 lists them all
		}
		t.Errorf("%s: %d answers %s; first:\n  %s", target.Name, len(list), kind,
			redact(strings.Join(examples, "\n  "), env.Canaries()))
	}
}

// redact hides canaries in what the test itself prints.
func redact(s string, canaries []string) string {
	for _, c := range canaries {
		s = strings.ReplaceAll(s, c, "[CANARY]")
	}
	return s
}

// table renders outcome counts per fault.
func (c *checker) table() string {
	var b strings.Builder
	cols := []string{OutComplete, OutCleanError, OutBroken, OutCancelled}
	fmt.Fprintf(&b, "%-22s %8s %8s %8s %8s %8s\n", "fault", cols[0], "error", cols[2], cols[3], "wrong")
	for _, f := range Faults {
		m := c.outcomes[f.Fault]
		wrong := 0
		for k, v := range m {
			if k != OutComplete && k != OutCleanError && k != OutBroken && k != OutCancelled {
				wrong += v
			}
		}
		fmt.Fprintf(&b, "%-22s %8d %8d %8d %8d %8d\n", f.Fault, m[OutComplete], m[OutCleanError], m[OutBroken], m[OutCancelled], wrong)
	}
	for _, kind := range sortedKeys(c.violation) {
		fmt.Fprintf(&b, "violation %-30s %d:", kind, len(c.violation[kind]))
		for _, where := range sortedKeys(c.where[kind]) {
			fmt.Fprintf(&b, " %s=%d", where, c.where[kind][where])
		}
		b.WriteString("\n")
	}
	return b.String()
}
