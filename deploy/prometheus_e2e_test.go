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
// free loopback port, scraping every second) against the real Caddy, the
// real Traefik with the plugin's metricsPath and the Envoy ext_proc server
// (in process, behind the Envoy-side driver), sends real traffic through
// each to simulated upstreams, and then evaluates every rule of
// llmhedge-rules.yml and every query of the dashboard through Prometheus'
// HTTP API.
//
// Each proxy has a route of its own (caddy, traefik, envoy), so every
// per-route query must show all three. The Envoy server has a fleet (a
// real redis-server), which is killed before the queries run. The queries
// that legitimately have no data here are the alerts that do not fire on
// this traffic; they must still evaluate without error.
func TestPrometheusEndToEnd(t *testing.T) {
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not found: run `make prometheus` (installs Debian's prometheus package)")
	}
	rulesAbs, err := filepath.Abs(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	a := llmsim.Start("A", llmsim.Fast())
	t.Cleanup(a.Close)
	b := llmsim.Start("B", llmsim.Fast())
	t.Cleanup(b.Close)

	caddyURL, caddyAdmin := startCaddy(t, a.URL, b.URL)
	traefikURL := startTraefik(t, a.URL, b.URL)
	redis := redisproc.Start(t, redisproc.Options{})
	envoyURL, envoyMetrics := startEnvoyServer(t, a.URL, b.URL, redis.URL())
	prom := startPrometheus(t, promBin, rulesAbs, map[string]string{
		"caddy":   caddyAdmin + "/metrics",
		"traefik": traefikURL + "/llmhedge/metrics",
		"envoy":   envoyMetrics,
	})
	fronts := map[string]string{"caddy": caddyURL, "traefik": traefikURL, "envoy": envoyURL}
	routes := []string{"caddy", "envoy", "traefik"}

	// Two rounds of traffic, each seen by a scrape of every proxy before
	// the next: every counter and histogram then has two samples that
	// differ, so rates and quantiles have values.
	const perRound = 24
	for round := 1; round <= 2; round++ {
		for _, route := range routes {
			sendTraffic(t, fronts[route], route, fmt.Sprintf("round %d", round), perRound, false)
		}
		want := float64(round * perRound)
		for _, route := range routes {
			prom.waitFor(t, fmt.Sprintf("Prometheus to scrape %d requests of %s", round*perRound, route),
				fmt.Sprintf(`sum(llm_hedge_requests_total{route=%q})`, route), func(v float64) bool { return v >= want })
		}
	}
	// The recording rules evaluated after the second round's scrape.
	for _, route := range routes {
		prom.waitFor(t, "the recording rules to see the second round on "+route,
			fmt.Sprintf(`llmhedge:hedge_rate:ratio_rate5m{route=%q}`, route), func(v float64) bool { return v > 0 })
	}

	// The Envoy server's fleet loses its Redis: keyed requests still get
	// answers (from local state), the fleet's operations fail, and after
	// a few failures it counts as down.
	redis.Kill()
	sendTraffic(t, envoyURL, "envoy", "fleet down", 8, true)
	prom.waitFor(t, "the fleet to be down", `min(llm_hedge_fleet_up)`, func(v float64) bool { return v == 0 })
	prom.waitFor(t, "the fleet's failed operations", `sum(llm_hedge_fleet_operation_errors_total)`, func(v float64) bool { return v > 0 })

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
			prom.expectData(t, "recording rule "+r.name, r.name, routes)
		} else {
			prom.expectData(t, "recording rule "+r.name, r.name, nil) // the budget
		}
	}
	// Alert expressions: all evaluate; the budget alert's has data (the
	// proxies hedge past the rules' budget) and so has the fleet-down
	// alert's; the others legitimately have none on this traffic (no
	// failing upstream, winning hedges, fast first tokens, a handful of
	// fleet errors).
	for _, r := range alerts {
		switch r.name {
		case "LLMHedgeHedgeRateAboveBudget":
			prom.expectData(t, "alert "+r.name, r.expr, routes)
		case "LLMHedgeFleetDown":
			prom.expectData(t, "alert "+r.name, r.expr, nil)
		default:
			prom.expectNoError(t, "alert "+r.name, r.expr)
		}
	}
	// Dashboard queries.
	_, qs := loadDashboard(t)
	for _, q := range qs {
		expr := grafanaVariables.Replace(q.expr)
		what := fmt.Sprintf("panel %q query %s", q.panel, q.refID)
		switch {
		case strings.Contains(expr, "route"):
			prom.expectData(t, what, expr, routes)
		default:
			prom.expectData(t, what, expr, nil)
		}
	}
}

// sendTraffic sends n streaming chat requests through front, four at a
// time; with keyedOnly every one has an idempotency key of its own (which
// the fleet shares), else one in six has. Every other one finds upstream A slow (150 ms to its first token,
// the hedge delay is 20 ms), so hedges start, win and cancel A; one in
// three of those may not be sent twice, and its hedge is denied. The
// proxies run without a hedge budget, so the hedge rate (about 1/3) is
// above the rules' budget of 0.1 and the budget alert's expression has
// data.
func sendTraffic(t *testing.T, front, route, tag string, n int, keyedOnly bool) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 4)
	for i := 0; i < n; i++ {
		i := i
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			// A stored request without an idempotency key is not sent
			// twice: its hedge is denied (not_idempotent).
			store := i%6 == 4
			body := fmt.Sprintf(`{"model":"gpt-sim","stream":true,"store":%t,"messages":[{"role":"user","content":"request %d of %s: %s"}]}`,
				store, i, tag, strings.Repeat("padding ", 40))
			req, err := http.NewRequest(http.MethodPost, front+"/v1/chat/completions", strings.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			req.Header.Set("Content-Type", "application/json")
			// The client asks for a check no simulated answer passes
			// (its text is not JSON): every attempt's answer is invalid.
			invalid := !keyedOnly && i%6 == 3
			if invalid {
				req.Header.Set("X-LLM-Hedge-Validate", "json")
			}
			if keyedOnly || i%6 == 1 {
				req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%s-%d", route, strings.ReplaceAll(tag, " ", "-"), i))
			}
			if i%2 == 0 {
				req.Header.Set(llmsim.HeaderBehavior, "A=ttft:150ms")
			}
			resp, err := client.Do(req)
			if err != nil {
				errs <- fmt.Errorf("%s request %d: %v", route, i, err)
				return
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if invalid {
				if err != nil || resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("%s request %d (every answer invalid): status %d, read error %v", route, i, resp.StatusCode, err)
				}
				return
			}
			if err != nil || resp.StatusCode != http.StatusOK || !bytes.Contains(got, []byte("[DONE]")) {
				errs <- fmt.Errorf("%s request %d: status %d, %d bytes, read error %v", route, i, resp.StatusCode, len(got), err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// hedgeSettings are the same on every proxy.
const hedgeDelay = "20ms"

// startCaddy runs the real Caddy with a hedged site and returns the site's
// URL and the admin API's (which serves /metrics).
func startCaddy(t *testing.T, upA, upB string) (site, admin string) {
	bin, err := caddybin.Path()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	adminPort, sitePort := proc.FreePort(t), proc.FreePort(t)
	caddyfile := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
	metrics
}
http://127.0.0.1:%d {
	llm_hedge {
		route caddy
		upstream %s {
			name A
		}
		upstream %s {
			name B
		}
		delay %s
		budget {
			ratio -1
		}
	}
}
`, adminPort, sitePort, upA, upB, hedgeDelay)
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
	return site, admin
}

// startTraefik runs the real Traefik v3.6.12 (examples/traefik/build-traefik.sh)
// with this checkout as a local plugin and returns its web entry point,
// which also answers the plugin's metricsPath.
func startTraefik(t *testing.T, upA, upB string) string {
	bin := traefikbin.Binary(t)
	dir := t.TempDir()
	traefikbin.LayoutPlugin(t, dir)
	web, ping := proc.FreePort(t), proc.FreePort(t)
	dynamic := fmt.Sprintf(`http:
  routers:
    llm:
      rule: "PathPrefix(%[1]s/%[1]s)"
      entryPoints: [web]
      middlewares: [hedge]
      service: noop@internal
  middlewares:
    hedge:
      plugin:
        llmhedge:
          route: traefik
          upstreams:
            - {name: A, url: %q}
            - {name: B, url: %q}
          delay: %s
          budget: {ratio: -1}
          metricsPath: /llmhedge/metrics
`, "`", upA, upB, hedgeDelay)
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
func startEnvoyServer(t *testing.T, upA, upB, fleetURL string) (front, metrics string) {
	config := fmt.Sprintf(`fleet: {url: %q, timeout: 100ms}
grpc:
  listen: 127.0.0.1:0
metrics:
  listen: 127.0.0.1:0
routes:
  - name: envoy
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: A, url: %q}, {name: B, url: %q}]
    delay: %s
    budget: {ratio: -1}
`, fleetURL, upA, upB, hedgeDelay)
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
// readyURL answers 200 (Traefik interprets the plugin first: up to 180 s
// on a loaded machine).
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
	const wait = 180 * time.Second
	deadline := time.Now().Add(wait)
	for {
		select {
		case <-exited:
			t.Fatalf("%s exited during startup:\n%s", name, proc.Tail(logs.String(), 40))
		default:
		}
		resp, err := http.Get(readyURL)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return logs
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s did not answer 200 within %v (last error %v):\n%s", name, readyURL, wait, err, proc.Tail(logs.String(), 40))
		}
		time.Sleep(50 * time.Millisecond) // polling a process we do not control
	}
}

// prometheus is a running Prometheus.
type prometheus struct {
	url  string
	logs *proc.Buffer
}

// startPrometheus runs Prometheus with a generated configuration: the
// rules, scrape and rule evaluation every second, one job per target
// (job name → metrics URL), storage in a temporary folder.
func startPrometheus(t *testing.T, bin, rules string, targets map[string]string) *prometheus {
	dir := t.TempDir()
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files:\n  - %q\nscrape_configs:\n", rules)
	jobs := make([]string, 0, len(targets))
	for job := range targets {
		jobs = append(jobs, job)
	}
	sort.Strings(jobs)
	for _, job := range jobs {
		u, err := url.Parse(targets[job])
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&cfg, "  - job_name: %s\n    metrics_path: %q\n    static_configs:\n      - targets: [%q]\n", job, u.Path, u.Host)
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
