package envoyfilter_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/llmhedge/llmhedge/core/llmsim"
	"github.com/llmhedge/llmhedge/envoyfilter"
)

const onlyA = `
  - name: chat
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: A, url: "{A}"}]
    delay: 10s
`

const onlyB = `
  - name: chat
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: B, url: "{B}"}]
    delay: 10s
`

// A reload applies to new requests at once; a request in flight finishes
// with the configuration it started with; a bad reload changes nothing.
func TestReloadKeepsStreamsInFlight(t *testing.T) {
	release := make(chan struct{})
	h := newHarness(t, harnessOptions{routes: onlyA, behaveA: func(r *http.Request) llmsim.Behavior {
		if r.Header.Get(llmsim.HeaderRequest) == "held-1" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		return llmsim.Behavior{}
	}})
	type result struct {
		text string
		from map[string]bool
		err  error
	}
	held := make(chan result, 1)
	go func() {
		text, from, err := streamChat(context.Background(), h.client(), simHeaders("held-1", "")...)
		held <- result{text, from, err}
	}()
	waitSim(t, h.A, "the held request", func() bool { return h.A.Served() == 1 })

	if err := h.srv.Reload(h.config("", onlyB)); err != nil {
		t.Fatal(err)
	}
	text, from, err := streamChat(context.Background(), h.client(), simHeaders("new-1", "")...)
	if err != nil || !from["B"] || from["A"] || text != llmsim.ExpectedChatText("new-1", tokens) {
		t.Fatalf("after the reload: %q from %v, %v", text, from, err)
	}

	bad := *h.config("", onlyB)
	bad.Routes = []envoyfilter.RouteConfig{{Name: "broken"}}
	if err := h.srv.Reload(&bad); err == nil {
		t.Fatal("a route without upstreams was accepted")
	}
	if _, from, err := streamChat(context.Background(), h.client(), simHeaders("new-2", "")...); err != nil || !from["B"] {
		t.Fatalf("after the bad reload: from %v, %v", from, err)
	}

	close(release)
	r := <-held
	if r.err != nil || !r.from["A"] || r.from["B"] || r.text != llmsim.ExpectedChatText("held-1", tokens) {
		t.Fatalf("the request in flight: %q from %v, %v", r.text, r.from, r.err)
	}
}
