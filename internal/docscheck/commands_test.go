package docscheck

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadmeCommands accounts for every command of the shell blocks of the
// repository's Markdown files. Each is placed by one of commandRules: run
// here as written (the quick, offline ones: the builds, the Traefik plugin
// layout, and the Envoy server's try-it session with its curl), run by a
// named test of its own (commands against a proxy or a Redis that test
// starts), or not run by a test, with why (the suite itself, opt-in
// benchmarks, placeholders). A command no rule places fails the test, so
// a README cannot gain an unchecked command. With -short it only places
// them; the runs start processes.
func TestReadmeCommands(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var runs []placed
	for _, c := range readmeCommands(t, root) {
		r := ruleFor(c.text)
		switch {
		case r == nil:
			t.Errorf("%s:%d: command %q is placed by no rule of commandRules: run it here, name the test that runs it, or say why no test can", c.file, c.line, c.text)
		case r.test != "":
			if !testExists(t, root, r.dir, r.test) {
				t.Errorf("%s:%d: %q is said to be run by %s in %s, which does not exist", c.file, c.line, c.text, r.test, r.dir)
			}
		case r.run != nil:
			runs = append(runs, placed{c, r})
		}
	}
	if testing.Short() {
		t.Skip("placed every command; running them starts processes")
	}
	// Run each distinct command once, in the rules' order: builds, then
	// servers, then what talks to them.
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].rule.order < runs[j].rule.order })
	done := map[string]bool{}
	s := &session{t: t, root: root}
	for _, p := range runs {
		if done[p.cmd.text] {
			continue
		}
		done[p.cmd.text] = true
		t.Logf("%s:%d: %s", p.cmd.file, p.cmd.line, p.cmd.text)
		p.rule.run(s, p.cmd)
	}
}

// command is one command of a Markdown shell block, continuation lines
// joined and its trailing comment cut.
type command struct {
	file string
	line int
	text string
}

type placed struct {
	cmd  command
	rule *commandRule
}

// commandRule places the commands its pattern matches: run (in order) by
// this test, or run by test in package folder dir, or not run, for why.
type commandRule struct {
	pattern *regexp.Regexp
	order   int
	run     func(s *session, c command)
	dir     string
	test    string
	why     string
}

// The Envoy try-it session's addresses (examples/envoy/llmhedge-extproc-sim.yaml,
// examples/envoy-standin, the demo's -sim-only defaults).
const (
	simA, simB     = "127.0.0.1:9001", "127.0.0.1:9002"
	extprocGRPC    = "127.0.0.1:50051"
	standinAddress = "127.0.0.1:8083"
)

var commandRules = []commandRule{
	{pattern: re(`^go build -o (llmhedge-extproc|llmhedge-ctl) \./(envoyfilter/cmd/llmhedge-extproc|cmd/llmhedge-ctl)$`), order: 0, run: runBuild},
	{pattern: re(`^go run \./examples/demo -sim-only &$`), order: 1, run: serve(simA, simB)},
	{pattern: re(`^\./llmhedge-extproc -config examples/envoy/llmhedge-extproc-sim\.yaml &$`), order: 2, run: serve(extprocGRPC)},
	{pattern: re(`^go run \./examples/envoy-standin$`), order: 3, run: serve(standinAddress)},
	{pattern: re(`^\./llmhedge-extproc -version$`), order: 4, run: runExpect("llmhedge-extproc")},
	{pattern: re(`^curl -sN -D - localhost:8083/v1/chat/completions .*X-Sim-Behavior: A=ttft:3s`), order: 5, run: runExpect("X-Sim-Upstream: B", "200")},
	{pattern: re(`^go run \./cmd/llmhedge-tune -endpoint name=A,url=http://127\.0\.0\.1:9001,`), order: 5, run: runTune},
	// The Traefik plugin layout, in a mirror of the checkout (ln -s fails
	// where a layout exists already).
	{pattern: re(`^cd examples/traefik$`), order: 6, run: runTraefikLayout},
	{pattern: re(`^mkdir -p plugins-local/src/github\.com/llmhedge$`), order: 6, run: nothingMore},
	{pattern: re(`^ln -s "\$\(cd \.\./\.\. && pwd\)" plugins-local/src/github\.com/llmhedge/llmhedge$`), order: 6, run: nothingMore},

	{pattern: re(`^traefik=\$\(\./build-traefik\.sh\)$`), dir: "traefikplugin/e2e", test: "TestExampleRunsInTraefik"},
	{pattern: re(`^\$traefik --configFile=traefik-local\.yml$`), dir: "traefikplugin/e2e", test: "TestExampleRunsInTraefik"},
	{pattern: re(`^curl -sN -D - localhost:8081/`), dir: "caddymodule/e2e", test: "TestExampleCaddyfile"},
	{pattern: re(`^\./llmhedge-extproc -config examples/envoy/llmhedge-extproc\.yaml$`), dir: "envoyfilter", test: "TestEnvoyExampleValidates"},
	{pattern: re(`^curl -s (-X POST )?localhost:2019/llm_hedge/switch`), dir: "caddymodule/e2e", test: "TestAdminSwitchSetListedAndKeptAcrossReload"},
	{pattern: re(`^(J='Content-Type: application/json'|curl -s (-X POST )?127\.0\.0\.1:9902/switch)`), dir: "envoyfilter", test: "TestAdminListenerSwitchSurvivesReload"},
	{pattern: re(`^llmhedge-ctl -fleet redis://redis:6379/0 .*(status|pause|resume|set-delay)`), dir: "cmd/llmhedge-ctl", test: "TestPauseResumeSetDelayWriteTheFleetSwitch"},
	{pattern: re(`^go run \./examples/demo -sim-only$`), dir: "examples/demo", test: "TestSimOnlyFixedPorts"},
	{pattern: re(`^go run \./examples/demo( |$)`), dir: "examples/demo", test: "TestDemoRuns"},

	{pattern: re(`^make (test|yaegi)$`), why: "the suite itself (what CI runs)"},
	{pattern: re(`^(LLMHEDGE_\w+=\S+ )*go test `), why: "the tests and opt-in benchmarks, run by make test or by hand"},
	{pattern: re(`^export REDIS_PASSWORD=\.\.\.$`), why: "a placeholder for the operator's password"},
}

func re(s string) *regexp.Regexp { return regexp.MustCompile(s) }

func ruleFor(text string) *commandRule {
	for i := range commandRules {
		if commandRules[i].pattern.MatchString(text) {
			return &commandRules[i]
		}
	}
	return nil
}

// readmeCommands returns the commands of every ```sh and ```bash block of
// the repository's Markdown files (in a block of `$ ` prompts, the prompted
// lines only).
func readmeCommands(t *testing.T, root string) []command {
	t.Helper()
	block := regexp.MustCompile("(?ms)^```(sh|bash)\n(.*?)^```")
	var out []command
	for _, f := range markdownFiles(t, root) {
		text := readFile(t, f)
		rel, _ := filepath.Rel(root, f)
		for _, m := range block.FindAllStringSubmatchIndex(text, -1) {
			body := text[m[4]:m[5]]
			first := strings.Count(text[:m[4]], "\n") + 1
			prompted := strings.Contains("\n"+body, "\n$ ")
			lines := strings.Split(body, "\n")
			for i := 0; i < len(lines); i++ {
				line, at := lines[i], first+i
				for strings.HasSuffix(strings.TrimSpace(line), "\\") && i+1 < len(lines) {
					i++
					line = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(line), "\\")) + " " + strings.TrimSpace(lines[i])
				}
				if prompted {
					if !strings.HasPrefix(line, "$ ") {
						continue
					}
					line = line[2:]
				}
				if cmd := cutComment(line); cmd != "" {
					out = append(out, command{rel, at, cmd})
				}
			}
		}
	}
	return out
}

// cutComment drops a line's trailing comment (two spaces or more, then #)
// and its surrounding space.
func cutComment(line string) string {
	if i := strings.Index(line, "  #"); i >= 0 {
		line = line[:i]
	}
	if strings.HasPrefix(strings.TrimSpace(line), "#") {
		return ""
	}
	return strings.TrimSpace(line)
}

// testExists reports whether package folder dir has a test function name.
func testExists(t *testing.T, root, dir, name string) bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, dir, "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.Contains(readFile(t, f), "\nfunc "+name+"(t *testing.T) {") {
			return true
		}
	}
	return false
}

// session runs commands as a user would from the clone's root: servers
// stay up (each in a process group of its own, stopped when the test ends)
// for the commands that follow.
type session struct {
	t    *testing.T
	root string
}

// shell runs c's text with sh from the root and returns its output.
func (s *session) shell(c command) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", c.text)
	cmd.Dir = s.root
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("%s:%d: %q failed: %v\n%s", c.file, c.line, c.text, err, out)
	}
	return string(out)
}

// runBuild builds as written, into the root; the binary is removed at the
// end unless it was there before.
func runBuild(s *session, c command) {
	bin := filepath.Join(s.root, strings.Fields(c.text)[3])
	if _, err := os.Stat(bin); os.IsNotExist(err) {
		s.t.Cleanup(func() { os.Remove(bin) })
	}
	s.shell(c)
}

// runTune runs the tuning tool as written against the session's simulated
// upstreams; its output folder (the default, in the root) is removed at the
// end unless it was there before.
func runTune(s *session, c command) {
	out := filepath.Join(s.root, "llmhedge-tune-out")
	if _, err := os.Stat(out); os.IsNotExist(err) {
		s.t.Cleanup(func() { os.RemoveAll(out) })
	}
	runExpect("p99")(s, c)
}

// runExpect runs the command and checks its output holds each of want.
func runExpect(want ...string) func(s *session, c command) {
	return func(s *session, c command) {
		out := s.shell(c)
		for _, w := range want {
			if !strings.Contains(out, w) {
				s.t.Errorf("%s:%d: %q printed %q, want it to contain %q", c.file, c.line, c.text, out, w)
			}
		}
	}
}

// serve starts a command that serves (its trailing & dropped) and waits
// until each of addrs accepts connections; the addresses must be free
// before (a try-it set-up of one's own still running would answer instead).
func serve(addrs ...string) func(s *session, c command) {
	return func(s *session, c command) {
		for _, a := range addrs {
			if conn, err := net.Dial("tcp", a); err == nil {
				conn.Close()
				s.t.Fatalf("%s:%d: %s is in use before %q starts: stop what listens there", c.file, c.line, a, c.text)
			}
		}
		cmd := exec.Command("sh", "-c", "exec "+strings.TrimSuffix(c.text, " &"))
		cmd.Dir = s.root
		var output bytes.Buffer
		cmd.Stdout = &output
		cmd.Stderr = &output
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			s.t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		s.t.Cleanup(func() {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			<-exited
		})
		for _, a := range addrs {
			waitListening(s.t, c, a, exited, &output)
		}
	}
}

// waitListening waits until addr accepts a connection, failing when the
// command exits first or does not listen within a generous bound (a cold
// `go run` compiles first).
func waitListening(t *testing.T, c command, addr string, exited chan error, output *bytes.Buffer) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return
		}
		select {
		case err := <-exited:
			t.Fatalf("%s:%d: %q exited (%v) before listening on %s:\n%s", c.file, c.line, c.text, err, addr, output.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s:%d: %q does not listen on %s after 5 minutes:\n%s", c.file, c.line, c.text, addr, output.String())
		}
	}
}

// runTraefikLayout runs the three lines of the Traefik plugin's local
// layout as written, in a mirror of the checkout (every entry a link to the
// real one, examples/traefik a copy), and checks that the plugin's module
// is found through the link.
func runTraefikLayout(s *session, c command) {
	mirror := s.t.TempDir()
	mirrorEntries(s.t, s.root, mirror, "examples")
	mirrorEntries(s.t, filepath.Join(s.root, "examples"), filepath.Join(mirror, "examples"), "traefik")
	src, dst := filepath.Join(s.root, "examples", "traefik"), filepath.Join(mirror, "examples", "traefik")
	if out, err := exec.Command("cp", "-R", src, dst).CombinedOutput(); err != nil {
		s.t.Fatalf("copying examples/traefik: %v\n%s", err, out)
	}
	os.RemoveAll(filepath.Join(dst, "plugins-local"))
	script := "cd examples/traefik && mkdir -p plugins-local/src/github.com/llmhedge && " +
		`ln -s "$(cd ../.. && pwd)" plugins-local/src/github.com/llmhedge/llmhedge`
	cmd := exec.Command("sh", "-c", script)
	cmd.Dir = mirror
	if out, err := cmd.CombinedOutput(); err != nil {
		s.t.Fatalf("%s:%d: the plugin layout failed: %v\n%s", c.file, c.line, err, out)
	}
	for _, f := range []string{".traefik.yml", "go.mod", "traefikplugin"} {
		if _, err := os.Stat(filepath.Join(dst, "plugins-local/src/github.com/llmhedge/llmhedge", f)); err != nil {
			s.t.Errorf("%s:%d: after the layout, plugins-local/src/github.com/llmhedge/llmhedge/%s: %v", c.file, c.line, f, err)
		}
	}
}

// nothingMore: the command runs within another rule's run.
func nothingMore(*session, command) {}

// mirrorEntries fills dir with a link to each entry of from but except.
func mirrorEntries(t *testing.T, from, dir, except string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == except {
			continue
		}
		if err := os.Symlink(filepath.Join(from, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}
