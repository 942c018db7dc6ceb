package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/lightload"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
	"github.com/llmhedge/llmhedge/internal/testkit/traefikbin"
)

// The harness builds (or reuses) the real Traefik binary, lays out the
// repository as a local plugin in a temporary working directory, and runs
// Traefik there with a file provider it can rewrite (providers.file.watch).

const moduleName = traefikbin.ModulePath

// repoRoot is the module root, two folders up from this package.
func repoRoot(t testing.TB) string {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// traefik is a running Traefik process.
type traefik struct {
	t       testing.TB
	dir     string
	dynPath string
	URL     string // the web entry point, e.g. http://127.0.0.1:41234
	cmd     *exec.Cmd
	logs    *proc.Buffer
	exited  chan struct{}
}

// extraPlugin is another local plugin for comparisons, given as source.
type extraPlugin struct {
	alias, module string
	manifest      string            // .traefik.yml
	files         map[string]string // file name -> Go source, in the module root
}

// startTraefik starts Traefik with the plugin (and extras) loaded locally,
// logging at logLevel, serving the dynamic configuration d, and returns once
// d is in force.
func startTraefik(t testing.TB, logLevel string, d *dynamic, extras ...extraPlugin) *traefik {
	tr, _ := launchTraefik(t, logLevel, d, false, extras...)
	return tr
}

// launchTraefik starts Traefik with this repository as a local plugin, the
// extra plugins, a "web" entry point for traffic and a loopback "traefik"
// entry point for ping and, with debugAPI, Traefik's API with its debug
// (pprof) endpoints.
func launchTraefik(t testing.TB, logLevel string, d *dynamic, debugAPI bool, extras ...extraPlugin) (*traefik, string) {
	bin := traefikbin.Binary(t)
	dir := t.TempDir()
	traefikbin.LayoutPlugin(t, dir)
	var extraStatic strings.Builder
	for _, p := range extras {
		root := filepath.Join(dir, "plugins-local", "src", filepath.FromSlash(p.module))
		files := map[string]string{".traefik.yml": p.manifest}
		for name, src := range p.files {
			files[name] = src
		}
		for name, content := range files {
			proc.WriteFile(t, filepath.Join(root, name), []byte(content))
		}
		fmt.Fprintf(&extraStatic, "    %s:\n      moduleName: %s\n", p.alias, p.module)
	}
	web, admin := proc.FreePort(t), proc.FreePort(t)
	adminURL := fmt.Sprintf("http://127.0.0.1:%d", admin)
	tr := &traefik{t: t, dir: dir, dynPath: filepath.Join(dir, "dynamic", "dynamic.yml"),
		URL: fmt.Sprintf("http://127.0.0.1:%d", web), logs: &proc.Buffer{}, exited: make(chan struct{})}
	if err := os.MkdirAll(filepath.Dir(tr.dynPath), 0o755); err != nil {
		t.Fatal(err)
	}
	api := ""
	if debugAPI {
		api = "api:\n  insecure: true\n  dashboard: false\n  debug: true\n"
	}
	static := fmt.Sprintf(`entryPoints:
  web:
    address: "127.0.0.1:%d"
  traefik:
    address: "127.0.0.1:%d"
%sping:
  entryPoint: traefik
providers:
  file:
    filename: %q
    watch: true
experimental:
  localPlugins:
    llmhedge:
      moduleName: %s
%slog:
  level: %s
  noColor: true
global:
  checkNewVersion: false
  sendAnonymousUsage: false
`, web, admin, api, tr.dynPath, moduleName, extraStatic.String(), logLevel)
	tr.writeDynamic(d)
	tr.run(bin, static)
	tr.waitFor(adminURL + "/ping")
	tr.waitReady(d)
	return tr, adminURL
}

// run writes the static configuration into tr.dir and starts Traefik there
// (local plugins are read from ./plugins-local).
func (tr *traefik) run(bin, static string, env ...string) {
	t := tr.t
	if err := os.WriteFile(filepath.Join(tr.dir, "traefik.yml"), []byte(static), 0o644); err != nil {
		t.Fatal(err)
	}
	tr.cmd = exec.Command(bin, "--configFile="+filepath.Join(tr.dir, "traefik.yml"))
	tr.cmd.Dir = tr.dir
	tr.cmd.Env = append(os.Environ(), env...)
	tr.cmd.Stdout, tr.cmd.Stderr = tr.logs, tr.logs
	if err := tr.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		tr.cmd.Wait()
		close(tr.exited)
	}()
	t.Cleanup(tr.stop)
}

// cpuTime returns the CPU time Traefik has used so far (user + system),
// from /proc; it is how the benchmarks price work on a shared machine,
// where wall-clock throughput also measures the neighbours.
func (tr *traefik) cpuTime() time.Duration {
	d, err := lightload.ProcessCPU(tr.cmd.Process.Pid)
	if err != nil {
		tr.t.Fatalf("reading Traefik's CPU time: %v", err)
	}
	return d
}

// stop terminates Traefik and waits for it.
func (tr *traefik) stop() {
	proc.Stop(tr.cmd.Process, tr.exited, 15*time.Second)
	if tr.t.Failed() {
		tr.t.Logf("traefik output (tail):\n%s", proc.Tail(tr.logs.String(), 6000))
	}
}

// writeDynamic replaces the dynamic configuration atomically, so the file
// watcher never reads half a file.
func (tr *traefik) writeDynamic(d *dynamic) {
	tmp := tr.dynPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(d.YAML()), 0o644); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.Rename(tmp, tr.dynPath); err != nil {
		tr.t.Fatal(err)
	}
}

// reload writes d and returns once Traefik serves it.
func (tr *traefik) reload(d *dynamic) {
	tr.writeDynamic(d)
	tr.waitReady(d)
}

// waitReady polls d's readiness route, which exists only in d.
func (tr *traefik) waitReady(d *dynamic) {
	tr.waitFor(tr.URL + "/_ready/" + d.generation)
}

// waitFor waits until url answers 200, Traefik's own signal that it
// serves what url names; it fails with the command and Traefik's last log
// lines if Traefik exits first or never gets there (proc.ReadyTimeout:
// Traefik interprets the plugin at start, slow on a loaded machine).
func (tr *traefik) waitFor(url string) {
	tr.t.Helper()
	if err := proc.WaitReady(tr.cmd.Args, tr.exited, tr.logs.String, proc.HTTPReady(url)); err != nil {
		tr.t.Fatal(err)
	}
}

// waitLogLine returns the first output line of Traefik that is a plugin log
// line containing marker, polling until it appears (the plugin writes it
// when the request ends, which may be just after the client has read the
// last byte).
func (tr *traefik) waitLogLine(marker string) string {
	tr.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, l := range strings.Split(tr.logs.String(), "\n") {
			if i := strings.Index(l, `{"msg":"llmhedge request"`); i >= 0 && strings.Contains(l, marker) {
				return l[i:]
			}
		}
		if time.Now().After(deadline) {
			tr.t.Fatalf("no plugin log line with %s in:\n%s", marker, proc.Tail(tr.logs.String(), 4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dynamic builds a Traefik dynamic configuration. Every route is a path
// prefix that is stripped before the route's middlewares, so upstreams see
// plain /v1/... paths.
type dynamic struct {
	generation  string
	routers     strings.Builder
	middlewares strings.Builder
	services    strings.Builder
}

func newDynamic(generation string) *dynamic {
	d := &dynamic{generation: generation}
	// The readiness route answers 200 from Traefik's own ping service.
	fmt.Fprintf(&d.routers, "    ready-%s:\n      rule: \"Path(`/_ready/%s`)\"\n      service: ping@internal\n", generation, generation)
	return d
}

// route serves /name through the named middlewares to service.
func (d *dynamic) route(name, service string, middlewares ...string) *dynamic {
	fmt.Fprintf(&d.middlewares, "    strip-%s:\n      stripPrefix:\n        prefixes: [\"/%s\"]\n", name, name)
	all := append([]string{"strip-" + name}, middlewares...)
	fmt.Fprintf(&d.routers, "    %s:\n      rule: \"PathPrefix(`/%s/`)\"\n      entryPoints: [web]\n      service: %s\n      middlewares: [%s]\n",
		name, name, service, strings.Join(all, ", "))
	return d
}

// hedge adds a plugin middleware named name whose configuration is the YAML
// text cfg (unindented).
func (d *dynamic) hedge(name, cfg string) *dynamic {
	return d.plugin(name, "llmhedge", cfg)
}

// plugin adds a middleware named name of the local plugin alias.
func (d *dynamic) plugin(name, alias, cfg string) *dynamic {
	fmt.Fprintf(&d.middlewares, "    %s:\n      plugin:\n        %s:\n%s", name, alias, indent(cfg, "          "))
	return d
}

// loadBalancer adds a plain Traefik round-robin service over urls.
func (d *dynamic) loadBalancer(name string, urls ...string) *dynamic {
	fmt.Fprintf(&d.services, "    %s:\n      loadBalancer:\n        servers:\n", name)
	for _, u := range urls {
		fmt.Fprintf(&d.services, "          - url: %q\n", u)
	}
	return d
}

// YAML returns the configuration file.
func (d *dynamic) YAML() string {
	var b strings.Builder
	b.WriteString("http:\n  routers:\n")
	b.WriteString(d.routers.String())
	if d.middlewares.Len() > 0 {
		b.WriteString("  middlewares:\n")
		b.WriteString(d.middlewares.String())
	}
	if d.services.Len() > 0 {
		b.WriteString("  services:\n")
		b.WriteString(d.services.String())
	}
	return b.String()
}

func indent(s, prefix string) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		if strings.TrimSpace(line) != "" {
			b.WriteString(prefix)
			b.WriteString(line)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// pluginConfig renders the usual plugin configuration: the given upstreams
// (name=url pairs, in order) and extra option lines.
func pluginConfig(upstreams [][2]string, extra ...string) string {
	var b strings.Builder
	b.WriteString("upstreams:\n")
	for _, u := range upstreams {
		fmt.Fprintf(&b, "  - name: %s\n    url: %s\n", u[0], u[1])
	}
	for _, line := range extra {
		b.WriteString(line)
		b.WriteString("\n")
	}
	return b.String()
}
