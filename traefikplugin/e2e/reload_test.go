package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestReloadWhileStreamsOpen rewrites the dynamic configuration while ten
// streams are open mid-answer: Traefik builds new middleware instances (New
// is called again, nothing is closed), the open streams must finish intact
// on the old ones, and new requests must see the new configuration.
func TestReloadWhileStreamsOpen(t *testing.T) {
	const streams, tokens = 10, 5
	g := startGated(t, tokens, true)
	config := func(generation string, extra ...string) *dynamic {
		opts := append([]string{"delay: 30s", "log: off"}, extra...)
		return newDynamic(generation).
			hedge("hedge-r", pluginConfig([][2]string{{"G", g.URL}}, opts...)).
			route("r", "noop@internal", "hedge-r")
	}
	tr := startTraefik(t, "INFO", config("g1"))
	c := sdk(tr.URL + "/r/v1/")

	results := make(chan streamed, streams)
	for i := 0; i < streams; i++ {
		id := fmt.Sprintf("open-%d", i)
		go func() { results <- streamChat(context.Background(), c, id, "", nil) }()
	}
	// Every stream has sent its first token and is now held open.
	timeout := time.After(30 * time.Second)
	for i := 0; i < streams; i++ {
		select {
		case <-g.First:
		case <-timeout:
			t.Fatalf("only %d of %d streams started", i, streams)
		}
	}

	tr.reload(config("g2", "reportHeader: X-Hedge-Report"))
	close(g.Release)

	for i := 0; i < streams; i++ {
		r := <-results
		if r.err != nil {
			t.Fatalf("a stream open across the reload ended badly: r.err = %v, want nil", r.err)
		} else if !r.finished {
			t.Fatalf("a stream open across the reload ended badly: r.finished = false, want true")
		} else if len(r.ids) != 1 {
			t.Fatalf("a stream open across the reload ended badly: len(r.ids) = %v, want 1", len(r.ids))
		}
		for id := range r.ids {
			reqID := id[len("chatcmpl-G-"):]
			if r.content != llmsim.ExpectedChatText(reqID, tokens) {
				t.Fatalf("stream %s content %q", reqID, r.content)
			}
		}
		if r.header.Get("X-Hedge-Report") != "" {
			t.Fatalf("a stream that started before the reload was served by the new configuration")
		}
	}
	// New requests run on the new configuration.
	r := streamChat(context.Background(), c, "after-1", "", nil)
	if r.err != nil {
		t.Fatalf("request after the reload: r.err = %v, want nil", r.err)
	} else if r.content != llmsim.ExpectedChatText("after-1", tokens) {
		t.Fatalf("request after the reload: r.content = %v, want %v", r.content, llmsim.ExpectedChatText("after-1", tokens))
	}
	if r.header.Get("X-Hedge-Report") == "" {
		t.Fatalf("the new configuration is not in force: headers %v", r.header)
	}
}
