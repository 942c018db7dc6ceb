package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// TestSendsNoSimulatorHeaders runs the command as shipped (no tagRequest)
// against a plain server that answers like OpenAI's chat completions and
// records every request's headers: none may name the simulator (X-Sim-*),
// which real providers must never see.
func TestSendsNoSimulatorHeaders(t *testing.T) {
	saved := tagRequest
	tagRequest = nil
	t.Cleanup(func() { tagRequest = saved })

	var mu sync.Mutex
	var seen []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for _, event := range []string{
			`{"id":"c","object":"chat.completion.chunk","model":"gpt-sim","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
			`{"id":"c","object":"chat.completion.chunk","model":"gpt-sim","choices":[{"index":0,"delta":{"content":"hello"}}]}`,
			`{"id":"c","object":"chat.completion.chunk","model":"gpt-sim","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
			`{"id":"c","object":"chat.completion.chunk","model":"gpt-sim","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`,
			`[DONE]`,
		} {
			fmt.Fprintf(w, "data: %s\n\n", event)
		}
	}))
	defer srv.Close()

	const n = 4
	code, stdout, stderr := runTune(context.Background(),
		"-endpoint", endpointFlag("a", srv.URL+"/v1/chat/completions"),
		"-endpoint", endpointFlag("b", srv.URL+"/v1/chat/completions"),
		"-n", fmt.Sprint(n), "-yes", "-json", "-out", t.TempDir())
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	r := decodeResults(t, stdout)
	for _, e := range r.Endpoints {
		if e.OK != n {
			t.Fatalf("endpoint %s: %d answers measured, want %d (the fake is no OpenAI)\n%s", e.Name, e.OK, n, stderr)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2*n {
		t.Fatalf("%d requests reached the server, want %d", len(seen), 2*n)
	}
	for i, h := range seen {
		for name, values := range h {
			if strings.HasPrefix(strings.ToLower(name), "x-sim") {
				t.Errorf("request %d carried the simulator header %s: %q", i, name, strings.Join(values, ", "))
			}
		}
	}
}
