package core_test

// yaegi test loads core_test files into package core itself (and does not
// run Examples): the helpers here have names no core test uses.

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
)

// exampleChunk is one streamed Chat Completions event carrying model output.
func exampleChunk(text string) string {
	return "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + text + "\"}}]}\n\n"
}

// exampleStreamingUpstream answers every request with a short chat stream.
func exampleStreamingUpstream(text string) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, exampleChunk(text))
		io.WriteString(w, "data: [DONE]\n\n")
	}))
}

// exampleStalledUpstream accepts requests and never answers, until the engine
// cancels its attempt. (net/http notices the client leaving only once the
// request body has been read.)
func exampleStalledUpstream() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
}

func exampleChatRequest() *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Content-Type", "application/json")
	return req
}

// An adapter builds one Hedger per route from a Config and serves requests
// through it. Here the first upstream answers at once: no hedge starts, and
// the client receives the upstream's stream unchanged.
func ExampleNew() {
	primary, backup := exampleStreamingUpstream("from-primary"), exampleStreamingUpstream("from-backup")
	defer primary.Close()
	defer backup.Close()

	h, err := core.New(config.Config{
		Route: "chat",
		Upstreams: []config.UpstreamConfig{
			{Name: "primary", URL: primary.URL},
			{Name: "backup", URL: backup.URL},
		},
		Delay: config.DelayConfig{Fixed: config.Duration(time.Second)},
	}, core.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, exampleChatRequest())
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"))
	fmt.Printf("%q\n", rec.Body.String())
	// Output:
	// 200 text/event-stream
	// "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"from-primary\"}}]}\n\ndata: [DONE]\n\n"
}

// Handle is ServeHTTP for adapters that finish the response themselves: it
// returns ErrStreamAborted when the winner failed after the answer started
// (the response is incomplete and the connection should be cut), and nil
// otherwise, every other failure having been answered to the client. Here
// the primary stalls, so after the hedge delay the backup is asked too,
// and wins.
func ExampleHedger_Handle() {
	primary, backup := exampleStalledUpstream(), exampleStreamingUpstream("from-backup")
	defer primary.Close()
	defer backup.Close()

	h, err := core.New(config.Config{
		Upstreams: []config.UpstreamConfig{
			{Name: "primary", URL: primary.URL},
			{Name: "backup", URL: backup.URL},
		},
		Delay: config.DelayConfig{Fixed: config.Duration(20 * time.Millisecond)},
	}, core.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	rec := httptest.NewRecorder()
	err = h.Handle(rec, exampleChatRequest())
	if errors.Is(err, core.ErrStreamAborted) {
		fmt.Println("cut the connection: the answer is incomplete")
		return
	}
	fmt.Println(rec.Code, strings.Contains(rec.Body.String(), "from-backup"))
	// Output:
	// 200 true
}

// Options.Observer receives a Report when each request ends, on the
// request's goroutine, before ServeHTTP or Handle returns: adapters turn
// reports into metrics and log lines. Reports name upstreams, never their
// URLs or credentials.
func ExampleOptions_observer() {
	primary, backup := exampleStalledUpstream(), exampleStreamingUpstream("from-backup")
	defer primary.Close()
	defer backup.Close()

	observer := core.ObserverFunc(func(r *core.Report) {
		fmt.Printf("route %s: %s, status %d, hedges started %d\n", r.Route, r.Outcome, r.Status, r.HedgesStarted)
		for _, a := range r.Attempts {
			fmt.Printf("  attempt %d to %s (%s): %s\n", a.Index, a.Upstream, a.Role, a.Result)
		}
		if w := r.WinnerAttempt(); w != nil {
			fmt.Println("  winner:", w.Upstream)
		}
	})
	h, err := core.New(config.Config{
		Route: "chat",
		Upstreams: []config.UpstreamConfig{
			{Name: "primary", URL: primary.URL},
			{Name: "backup", URL: backup.URL},
		},
		Delay: config.DelayConfig{Fixed: config.Duration(20 * time.Millisecond)},
	}, core.Options{Observer: observer})
	if err != nil {
		fmt.Println(err)
		return
	}
	h.ServeHTTP(httptest.NewRecorder(), exampleChatRequest())
	// Output:
	// route chat: ok, status 200, hedges started 1
	//   attempt 0 to primary (primary): lost
	//   attempt 1 to backup (hedge): won
	//   winner: backup
}
