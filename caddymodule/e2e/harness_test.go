package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/caddybin"
	"github.com/llmhedge/llmhedge/internal/testkit/lightload"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
)

// caddyBinary is the real Caddy with llm_hedge, built (or found in the
// cache) by TestMain, or the binary named by $LLMHEDGE_CADDY_BIN (e.g. one
// built with xcaddy).
var caddyBinary string

func TestMain(m *testing.M) {
	flag.Parse() // for testing.Short
	if testing.Short() {
		// Not a skip per test: caddy would be built before any test runs.
		fmt.Println("caddymodule/e2e: -short: every test here starts caddy; `make e2e` runs them")
		os.Exit(0)
	}
	bin, err := os.Getenv("LLMHEDGE_CADDY_BIN"), error(nil)
	if bin == "" {
		bin, err = caddybin.Path()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: cannot build caddy:", err)
		os.Exit(1)
	}
	caddyBinary = bin
	os.Exit(m.Run())
}

// stopTimeout bounds how long Caddy may take to stop gracefully (its start
// is bounded by proc.ReadyTimeout).
const stopTimeout = 30 * time.Second

// caddyProc is a running Caddy process serving one listener per site.
type caddyProc struct {
	t       testing.TB
	cmd     *exec.Cmd
	exited  chan struct{}
	dir     string
	logPath string
	admin   string   // http://127.0.0.1:<port>
	ports   []int    // one per site
	global  string   // extra global options
	sites   []string // the current site bodies
}

// caddyfile renders the whole Caddyfile: fixed global options (loopback
// only, no HTTPS, JSON logs on stderr, metrics on), extra global options,
// and one site per body on its own port.
func (c *caddyProc) caddyfile() string {
	var b strings.Builder
	fmt.Fprintf(&b, `{
	admin %s
	auto_https off
	persist_config off
	default_bind 127.0.0.1
	grace_period 2s
	metrics
	log {
		output stderr
		format json
		level INFO
	}
%s
}
`, strings.TrimPrefix(c.admin, "http://"), c.global)
	for i, body := range c.sites {
		fmt.Fprintf(&b, "http://127.0.0.1:%d {\n%s\n}\n", c.ports[i], body)
	}
	return b.String()
}

// startCaddy runs the real Caddy binary with the given global options and
// site bodies, waits until it serves, and stops it at the end of the test.
// The ports are picked free just before the start; if another process took
// one in between, Caddy is started again on fresh ports.
func startCaddy(t testing.TB, global string, sites ...string) *caddyProc {
	t.Helper()
	return startCaddyEnv(t, nil, global, sites...)
}

// startCaddyEnv is startCaddy with extra environment variables for the
// Caddy process (e.g. OTEL_* for its tracing handler's exporter).
func startCaddyEnv(t testing.TB, env []string, global string, sites ...string) *caddyProc {
	t.Helper()
	for try := 1; ; try++ {
		dir := t.TempDir()
		c := &caddyProc{t: t, dir: dir, global: global, sites: sites,
			admin: fmt.Sprintf("http://127.0.0.1:%d", proc.FreePort(t))}
		for range sites {
			c.ports = append(c.ports, proc.FreePort(t))
		}
		config := filepath.Join(dir, "Caddyfile")
		if err := os.WriteFile(config, []byte(c.caddyfile()), 0o644); err != nil {
			t.Fatal(err)
		}
		err := c.launch(config, env)
		if err == nil {
			return c
		}
		if try == 3 || !strings.Contains(c.logs(), "address already in use") {
			t.Fatal(err)
		}
	}
}

// launch runs `caddy run` on config with extra environment variables and
// waits until the admin API and every port in c.ports answer. Caddy is
// stopped at the end of the test. An error means Caddy exited during
// startup; its log says why.
func (c *caddyProc) launch(config string, env []string) error {
	t := c.t
	t.Helper()
	c.logPath = filepath.Join(c.dir, "caddy.log")
	c.exited = make(chan struct{})
	logFile, err := os.Create(c.logPath)
	if err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(caddyBinary, "run", "--config", config, "--adapter", "caddyfile")
	c.cmd.Dir = c.dir
	c.cmd.Env = append(append(os.Environ(), "HOME="+c.dir, "XDG_DATA_HOME="+c.dir, "XDG_CONFIG_HOME="+c.dir), env...)
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.cmd.Wait()
		logFile.Close()
		close(c.exited)
	}()
	t.Cleanup(c.stop)
	return c.waitReady()
}

// url returns the base URL of site i.
func (c *caddyProc) url(i int) string { return fmt.Sprintf("http://127.0.0.1:%d", c.ports[i]) }

// waitReady waits for Caddy's own signals that it serves: the admin API
// answers and every site's port accepts connections. An error (Caddy
// exited, or never got there within proc.ReadyTimeout) quotes the command
// and the log's last lines.
func (c *caddyProc) waitReady() error {
	checks := []func() error{proc.HTTPReady(c.admin + "/config/")}
	for i := range c.ports {
		checks = append(checks, proc.PortReady(strings.TrimPrefix(c.url(i), "http://")))
	}
	return proc.WaitReady(c.cmd.Args, c.exited, c.logs, proc.AllReady(checks...))
}

// stop asks Caddy to shut down gracefully, and kills it if it does not.
func (c *caddyProc) stop() {
	if !proc.Stop(c.cmd.Process, c.exited, stopTimeout) {
		c.t.Errorf("caddy did not stop on SIGTERM")
	}
}

// load replaces the running config through the admin API (POST /load with
// a Caddyfile), as an operator's reload does.
func (c *caddyProc) load(sites ...string) error {
	c.sites = sites
	req, err := http.NewRequest(http.MethodPost, c.admin+"/load", strings.NewReader(c.caddyfile()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("load: %d %s", resp.StatusCode, body)
	}
	// The old server closes its idle keep-alive connections: a request
	// sent on one of them gets EOF (see TestReloadUnderLoadLosesNoRequest),
	// and the SDK clients of most tests do not retry. Requests after a
	// reload dial afresh.
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	return nil
}

// logs returns everything Caddy wrote so far.
func (c *caddyProc) logs() string {
	data, _ := os.ReadFile(c.logPath)
	return string(data)
}

// logEntries returns Caddy's JSON log lines whose "msg" is msg.
func (c *caddyProc) logEntries(msg string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader([]byte(c.logs())))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var entry map[string]any
		if json.Unmarshal(sc.Bytes(), &entry) == nil && entry["msg"] == msg {
			out = append(out, entry)
		}
	}
	return out
}

// waitLog polls Caddy's log (an external process's file) until n lines
// with message msg match keep, and returns them.
func (c *caddyProc) waitLog(msg string, n int, keep func(map[string]any) bool) []map[string]any {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var found []map[string]any
		for _, e := range c.logEntries(msg) {
			if keep == nil || keep(e) {
				found = append(found, e)
			}
		}
		if len(found) >= n {
			return found
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%d of %d %q log lines after 10s:\n%s", len(found), n, msg, c.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metrics returns the admin API's /metrics text.
func (c *caddyProc) metrics() string {
	c.t.Helper()
	// A fresh connection: a config load may have replaced the admin server,
	// resetting a kept-alive one.
	req, _ := http.NewRequest(http.MethodGet, c.admin+"/metrics", nil)
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// rss returns the Caddy process's resident set size in bytes.
func (c *caddyProc) rss() int64 {
	c.t.Helper()
	n, err := proc.RSS(c.cmd.Process.Pid)
	if err != nil {
		c.t.Fatal(err)
	}
	return n
}

// cpuTime returns the CPU time (user + system) the Caddy process used so
// far, from /proc.
func (c *caddyProc) cpuTime() time.Duration {
	c.t.Helper()
	d, err := lightload.ProcessCPU(c.cmd.Process.Pid)
	if err != nil {
		c.t.Fatal(err)
	}
	return d
}

// testContext is a context bounded well below go test's own timeout.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// rawChatRequest is a raw streaming Chat Completions request to a site,
// tagged with the simulators' request id and behaviour ("" for none), for
// tests that look at the wire rather than through the SDK.
func rawChatRequest(siteURL, id, behavior string) *http.Request {
	req, _ := http.NewRequest(http.MethodPost, siteURL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(llmsim.HeaderRequest, id)
	if behavior != "" {
		req.Header.Set(llmsim.HeaderBehavior, behavior)
	}
	return req
}
