package fleete2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/caddybin"
	"github.com/llmhedge/llmhedge/internal/testkit/fleetsuite"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
	"github.com/llmhedge/llmhedge/internal/testkit/traefikbin"
)

// The harness starts real Caddy and Traefik replicas serving the suite's
// routes: Caddy one site per route on a port of its own, Traefik one
// router per route under /<route>/ (a prefix stripped before the plugin).

// process is a started child process, stopped at the end of the test.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	out    *proc.Buffer
}

func run(t testing.TB, dir, bin string, args ...string) *process {
	p := &process{cmd: exec.Command(bin, args...), exited: make(chan struct{}), out: &proc.Buffer{}}
	p.cmd.Dir = dir
	p.cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		proc.Stop(p.cmd.Process, p.exited, 15*time.Second)
		if t.Failed() {
			out := p.out.String()
			// A panic's first lines say what failed; its stack's tail not.
			if i := strings.Index(out, "panic"); i >= 0 {
				t.Logf("%s output from its first panic:\n%s", filepath.Base(bin), head(out[max(0, i-300):], 3000))
			}
			t.Logf("%s output (tail):\n%s", filepath.Base(bin), proc.Tail(out, 3000))
		}
	})
	return p
}

// waitReady waits for the process's own signal that it serves (ready
// passes), failing with its command and last log lines if it exits first
// or never gets there within proc.ReadyTimeout.
func (p *process) waitReady(ready func() error) error {
	return proc.WaitReady(p.cmd.Args, p.exited, p.out.String, ready)
}

// head is the first n bytes of s.
func head(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// ---- Caddy ----

// caddyReplica is one Caddy process: its admin API and one port per route.
type caddyReplica struct {
	t        testing.TB
	name     string
	admin    string
	ports    map[string]int
	routes   []fleetsuite.RouteSpec
	redisURL string
	reloads  int
	p        *process
}

// caddySite renders route r as a Caddyfile site body.
func caddySite(r fleetsuite.RouteSpec, replica, redisURL string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\tllm_hedge {\n\t\troute %s\n", r.Name)
	for _, u := range r.Upstreams {
		fmt.Fprintf(&b, "\t\tupstream %s {\n\t\t\tname %s\n\t\t\theader_up %s %s\n", u.Sim.URL, u.Name, fleetsuite.ReplicaHeader, replica)
		if r.RouteKey {
			fmt.Fprintf(&b, "\t\t\theader_up Authorization \"%s\"\n", fleetsuite.RouteAuthorization)
		}
		b.WriteString("\t\t}\n")
	}
	fmt.Fprintf(&b, "\t\tdelay %s\n\t\tmax_attempts %d\n", r.Delay, r.MaxAttempts)
	if r.BudgetRatio < 0 {
		b.WriteString("\t\tbudget {\n\t\t\tratio off\n\t\t\tmax_concurrent_hedges off\n\t\t}\n")
	} else if r.BudgetRatio > 0 {
		fmt.Fprintf(&b, "\t\tbudget {\n\t\t\tratio %g\n\t\t\tburst %d\n", r.BudgetRatio, r.BudgetBurst)
		if r.SpendCapTokens > 0 {
			fmt.Fprintf(&b, "\t\t\tspend_cap_tokens_per_hour %d\n", r.SpendCapTokens)
		}
		b.WriteString("\t\t}\n")
	}
	for _, line := range r.Caddy {
		fmt.Fprintf(&b, "\t\t%s\n", line)
	}
	if r.Fleet {
		fmt.Fprintf(&b, "\t\tfleet %s {\n\t\t\ttimeout 250ms\n", redisURL)
		for _, line := range r.CaddyFleet {
			fmt.Fprintf(&b, "\t\t\t%s\n", line)
		}
		b.WriteString("\t\t}\n")
	}
	b.WriteString("\t}")
	return b.String()
}

// caddyfile is the whole configuration; generation changes a harmless
// global option so that a reload is a real new configuration.
func (c *caddyReplica) caddyfile(generation int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{\n\tadmin %s\n\tauto_https off\n\tpersist_config off\n\tdefault_bind 127.0.0.1\n\tgrace_period %dms\n\tmetrics\n\tlog {\n\t\toutput stderr\n\t\tformat json\n\t\tlevel ERROR\n\t}\n}\n",
		strings.TrimPrefix(c.admin, "http://"), 2000+generation)
	for _, r := range c.routes {
		fmt.Fprintf(&b, "http://127.0.0.1:%d {\n%s\n}\n", c.ports[r.Name], caddySite(r, c.name, c.redisURL))
	}
	return b.String()
}

// launchCaddy starts a Caddy process serving routes; waitReady waits for it.
func launchCaddy(t testing.TB, name string, routes []fleetsuite.RouteSpec, redisURL string) *caddyReplica {
	t.Helper()
	bin := caddybin.Binary(t)
	dir := t.TempDir()
	c := &caddyReplica{t: t, name: name, admin: fmt.Sprintf("http://127.0.0.1:%d", proc.FreePort(t)), ports: map[string]int{}, routes: routes, redisURL: redisURL}
	for _, r := range routes {
		c.ports[r.Name] = proc.FreePort(t)
	}
	config := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(config, []byte(c.caddyfile(0)), 0o644); err != nil {
		t.Fatal(err)
	}
	c.p = run(t, dir, bin, "run", "--config", config, "--adapter", "caddyfile")
	return c
}

func (c *caddyReplica) waitReady() {
	checks := []func() error{proc.HTTPReady(c.admin + "/config/")}
	for _, r := range c.routes {
		checks = append(checks, proc.PortReady("127.0.0.1:"+strconv.Itoa(c.ports[r.Name])))
	}
	if err := c.p.waitReady(proc.AllReady(checks...)); err != nil {
		c.t.Fatal(err)
	}
}

func (c *caddyReplica) replica() fleetsuite.Replica {
	return fleetsuite.Replica{Name: c.name, Kind: "caddy",
		URL:     func(route string) string { return "http://127.0.0.1:" + strconv.Itoa(c.ports[route]) },
		PID:     func() int { return c.p.cmd.Process.Pid },
		Metrics: func() (string, error) { return get(c.admin + "/metrics") },
		Reload:  c.reload}
}

// reload posts a new generation of the configuration to the admin API.
func (c *caddyReplica) reload() error {
	c.reloads++
	req, _ := http.NewRequest(http.MethodPost, c.admin+"/load", strings.NewReader(c.caddyfile(c.reloads)))
	req.Header.Set("Content-Type", "text/caddyfile")
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("caddy %s: POST /load: %d %s", c.name, resp.StatusCode, body)
	}
	return nil
}

// get returns url's body (a fresh connection: a reload may have replaced
// the server behind a kept-alive one).
func get(url string) (string, error) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, proc.Tail(string(body), 300))
	}
	return string(body), err
}

// ---- Traefik ----

const moduleName = traefikbin.ModulePath

// traefikReplica is one Traefik process with a watched dynamic file.
type traefikReplica struct {
	t          testing.TB
	name       string
	url        string
	ping       string
	dynPath    string
	routes     []fleetsuite.RouteSpec
	redisURL   string
	generation int
	p          *process
}

// pluginConfig renders route r as the plugin's YAML options (unindented).
func pluginConfig(r fleetsuite.RouteSpec, replica, redisURL string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "route: %s\nupstreams:\n", r.Name)
	for _, u := range r.Upstreams {
		fmt.Fprintf(&b, "  - name: %s\n    url: %s\n    setHeaders:\n      %s: %s\n", u.Name, u.Sim.URL, fleetsuite.ReplicaHeader, replica)
		if r.RouteKey {
			fmt.Fprintf(&b, "      Authorization: %q\n", fleetsuite.RouteAuthorization)
		}
	}
	fmt.Fprintf(&b, "delay: %s\nmaxAttempts: %d\nlog: off\nmetricsPath: /llmhedge/metrics\n", r.Delay, r.MaxAttempts)
	if r.BudgetRatio < 0 {
		b.WriteString("budget:\n  ratio: -1\n  maxConcurrentHedges: -1\n")
	} else if r.BudgetRatio > 0 {
		fmt.Fprintf(&b, "budget:\n  ratio: %g\n  burst: %d\n", r.BudgetRatio, r.BudgetBurst)
		if r.SpendCapTokens > 0 {
			fmt.Fprintf(&b, "  spendCapTokensPerHour: %d\n", r.SpendCapTokens)
		}
	}
	for _, line := range r.Traefik {
		b.WriteString(line + "\n")
	}
	if r.Fleet {
		fmt.Fprintf(&b, "fleet:\n  url: %s\n  timeout: 250ms\n", redisURL)
		for _, line := range r.TraefikFleet {
			b.WriteString("  " + line + "\n")
		}
	}
	return b.String()
}

// dynamic renders the dynamic configuration of generation g: the routes
// and a readiness route /_ready/<g> that exists only in it.
func (tr *traefikReplica) dynamic(g int) string {
	var routers, middlewares strings.Builder
	fmt.Fprintf(&routers, "    ready-%d:\n      rule: \"Path(`/_ready/%d`)\"\n      service: ping@internal\n", g, g)
	for _, r := range tr.routes {
		fmt.Fprintf(&middlewares, "    strip-%s:\n      stripPrefix:\n        prefixes: [\"/%s\"]\n", r.Name, r.Name)
		fmt.Fprintf(&middlewares, "    hedge-%s:\n      plugin:\n        llmhedge:\n", r.Name)
		for _, line := range strings.Split(strings.TrimRight(pluginConfig(r, tr.name, tr.redisURL), "\n"), "\n") {
			middlewares.WriteString("          " + line + "\n")
		}
		fmt.Fprintf(&routers, "    %s:\n      rule: \"PathPrefix(`/%s/`)\"\n      entryPoints: [web]\n      service: noop@internal\n      middlewares: [strip-%s, hedge-%s]\n",
			r.Name, r.Name, r.Name, r.Name)
	}
	return "http:\n  routers:\n" + routers.String() + "  middlewares:\n" + middlewares.String()
}

func (tr *traefikReplica) writeDynamic() {
	tmp := tr.dynPath + ".tmp"
	proc.WriteFile(tr.t, tmp, []byte(tr.dynamic(tr.generation)))
	if err := os.Rename(tmp, tr.dynPath); err != nil {
		tr.t.Fatal(err)
	}
}

// launchTraefik starts a Traefik process serving routes; waitReady waits
// for it.
func launchTraefik(t testing.TB, name string, routes []fleetsuite.RouteSpec, redisURL string) *traefikReplica {
	t.Helper()
	bin := traefikbin.Binary(t)
	dir := t.TempDir()
	traefikbin.LayoutPlugin(t, dir)
	web, ping := proc.FreePort(t), proc.FreePort(t)
	tr := &traefikReplica{t: t, name: name, url: fmt.Sprintf("http://127.0.0.1:%d", web), dynPath: filepath.Join(dir, "dynamic", "dynamic.yml"),
		ping: fmt.Sprintf("http://127.0.0.1:%d/ping", ping), routes: routes, redisURL: redisURL}
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
    watch: true
experimental:
  localPlugins:
    llmhedge:
      moduleName: %s
log:
  level: WARN
  noColor: true
global:
  checkNewVersion: false
  sendAnonymousUsage: false
`, web, ping, tr.dynPath, moduleName)
	proc.WriteFile(t, filepath.Join(dir, "traefik.yml"), []byte(static))
	tr.writeDynamic()
	tr.p = run(t, dir, bin, "--configFile="+filepath.Join(dir, "traefik.yml"))
	return tr
}

// waitReady waits until tr serves: its ping endpoint answers and the first
// generation's readiness route exists.
func (tr *traefikReplica) waitReady() error {
	return tr.p.waitReady(proc.AllReady(proc.HTTPReady(tr.ping), proc.HTTPReady(tr.url+"/_ready/0")))
}

func (tr *traefikReplica) replica() fleetsuite.Replica {
	return fleetsuite.Replica{Name: tr.name, Kind: "traefik",
		URL: func(route string) string { return tr.url + "/" + route },
		PID: func() int { return tr.p.cmd.Process.Pid },
		// The plugin's counters are process-wide: any route's metricsPath
		// shows every route (one without the fleet, which a scrape does
		// not attach).
		Metrics: func() (string, error) { return get(tr.url + "/" + tr.scrapeRoute() + "/llmhedge/metrics") },
		Reload:  tr.reload}
}

// scrapeRoute is the first route without the fleet, else the first.
func (tr *traefikReplica) scrapeRoute() string {
	for _, r := range tr.routes {
		if !r.Fleet {
			return r.Name
		}
	}
	return tr.routes[0].Name
}

// reload rewrites the dynamic configuration (a new generation: Traefik
// re-creates every plugin instance) and waits until the new one serves.
func (tr *traefikReplica) reload() error {
	tr.generation++
	tr.writeDynamic()
	return tr.p.waitReady(proc.HTTPReady(tr.url + "/_ready/" + strconv.Itoa(tr.generation)))
}

// startFleet starts 3 Caddy and 2 Traefik replicas of the suite's routes:
// every process is launched first and waited for after, so that the two
// Traefik starts (the plugin interpreted at start) overlap.
func startFleet(t *testing.T, s *fleetsuite.Acceptance) []fleetsuite.Replica {
	t.Helper()
	routes, url := s.Routes(), s.RedisURL()
	var caddies []*caddyReplica
	var traefiks []*traefikReplica
	for i := 1; i <= 3; i++ {
		caddies = append(caddies, launchCaddy(t, fmt.Sprintf("caddy-%d", i), routes, url))
	}
	for i := 1; i <= 2; i++ {
		traefiks = append(traefiks, launchTraefik(t, fmt.Sprintf("traefik-%d", i), routes, url))
	}
	var out []fleetsuite.Replica
	for _, c := range caddies {
		c.waitReady()
		out = append(out, c.replica())
	}
	for i, tr := range traefiks {
		if err := tr.waitReady(); err != nil {
			// Seen once on the shared machine: Traefik gone at start
			// without a word. A fresh start (new ports) settles it.
			t.Logf("%s did not start, starting it again: %v", tr.name, err)
			tr = launchTraefik(t, tr.name, routes, url)
			traefiks[i] = tr
			if err := tr.waitReady(); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, tr.replica())
	}
	return out
}
