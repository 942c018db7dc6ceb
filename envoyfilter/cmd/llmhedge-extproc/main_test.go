package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
)

// The test binary doubles as the command: with this variable set it runs
// main() with the arguments in LLMHEDGE_EXTPROC_ARGS, so the tests drive a
// real process with real signals without a separate build.
const runMainEnv = "LLMHEDGE_EXTPROC_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		os.Args = append([]string{"llmhedge-extproc"}, strings.Fields(os.Getenv("LLMHEDGE_EXTPROC_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// process is the command running in a child process.
type process struct {
	cmd    *exec.Cmd
	logs   chan map[string]interface{}
	exited chan error
	output proc.Buffer // stdout, and stderr line by line
}

func start(t *testing.T, args ...string) *process {
	t.Helper()
	proc.SkipShort(t, "the command (this test binary) as a child process")
	p := &process{logs: make(chan map[string]interface{}, 256), exited: make(chan error, 1)}
	p.cmd = exec.Command(os.Args[0])
	p.cmd.Env = append(os.Environ(), runMainEnv+"=1", "LLMHEDGE_EXTPROC_ARGS="+strings.Join(args, " "))
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = &p.output
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.output.Write([]byte(sc.Text() + "\n"))
			var entry map[string]interface{}
			if json.Unmarshal(sc.Bytes(), &entry) == nil {
				p.logs <- entry
			}
		}
		close(p.logs)
		p.exited <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
		}
	})
	return p
}

func (p *process) out() string { return p.output.String() }

// waitLog returns the next log entry whose message is msg.
func (p *process) waitLog(t *testing.T, msg string) map[string]interface{} {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case e, ok := <-p.logs:
			if !ok {
				t.Fatalf("the process ended before logging %q:\n%s", msg, p.out())
			}
			if e["msg"] == msg {
				return e
			}
		case <-timeout:
			t.Fatalf("no %q log within 20s:\n%s", msg, p.out())
		}
	}
}

func (p *process) wait(t *testing.T) error {
	t.Helper()
	for range p.logs {
	}
	select {
	case err := <-p.exited:
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("the process did not exit:\n%s", p.out())
		return nil
	}
}

func writeConfig(t *testing.T, path, upstreamName, upstreamURL string) {
	t.Helper()
	cfg := `
grpc: {listen: "127.0.0.1:0"}
metrics: {listen: "127.0.0.1:0"}
shutdown: {drain_timeout: 1s, health_grace: 100ms}
routes:
  - name: chat
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: ` + upstreamName + `, url: "` + upstreamURL + `"}]
    delay: 10s
    early_headers: "off" # a held stream must still be unanswered at the drain deadline
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
}

type answer struct {
	text string
	from map[string]bool
	err  error
}

func streamChat(front string, id string) answer {
	c := openai.NewClient(option.WithBaseURL(front+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0),
		option.WithHeader(llmsim.HeaderRequest, id))
	stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	defer stream.Close()
	a := answer{from: map[string]bool{}}
	var text strings.Builder
	for stream.Next() {
		ch := stream.Current()
		a.from[ch.SystemFingerprint] = true
		if len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	a.text, a.err = text.String(), stream.Err()
	return a
}

// SIGHUP reloads without touching streams in flight; SIGTERM drains them:
// those that finish within drain_timeout finish, the rest are cancelled
// with their upstream attempts, and the process exits 0.
func TestSignalsReloadAndDrain(t *testing.T) {
	wl := llmsim.Reference(1, 0.05)
	wl.StallProb = -1 // off: stalls are scripted
	holdA, holdB := &llmsim.Holder{}, &llmsim.Holder{}
	a := (&llmsim.Server{Name: "A", Workload: wl, Behave: holdA.Behave}).Start()
	b := (&llmsim.Server{Name: "B", Workload: wl, Behave: holdB.Behave}).Start()
	defer a.Close()
	defer b.Close()
	releaseA := holdA.Hold("held-a")
	holdB.Hold("held-b") // never released

	path := filepath.Join(t.TempDir(), "extproc.yaml")
	writeConfig(t, path, "A", a.URL)
	p := start(t, "-config", path)
	serving := p.waitLog(t, "llmhedge-extproc serving")
	conn, err := grpc.NewClient(serving["grpc"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	driver := envoydriver.New(conn, envoydriver.Config{})
	front := httptest.NewServer(driver)
	defer front.Close()

	heldA := make(chan answer, 1)
	go func() { heldA <- streamChat(front.URL, "held-a") }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.WaitFor(ctx, func() bool { return a.Served() == 1 }); err != nil {
		t.Fatal("the first request never reached A")
	}

	writeConfig(t, path, "B", b.URL)
	p.cmd.Process.Signal(syscall.SIGHUP)
	p.waitLog(t, "configuration reloaded")
	if got := streamChat(front.URL, "new-b"); got.err != nil {
		t.Fatalf("after SIGHUP: stream error %v", got.err)
	} else if !got.from["B"] {
		t.Fatalf("after SIGHUP: chunks from %v, want B", got.from)
	} else if want := llmsim.ExpectedChatText("new-b", 20); got.text != want {
		t.Fatalf("after SIGHUP: text %q, want %q", got.text, want)
	}
	heldB := make(chan answer, 1)
	go func() { heldB <- streamChat(front.URL, "held-b") }()
	if err := b.WaitFor(ctx, func() bool { return b.Attempts("held-b") == 1 }); err != nil {
		t.Fatal("the second held request never reached B")
	}

	p.cmd.Process.Signal(syscall.SIGTERM)
	if d := p.waitLog(t, "draining"); d["streams"] != float64(2) {
		t.Fatalf("draining %v streams, want 2", d["streams"])
	}
	close(releaseA)
	if got := <-heldA; got.err != nil {
		t.Fatalf("the stream started before SIGHUP, drained: stream error %v", got.err)
	} else if !got.from["A"] {
		t.Fatalf("the stream started before SIGHUP, drained: chunks from %v, want A", got.from)
	} else if want := llmsim.ExpectedChatText("held-a", 20); got.text != want {
		t.Fatalf("the stream started before SIGHUP, drained: text %q, want %q", got.text, want)
	}
	got := <-heldB
	var apiErr *openai.Error
	if !errors.As(got.err, &apiErr) {
		t.Fatalf("the stream still open at the drain deadline: error %v (text %q), want Envoy's status_on_error", got.err, got.text)
	} else if apiErr.StatusCode != http.StatusInternalServerError {
		t.Fatalf("the stream still open at the drain deadline: status %d, want %d (Envoy's status_on_error)", apiErr.StatusCode, http.StatusInternalServerError)
	}
	if err := b.WaitFor(ctx, func() bool { return b.Cancelled() == 1 }); err != nil {
		t.Fatal("the cancelled stream's upstream attempt was not cancelled")
	}
	p.waitLog(t, "drain timeout; cancelling the streams still open")
	p.waitLog(t, "stopped")
	if err := p.wait(t); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.out())
	}
	driver.Close()
}

func TestVersionAndBadConfig(t *testing.T) {
	p := start(t, "-version")
	if err := p.wait(t); err != nil {
		t.Fatalf("-version: %v", err)
	} else if !strings.HasPrefix(p.out(), "llmhedge-extproc ") {
		t.Fatalf("-version: p.out() = %q, want it to start with \"llmhedge-extproc \"", p.out())
	}
	path := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(path, []byte("routes:\n  - name: chat\n    upstreams: []\n"), 0o600)
	p = start(t, "-config", path)
	var exit *exec.ExitError
	if err := p.wait(t); !errors.As(err, &exit) {
		t.Fatalf("bad config: %v, %q", err, p.out())
	} else if exit.ExitCode() != 1 {
		t.Fatalf("bad config: exit.ExitCode() = %v, want 1", exit.ExitCode())
	} else if !strings.Contains(p.out(), "routes[0] (chat): at least one upstream is required") {
		t.Fatalf("bad config: p.out() = %q, want it to contain \"routes[0] (chat): at least one upstream is required\"", p.out())
	}
	p = start(t)
	if err := p.wait(t); !errors.As(err, &exit) {
		t.Fatalf("no -config: %v, %q", err, p.out())
	} else if exit.ExitCode() != 2 {
		t.Fatalf("no -config: exit.ExitCode() = %v, want 2", exit.ExitCode())
	} else if !strings.Contains(p.out(), "-config is required") {
		t.Fatalf("no -config: p.out() = %q, want it to contain \"-config is required\"", p.out())
	}
}
