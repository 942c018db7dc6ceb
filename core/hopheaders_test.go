package core

import (
	"net/http"
	"testing"
)

// TestRemoveHopHeadersMatchesList: removeHopHeaders deletes every name of
// hopHeaders (it spells them out one statement each) and nothing else.
func TestRemoveHopHeadersMatchesList(t *testing.T) {
	h := http.Header{"Content-Type": {"text/event-stream"}, "X-Other": {"1"}}
	for _, name := range hopHeaders {
		h[name] = []string{"x"}
	}
	removeHopHeaders(h)
	if len(h) != 2 || h.Get("Content-Type") == "" || h.Get("X-Other") == "" {
		t.Errorf("after removeHopHeaders: %v, want Content-Type and X-Other only", h)
	}
}
