package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestCurlThroughStandin does what the README's "try the Envoy server"
// steps do: a real llmhedge-extproc App on loopback with the simulated
// upstreams, the stand-in in front of it, and a plain streaming HTTP request
// (what curl sends) with X-Sim-Behavior making A slow, so the hedge to B
// wins; then one without it, answered by A.
func TestCurlThroughStandin(t *testing.T) {
	w := llmsim.Reference(1, 0.05)
	a, b := llmsim.Start("A", w), llmsim.Start("B", w)
	defer a.Close()
	defer b.Close()
	path := filepath.Join(t.TempDir(), "extproc.yaml")
	config := "grpc: {listen: \"127.0.0.1:0\"}\nmetrics: {listen: \"off\"}\nshutdown: {health_grace: 0s}\n" +
		"routes:\n  - name: chat\n    upstreams:\n      - {name: A, url: \"" + a.URL + "\"}\n      - {name: B, url: \"" + b.URL + "\"}\n    delay: 50ms\n"
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
	defer app.Shutdown(5 * time.Second)

	ctx, stop := context.WithCancel(context.Background())
	addrs := make(chan string, 1)
	var banner bytes.Buffer
	ran := make(chan error, 1)
	go func() {
		ran <- run(ctx, options{listen: "127.0.0.1:0", extproc: app.GRPCAddr()}, &banner, func(addr string) { addrs <- addr })
	}()
	var addr string
	select {
	case addr = <-addrs:
	case err := <-ran:
		t.Fatalf("stand-in stopped before serving: %v", err)
	}
	if !strings.Contains(banner.String(), "NOT Envoy") {
		t.Errorf("start-up line %q does not say it is not Envoy", banner.String())
	}

	for _, tc := range []struct {
		behavior, winner string
	}{
		// An upstream that never sends a token: the other one answers,
		// however slow the machine, whether or not a hedge fired.
		{"A=stall", "B"},
		{"B=stall", "A"},
	} {
		body := `{"model":"gpt-sim","stream":true,"messages":[{"role":"user","content":"Hi"}]}`
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if tc.behavior != "" {
			req.Header.Set(llmsim.HeaderBehavior, tc.behavior)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		text, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("X-Sim-Behavior %q: reading the stream: %v", tc.behavior, err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("X-Sim-Behavior %q: status %d, want 200: %s", tc.behavior, resp.StatusCode, text)
		}
		if got := resp.Header.Get(llmsim.HeaderUpstream); got != tc.winner {
			t.Errorf("X-Sim-Behavior %q: answered by %q, want %q", tc.behavior, got, tc.winner)
		}
		if !bytes.Contains(text, []byte("data: [DONE]")) {
			t.Errorf("X-Sim-Behavior %q: stream has no [DONE]: %q", tc.behavior, text)
		}
	}

	stop()
	if err := <-ran; err != nil {
		t.Fatalf("stand-in: %v", err)
	}
}

func TestStandinRejectsUnknownMode(t *testing.T) {
	err := run(context.Background(), options{listen: "127.0.0.1:0", extproc: "127.0.0.1:1", mode: "streamed"}, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), `-mode "streamed"`) {
		t.Fatalf("error %v, want one naming -mode \"streamed\"", err)
	}
}

// TestSimExampleMatchesStandin: the try-it configuration loads, serves
// where the stand-in connects by default, and points at the ports of
// `go run ./examples/demo -sim-only`.
func TestSimExampleMatchesStandin(t *testing.T) {
	cfg, err := envoyfilter.LoadConfig("../envoy/llmhedge-extproc-sim.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GRPC.Listen != "127.0.0.1:50051" {
		t.Errorf("grpc.listen = %q, want 127.0.0.1:50051 (the stand-in's -extproc default)", cfg.GRPC.Listen)
	}
	if len(cfg.Routes) != 1 || len(cfg.Routes[0].Upstreams) != 2 {
		t.Fatalf("want one route with two upstreams")
	}
	for i, want := range []string{"http://127.0.0.1:9001", "http://127.0.0.1:9002"} {
		if got := cfg.Routes[0].Upstreams[i].URL; got != want {
			t.Errorf("upstream %d url = %q, want %q (the demo's -sim-ports default)", i, got, want)
		}
	}
}
