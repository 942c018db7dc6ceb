package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestSimOnlyFixedPorts: -sim-only serves A and B on the -sim-ports asked
// for, so the Traefik and Envoy examples (127.0.0.1:9001 and :9002) work
// unedited; here two free ports stand in for them.
func TestSimOnlyFixedPorts(t *testing.T) {
	ports := [2]int{freePort(t), freePort(t)}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	opts := options{scale: 0.01, seed: 1, simOnly: true, simPorts: strconv.Itoa(ports[0]) + "," + strconv.Itoa(ports[1])}
	go func() {
		err := run(ctx, opts, pw, io.Discard)
		pw.Close()
		done <- err
	}()
	sc := bufio.NewScanner(pr)
	var lines []string
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "Ctrl-C") {
		lines = append(lines, sc.Text())
	}
	for i, name := range []string{"A", "B"} {
		url := "http://127.0.0.1:" + strconv.Itoa(ports[i])
		if !strings.Contains(strings.Join(lines, "\n"), name+" "+url) {
			t.Errorf("output %q does not list %s at %s", lines, name, url)
		}
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Errorf("upstream %s on its fixed port: %v", name, err)
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := resp.Header.Get(llmsim.HeaderUpstream); resp.StatusCode != http.StatusOK || got != name {
			t.Errorf("port %d: status %d from upstream %q, want 200 from %s", ports[i], resp.StatusCode, got, name)
		}
	}
	cancel()
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
	for _, bad := range []string{"9001", "9001,x", "9001,70000"} {
		if _, err := parseSimPorts(bad); err == nil {
			t.Errorf("-sim-ports %q accepted", bad)
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
