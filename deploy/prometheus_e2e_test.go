package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/caddybin"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
	"github.com/llmhedge/llmhedge/internal/testkit/traefikbin"
)

// TestPrometheusEndToEnd runs a real Prometheus (Debian's package, on a
// free loopback port, scraping every second) against every scrape endpoint
// the docs name: the real Caddy's `metrics` handler (OpenMetrics: le="2.0")
// and its admin /metrics (le="2"), the real Traefik's metricsPath and the
// Envoy ext_proc server (in process, behind the Envoy-side driver); it
// sends real traffic through each to simulated upstreams, and then
// evaluates every rule of llmhedge-rules.yml and every query of the
// dashboard through Prometheus' HTTP API.
//
// Each endpoint has two routes of its own, <endpoint>-ok and
// <endpoint>-slow (Caddy's two endpoints serve the same process: each
// keeps only its own routes' series, by metric relabelling). The ok routes
// get varied traffic (hedges, denials, invalid answers, replays), so every
// per-route query must show them; the slow routes get a third of their
// requests with both upstreams 2.3 s to the first token, so the TTFT SLO's
// recordings show the burn and its burn-rate alerts fire there, and on no ok
// route. Prometheus loads a copy of the rules with every `for` set to 0s
// (the test cannot wait minutes). The Envoy server has a fleet (a real
// redis-server), which is killed before the queries run. The queries that
// legitimately have no data here are the alerts that do not fire on this
// traffic; they must still evaluate without error.
func TestPrometheusEndToEnd(t *testing.T) {
	proc.SkipShort(t, "prometheus, caddy, traefik and redis-server")
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not found: run `make prometheus` (installs Debian's prometheus package)")
	}
	rulesNow := rulesWithoutFor(t)
	a := llmsim.Start("A", llmsim.Fast())
	t.Cleanup(a.Close)
	b := llmsim.Start("B", llmsim.Fast())
	t.Cleanup(b.Close)

	caddyURL, caddyAdmin, caddyMetrics := startCaddy(t, a.URL, b.URL, "caddy-handler", "caddy-admin")
	traefikURL := startTraefik(t, a.URL, b.URL, "traefik")
	redis := redisproc.Start(t, redisproc.Options{})
	envoyURL, envoyMetrics := startEnvoyServer(t, a.URL, b.URL, redis.URL(), "envoy")
	endpoints := []endpoint{
		{"caddy-handler", caddyURL, caddyMetrics},
		{"caddy-admin", caddyURL, caddyAdmin + "/metrics"},
		{"traefik", traefikURL, traefikURL + "/llmhedge/metrics"},
		{"envoy", envoyURL, envoyMetrics},
	}
	prom := startPrometheus(t, promBin, rulesNow, endpoints)
	var routes, okRoutes []string
	for _, e := range endpoints {
		routes = append(routes, e.ok(), e.slow())
		okRoutes = append(okRoutes, e.ok())
	}
	sort.Strings(okRoutes)

	// Two rounds of traffic, each seen by a scrape of every endpoint
	// before the next: every counter and histogram then has two samples
	// that differ, so rates and quantiles have values. The first round
	// makes the series; the second brings each route past the burn-rate
	// alerts' floor (100 first tokens), a third of the slow routes'
	// requests slow.
	const perRound = 24
	const sloRequests = 120
	want := map[string]float64{}
	for round := 1; round <= 2; round++ {
		for _, e := range endpoints {
			sendTraffic(t, e.front, e.ok(), fmt.Sprintf("round %d", round), perRound, false)
			want[e.ok()] += float64(perRound + perRound/6) // and a replay of each keyed request
			n := 8
			if round == 2 {
				n = sloRequests
				sendSLOTraffic(t, e.front, e.ok(), sloRequests, 0)
				want[e.ok()] += sloRequests
			}
			sendSLOTraffic(t, e.front, e.slow(), n, 3)
			want[e.slow()] += float64(n)
		}
		for _, r := range routes {
			prom.waitFor(t, fmt.Sprintf("Prometheus to scrape %v requests of %s", want[r], r),
				fmt.Sprintf(`sum(llm_hedge_requests_total{route=%q})`, r), func(v float64) bool { return v >= want[r] })
		}
	}
	// The recording rules evaluated after the second round's scrape.
	for _, route := range okRoutes {
		prom.waitFor(t, "the recording rules to see the second round on "+route,
			fmt.Sprintf(`llmhedge:hedge_rate:ratio_rate5m{route=%q}`, route), func(v float64) bool { return v > 0 })
	}

	// Both spellings of the SLO's bucket reached Prometheus: OpenMetrics
	// from Caddy's metrics handler, the text format from the others.
	for _, e := range endpoints {
		le := `le="2"`
		if e.name == "caddy-handler" {
			le = `le="2.0"`
		}
		prom.waitFor(t, e.name+"'s 2 s bucket as "+le, fmt.Sprintf(`count(llm_hedge_ttft_seconds_bucket{job=%q,%s})`, e.name, le),
			func(v float64) bool { return v > 0 })
	}
	// The SLO on every endpoint: the slow route's recordings show its late
	// first tokens and the fast burn alert fires for it; the ok route's
	// show none and nothing fires.
	for _, e := range endpoints {
		slow := fmt.Sprintf(`llmhedge:ttft_slo_errors:ratio_rate5m{route=%q}`, e.slow())
		prom.waitFor(t, "the SLO recordings of "+e.slow(), slow, func(v float64) bool { return v > 0.144 })
		prom.waitFor(t, "LLMHedgeTTFTBudgetBurnFast firing for "+e.slow(),
			fmt.Sprintf(`ALERTS{alertname="LLMHedgeTTFTBudgetBurnFast",alertstate="firing",route=%q}`, e.slow()), func(v float64) bool { return v == 1 })
		for _, w := range []string{"5m", "1h", "6h"} {
			for _, r := range []string{e.ok(), e.slow()} {
				v := prom.value(t, fmt.Sprintf(`llmhedge:ttft_slo_errors:ratio_rate%s{route=%q}`, w, r))
				t.Logf("%s: llmhedge:ttft_slo_errors:ratio_rate%s = %.3f (first tokens counted over 5m: %.0f)", r, w, v,
					prom.value(t, fmt.Sprintf(`sum(increase(llm_hedge_ttft_seconds_count{route=%q}[5m]))`, r)))
				if r == e.ok() && v != 0 {
					t.Errorf("%s (healthy): llmhedge:ttft_slo_errors:ratio_rate%s = %v, want 0", r, w, v)
				}
				if r == e.slow() && !(v > 0.144 && v < 0.5) {
					t.Errorf("%s (a third of first tokens after 2.3 s): llmhedge:ttft_slo_errors:ratio_rate%s = %v, want above 0.144 (14.4x the budget) and below 0.5", r, w, v)
				}
			}
		}
	}

	// The Envoy server's fleet loses its Redis: keyed requests still get
	// answers (from local state), the fleet's operations fail, and after
	// a few failures it counts as down.
	redis.Kill()
	sendTraffic(t, envoyURL, "envoy-ok", "fleet down", 8, true)
	prom.waitFor(t, "the fleet to be down", `min(llm_hedge_fleet_up)`, func(v float64) bool { return v == 0 })
	prom.waitFor(t, "the fleet's failed operations", `sum(rate(llm_hedge_fleet_operation_errors_total[1m]))`, func(v float64) bool { return v > 0 })
	prom.waitFor(t, "LLMHedgeFleetDown firing", `ALERTS{alertname="LLMHedgeFleetDown",alertstate="firing"}`, func(v float64) bool { return v == 1 })

	// Every rule loaded and evaluated by Prometheus without error.
	records, alerts := loadRules(t)
	health := prom.ruleHealth(t)
	for _, r := range append(records, alerts...) {
		h, ok := health[r.name]
		switch {
		case !ok:
			t.Errorf("rule %s: not loaded by Prometheus", r.name)
		case h != "ok":
			t.Errorf("rule %s: health %q, want ok", r.name, h)
		}
	}

	// Recording rules: every one has data, per route where it has a route.
	for _, r := range records {
		if strings.Contains(r.expr, "route") {
			prom.expectData(t, "recording rule "+r.name, r.name, okRoutes)
		} else {
			prom.expectData(t, "recording rule "+r.name, r.name, nil) // the budget
		}
	}
	// Alerts: the fast burn fired on the slow routes alone (above), and
	// FleetDown for the fleet; the others do not fire on this traffic (no
	// failing upstream, winning hedges, traffic under the hedge-rate
	// floor, the fleet's errors during its outage) and must evaluate.
	firing := map[string][]string{}
	for _, s := range prom.expectNoError(t, "ALERTS", `ALERTS{alertstate="firing"}`).Data.Result {
		firing[s.Metric["alertname"]] = append(firing[s.Metric["alertname"]], s.Metric["route"])
	}
	for _, r := range alerts {
		prom.expectNoError(t, "alert "+r.name, r.expr)
		got := firing[r.name]
		sort.Strings(got)
		switch r.name {
		case "LLMHedgeTTFTBudgetBurnFast", "LLMHedgeTTFTBudgetBurnSlow":
			want := []string{}
			for _, e := range endpoints {
				want = append(want, e.slow())
			}
			sort.Strings(want)
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("%s firing for routes %v, want %v (the slow ones)", r.name, got, want)
			}
		case "LLMHedgeFleetDown":
		case "LLMHedgeHedgeWinRateCollapsed":
			// On a slow route no hedge of a slow request can win (both
			// upstreams take 2.3 s; with three attempts it loses twice):
			// whether the alert fires there depends on how many of the
			// other requests' hedges won. It must not on an ok route.
			for _, route := range got {
				if !strings.HasSuffix(route, "-slow") {
					t.Errorf("%s firing for route %q on this traffic, want not firing on an ok route", r.name, route)
				}
			}
		default:
			if len(got) > 0 {
				t.Errorf("%s firing for routes %q on this traffic, want not firing", r.name, got)
			}
		}
	}
	t.Logf("alerts firing: %v", firing)
	// Dashboard queries.
	_, qs := loadDashboard(t)
	for _, q := range qs {
		expr := grafanaVariables.Replace(q.expr)
		what := fmt.Sprintf("panel %q query %s", q.panel, q.refID)
		switch {
		case strings.Contains(expr, "route"):
			prom.expectData(t, what, expr, okRoutes)
		default:
			prom.expectData(t, what, expr, nil)
		}
	}
}

// endpoint is one scrape endpoint: the proxy's front URL and its metrics URL.
type endpoint struct{ name, front, metrics string }

func (e endpoint) ok() string   { return e.name + "-ok" }
func (e endpoint) slow() string { return e.name + "-slow" }

// routeHeader names the route a request is for: every proxy routes by it.
const routeHeader = "X-Test-Route"

// rulesWithoutFor writes a copy of the rules with every alert's `for` set
// to 0s and returns its path.
func rulesWithoutFor(t *testing.T) string {
	raw, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	forLine := regexp.MustCompile(`(?m)^(\s+for:) \S+$`)
	if !forLine.Match(raw) {
		t.Fatalf("%s has no `for:` line to set to 0s", rulesPath)
	}
	path := filepath.Join(t.TempDir(), "llmhedge-rules.yml")
	if err := os.WriteFile(path, forLine.ReplaceAll(raw, []byte("$1 0s")), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// sendSLOTraffic sends n plain streaming requests for route through front,
// sixteen at a time; with slowEvery > 0 every slowEvery-th finds both
// upstreams 2.3 s from their first token, past the SLO's 2 s (no hedge can
// save it).
func sendSLOTraffic(t *testing.T, front, route string, n, slowEvery int) {
	t.Helper()
	inParallel(t, n, 16, func(i int) error {
		hdr := map[string]string{}
		if slowEvery > 0 && i%slowEvery == 0 {
			hdr[llmsim.HeaderBehavior] = "A=ttft:2300ms;B=ttft:2300ms"
		}
		resp, got, err := post(front, route, fmt.Sprintf(`{"model":"gpt-sim","stream":true,"messages":[{"role":"user","content":"slo %d of %s"}]}`, i, route), hdr)
		if err != nil || resp.StatusCode != http.StatusOK || !bytes.Contains(got, []byte("[DONE]")) {
			return fmt.Errorf("%s request %d: %s, %d bytes, error %v", route, i, statusOf(resp), len(got), err)
		}
		return nil
	})
}

// sendTraffic sends n streaming chat requests for route through front,
// four at a time; with keyedOnly every one has an idempotency key of its
// own (which the fleet shares), else one in six has, and is sent again
// once answered (a replay). Every other one finds upstream A slow (150 ms
// to its first token, the hedge delay is 20 ms), so hedges start, win and
// cancel A; one in three of those may not be sent twice, and its hedge is
// denied. The proxies run without a hedge budget, so the hedge rate (about
// 1/3) is above the rules' budget of 0.1.
func sendTraffic(t *testing.T, front, route, tag string, n int, keyedOnly bool) {
	t.Helper()
	inParallel(t, n, 4, func(i int) error {
		// A stored request without an idempotency key is not sent
		// twice: its hedge is denied (not_idempotent).
		store := i%6 == 4
		body := fmt.Sprintf(`{"model":"gpt-sim","stream":true,"store":%t,"messages":[{"role":"user","content":"request %d of %s: %s"}]}`,
			store, i, tag, strings.Repeat("padding ", 40))
		hdr := map[string]string{}
		// The client asks for a check no simulated answer passes (its
		// text is not JSON): every attempt's answer is invalid.
		invalid := !keyedOnly && i%6 == 3
		if invalid {
			hdr["X-LLM-Hedge-Validate"] = "json"
		}
		keyed := keyedOnly || i%6 == 1
		if keyed {
			hdr["Idempotency-Key"] = fmt.Sprintf("%s-%s-%d", route, strings.ReplaceAll(tag, " ", "-"), i)
		}
		if i%2 == 0 {
			hdr[llmsim.HeaderBehavior] = "A=ttft:150ms"
		}
		sends := 1
		if keyed && !keyedOnly {
			sends = 2 // the second is a replay
		}
		for send := 1; send <= sends; send++ {
			resp, got, err := post(front, route, body, hdr)
			switch {
			case invalid && (err != nil || resp.StatusCode != http.StatusOK):
				return fmt.Errorf("%s request %d (every answer invalid): %s, error %v", route, i, statusOf(resp), err)
			case invalid:
			case err != nil || resp.StatusCode != http.StatusOK || !bytes.Contains(got, []byte("[DONE]")):
				return fmt.Errorf("%s request %d (send %d): %s, %d bytes, error %v", route, i, send, statusOf(resp), len(got), err)
			case send == 2 && resp.Header.Get("Idempotent-Replayed") != "true":
				return fmt.Errorf("%s request %d sent again with its key: Idempotent-Replayed %q, want true", route, i, resp.Header.Get("Idempotent-Replayed"))
			}
		}
		return nil
	})
}

// inParallel runs send(i) for every i below n, conc at a time, and fails t
// with the errors they return.
func inParallel(t *testing.T, n, conc int, send func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, conc)
	for i := 0; i < n; i++ {
		i := i
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := send(i); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// e2eClient sends the test's requests.
var e2eClient = &http.Client{Timeout: 10 * time.Second}

// post sends a chat request with body for route (routeHeader) and the
// headers hdr to front, and reads the whole answer.
func post(front, route, body string, hdr map[string]string) (*http.Response, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, front+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(routeHeader, route)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e2eClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	return resp, got, err
}

// statusOf names resp's status ("no answer" without one).
func statusOf(resp *http.Response) string {
	if resp == nil {
		return "no answer"
	}
	return "status " + resp.Status
}

// hedgeSettings are the same on every proxy.
const hedgeDelay = "20ms"

// startCaddy runs the real Caddy with a hedged site that has the routes
// <endpoint>-ok and <endpoint>-slow of each endpoint (chosen by
// routeHeader) and returns the site's URL, the admin API's (which serves
// /metrics) and the URL of a `metrics` handler.
func startCaddy(t *testing.T, upA, upB string, endpoints ...string) (site, admin, metrics string) {
	bin := caddybin.Binary(t)
	dir := t.TempDir()
	adminPort, sitePort, metricsPort := proc.FreePort(t), proc.FreePort(t), proc.FreePort(t)
	var routes strings.Builder
	for _, e := range endpoints {
		for _, route := range []string{e + "-ok", e + "-slow"} {
			fmt.Fprintf(&routes, `	@%[1]s header %[2]s %[1]s
	llm_hedge @%[1]s {
		route %[1]s
		upstream %[3]s {
			name A
		}
		upstream %[4]s {
			name B
		}
		delay %[5]s
		budget {
			ratio -1
		}
	}
`, route, routeHeader, upA, upB, hedgeDelay)
		}
	}
	caddyfile := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
	metrics
}
http://127.0.0.1:%d {
%s}
http://127.0.0.1:%d {
	metrics
}
`, adminPort, sitePort, routes.String(), metricsPort)
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	site = fmt.Sprintf("http://127.0.0.1:%d", sitePort)
	admin = fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	runProcess(t, "caddy", cmd, admin+"/config/")
	return site, admin, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
}

// startTraefik runs the real Traefik v3.6.12 (examples/traefik/build-traefik.sh)
// with this checkout as a local plugin and returns its web entry point,
// which also answers the plugin's metricsPath.
func startTraefik(t *testing.T, upA, upB, endpoint string) string {
	bin := traefikbin.Binary(t)
	dir := t.TempDir()
	traefikbin.LayoutPlugin(t, dir)
	web, ping := proc.FreePort(t), proc.FreePort(t)
	// The ok route takes every request (and the metrics path), the slow
	// one those with its routeHeader (a longer rule: a higher priority).
	var middlewares strings.Builder
	for _, name := range []string{"ok", "slow"} {
		fmt.Fprintf(&middlewares, `    %s:
      plugin:
        llmhedge:
          route: %s-%s
          upstreams:
            - {name: A, url: %q}
            - {name: B, url: %q}
          delay: %s
          budget: {ratio: -1}
          metricsPath: /llmhedge/metrics
`, name, endpoint, name, upA, upB, hedgeDelay)
	}
	dynamic := fmt.Sprintf(`http:
  routers:
    ok:
      rule: "PathPrefix(%[1]s/%[1]s)"
      entryPoints: [web]
      middlewares: [ok]
      service: noop@internal
    slow:
      rule: "PathPrefix(%[1]s/%[1]s) && Header(%[1]s%[2]s%[1]s, %[1]s%[3]s-slow%[1]s)"
      entryPoints: [web]
      middlewares: [slow]
      service: noop@internal
  middlewares:
%[4]s`, "`", routeHeader, endpoint, middlewares.String())
	static := fmt.Sprintf(`entryPoints:
  web:
    address: "127.0.0.1:%d"
  traefik:
    address: "127.0.0.1:%d"
ping:
  entryPoint: traefik
providers:
  file:
    filename: %q
experimental:
  localPlugins:
    llmhedge:
      moduleName: github.com/llmhedge/llmhedge
log:
  level: ERROR
global:
  checkNewVersion: false
  sendAnonymousUsage: false
`, web, ping, filepath.Join(dir, "dynamic.yml"))
	for name, content := range map[string]string{"dynamic.yml": dynamic, "traefik.yml": static} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "--configFile="+filepath.Join(dir, "traefik.yml"))
	cmd.Dir = dir
	base := fmt.Sprintf("http://127.0.0.1:%d", web)
	// Ready when the router answers: the metrics path is served by the
	// plugin, so it proves the plugin loaded too.
	runProcess(t, "traefik", cmd, base+"/llmhedge/metrics")
	return base
}

// startEnvoyServer runs the Envoy ext_proc server in process, with a fleet
// on fleetURL, and the Envoy-side driver in front of it (no Envoy binary
// exists here); it
// returns the driver's URL and the server's metrics URL.
func startEnvoyServer(t *testing.T, upA, upB, fleetURL, endpoint string) (front, metrics string) {
	config := fmt.Sprintf(`fleet: {url: %q, timeout: 100ms}
grpc:
  listen: 127.0.0.1:0
metrics:
  listen: 127.0.0.1:0
routes:
  - name: %[5]s-slow
    match: {path_prefixes: [/v1/], headers: [{name: %[6]s, value: %[5]s-slow}]}
    upstreams: [{name: A, url: %[2]q}, {name: B, url: %[3]q}]
    delay: %[4]s
    budget: {ratio: -1}
  - name: %[5]s-ok
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: A, url: %[2]q}, {name: B, url: %[3]q}]
    delay: %[4]s
    budget: {ratio: -1}
`, fleetURL, upA, upB, hedgeDelay, endpoint, routeHeader)
	path := filepath.Join(t.TempDir(), "llmhedge-extproc.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := envoyfilter.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	app, err := envoyfilter.NewApp(path, cfg, zap.NewNop(), zap.NewAtomicLevel(), envoyfilter.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { app.Shutdown(5 * time.Second) })
	conn, err := grpc.NewClient(app.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	driver := envoydriver.New(conn, envoydriver.Config{})
	srv := httptest.NewServer(driver)
	t.Cleanup(func() {
		srv.Close()
		driver.Close()
	})
	return srv.URL, "http://" + app.MetricsAddr() + "/metrics"
}

// runProcess starts cmd, stops it at the end of the test, and waits until
// readyURL answers 200: the process's own signal that it serves (Traefik
// interprets the plugin first, which takes a while on a loaded machine).
func runProcess(t *testing.T, name string, cmd *exec.Cmd, readyURL string) *proc.Buffer {
	t.Helper()
	logs := &proc.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() { proc.Stop(cmd.Process, exited, 10*time.Second) })
	if err := proc.WaitReady(cmd.Args, exited, logs.String, proc.HTTPReady(readyURL)); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return logs
}

// prometheus is a running Prometheus.
type prometheus struct {
	url  string
	logs *proc.Buffer
}

// startPrometheus runs Prometheus with a generated configuration: the
// rules, scrape and rule evaluation every second, one job per endpoint
// (named after it) that keeps the series of the endpoint's own routes and
// those without a route, storage in a temporary folder.
func startPrometheus(t *testing.T, bin, rules string, endpoints []endpoint) *prometheus {
	dir := t.TempDir()
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files:\n  - %q\nscrape_configs:\n", rules)
	for _, e := range endpoints {
		u, err := url.Parse(e.metrics)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&cfg, "  - job_name: %s\n    metrics_path: %q\n    static_configs:\n      - targets: [%q]\n"+
			"    metric_relabel_configs:\n      - {source_labels: [route], regex: %q, action: keep}\n",
			e.name, u.Path, u.Host, regexp.QuoteMeta(e.name)+"-.*|")
	}
	path := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	port := proc.FreePort(t)
	p := &prometheus{url: fmt.Sprintf("http://127.0.0.1:%d", port)}
	cmd := exec.Command(bin,
		"--config.file="+path,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port),
		"--log.level=warn")
	cmd.Dir = dir
	p.logs = runProcess(t, "prometheus", cmd, p.url+"/-/ready")
	return p
}

// apiResult is the answer of /api/v1/query.
type apiResult struct {
	Status    string `json:"status"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
	Data      struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]interface{}    `json:"value"`
		} `json:"result"`
	} `json:"data"`
}

// query evaluates expr now.
func (p *prometheus) query(t *testing.T, expr string) apiResult {
	t.Helper()
	resp, err := http.PostForm(p.url+"/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r apiResult
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("query %q: decoding the answer (status %d): %v", expr, resp.StatusCode, err)
	}
	return r
}

// sampleValue is a sample's value, NaN when it does not parse.
func sampleValue(v [2]interface{}) float64 {
	s, _ := v[1].(string)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return math.NaN()
	}
	return f
}

// waitFor polls expr until its first sample satisfies ok (Prometheus
// scrapes and evaluates on its own schedule).
func (p *prometheus) waitFor(t *testing.T, what, expr string, ok func(float64) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := p.query(t, expr)
		if r.Status == "success" && len(r.Data.Result) > 0 && ok(sampleValue(r.Data.Result[0].Value)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 30s for %s: %s = %+v\nprometheus log:\n%s", what, expr, r.Data.Result, proc.Tail(p.logs.String(), 20))
		}
		time.Sleep(100 * time.Millisecond) // polling Prometheus' own schedule
	}
}

// value is expr's first sample now (NaN when it has none).
func (p *prometheus) value(t *testing.T, expr string) float64 {
	t.Helper()
	r := p.query(t, expr)
	if r.Status != "success" || len(r.Data.Result) == 0 {
		return math.NaN()
	}
	return sampleValue(r.Data.Result[0].Value)
}

// expectNoError fails when expr does not evaluate.
func (p *prometheus) expectNoError(t *testing.T, what, expr string) apiResult {
	t.Helper()
	r := p.query(t, expr)
	if r.Status != "success" {
		t.Errorf("%s: status %q (%s: %s) for %s", what, r.Status, r.ErrorType, r.Error, expr)
	}
	return r
}

// expectData fails when expr does not evaluate, has no sample with a
// number (NaN is no data), or, with routes, lacks a route.
func (p *prometheus) expectData(t *testing.T, what, expr string, routes []string) {
	t.Helper()
	r := p.expectNoError(t, what, expr)
	seen := map[string]bool{}
	numbers := 0
	for _, s := range r.Data.Result {
		if v := sampleValue(s.Value); !math.IsNaN(v) {
			numbers++
			seen[s.Metric["route"]] = true
		}
	}
	if numbers == 0 {
		t.Errorf("%s: %d samples, %d of them numbers, want at least one: %s", what, len(r.Data.Result), numbers, expr)
		return
	}
	for _, route := range routes {
		if !seen[route] {
			t.Errorf("%s: no number for route %q (routes seen: %v): %s", what, route, seen, expr)
		}
	}
}

// ruleHealth returns every loaded rule's health, by rule name.
func (p *prometheus) ruleHealth(t *testing.T) map[string]string {
	t.Helper()
	resp, err := http.Get(p.url + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range r.Data.Groups {
		for _, rule := range g.Rules {
			out[rule.Name] = rule.Health
			if rule.LastError != "" {
				out[rule.Name] = rule.Health + ": " + rule.LastError
			}
		}
	}
	return out
}
