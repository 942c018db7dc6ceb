package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
)

// functionalWorkload is fast and has no random stalls: every scenario
// scripts its slow or failing upstream with X-Sim-Behavior.
func functionalWorkload() llmsim.Workload {
	return withoutStalls(llmsim.Reference(7, 0.05))
}

// llmsim's "off" values (negative).
const (
	neverStall = -1
	noJitter   = -1
	noGap      = -1
)

// withoutStalls returns w without its rare 10-20s stalls.
func withoutStalls(w llmsim.Workload) llmsim.Workload {
	w.StallProb = neverStall
	return w
}

// within fails the test unless cond holds before the simulator's next
// changes stop for 10s.
func within(t *testing.T, s *llmsim.Running, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func cancelledIDs(s *llmsim.Running) map[string]bool {
	out := map[string]bool{}
	for _, c := range s.Cancellations() {
		out[c.RequestID] = true
	}
	return out
}

// startGated starts llmsim's gated upstream, closed at the end of t.
func startGated(t *testing.T, tokens int, hold bool) *llmsim.Gated {
	g := llmsim.StartGated(tokens, hold)
	t.Cleanup(g.Close)
	return g
}

func TestThroughRealTraefik(t *testing.T) {
	wl := functionalWorkload()
	a, b := llmsim.Start("A", wl), llmsim.Start("B", wl)
	defer a.Close()
	defer b.Close()
	gated := startGated(t, 5, false)
	var nextCalls atomic.Int32
	nextSvc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nextCalls.Add(1)
		io.WriteString(w, `{"object":"list","data":[]}`)
	}))
	defer nextSvc.Close()

	ab := [][2]string{{"A", a.URL}, {"B", b.URL}}
	d := newDynamic("g1").
		loadBalancer("sims", a.URL, b.URL).
		loadBalancer("next-svc", nextSvc.URL).
		route("plain", "sims").
		hedge("hedge-ft", pluginConfig(ab, "delay: 100ms", "reportHeader: Server-Timing", "log: stderr")).
		route("ft", "noop@internal", "hedge-ft").
		hedge("hedge-flush", pluginConfig([][2]string{{"G", gated.URL}}, "delay: 30s", "log: off")).
		route("flush", "noop@internal", "hedge-flush").
		hedge("hedge-pass", pluginConfig(ab, "passThrough: true", "pathPrefixes: [\"/v1/chat/\"]", "log: off")).
		route("pass", "next-svc", "hedge-pass").
		hedge("hedge-load", pluginConfig(ab, "delay: 50ms", "log: off")).
		route("load", "noop@internal", "hedge-load")
	// The scenarios every adapter shares are TestConformance's.
	d.hedge("hedge-abort", pluginConfig(ab, "delay: 30s", "log: off")).route("abort", "noop@internal", "hedge-abort")
	tr := startTraefik(t, "INFO", d)
	ctx := context.Background()

	t.Run("first token wins behind early headers and pings", func(t *testing.T) {
		// A answers 200 with a role-only chunk at once, then only pings
		// (it stalls until cancelled): a header race would pick it; the
		// plugin waits for a real token, which only B sends.
		r := streamChat(ctx, sdk(tr.URL+"/ft/v1/"), "ft-1", "A=stall;B=ttft:20ms", nil)
		if up, ok := r.whole("ft-1", wl.WithDefaults().Tokens); !ok {
			t.Fatalf("ft-1: %s", r.notWhole("ft-1", wl.WithDefaults().Tokens))
		} else if up != "B" {
			t.Fatalf("ft-1 answered by %q, want B", up)
		}
		st := r.header.Get("Server-Timing")
		if !strings.Contains(st, "attempts=2") {
			t.Fatalf("st = %q, want it to contain \"attempts=2\"", st)
		} else if !strings.Contains(st, "winner=1") {
			t.Fatalf("st = %q, want it to contain \"winner=1\"", st)
		} else if !strings.Contains(st, "upstream=B") {
			t.Fatalf("st = %q, want it to contain \"upstream=B\"", st)
		} else if !strings.Contains(st, "dur=") {
			t.Fatalf("st = %q, want it to contain \"dur=\"", st)
		}
		within(t, a, "the losing attempt on A to be cancelled", func() bool { return cancelledIDs(a)["ft-1"] })
		// One JSON log line for the request on Traefik's stderr. It is
		// written when the request ends, just after the client's last byte.
		line := tr.waitLogLine(`"middleware":"hedge-ft@file"`)
		var got map[string]any
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, line)
		}
		if got["outcome"] != "ok" {
			t.Fatalf("got[\"outcome\"] = %q, want \"ok\"", got["outcome"])
		} else if got["winner_upstream"] != "B" {
			t.Fatalf("got[\"winner_upstream\"] = %q, want \"B\"", got["winner_upstream"])
		} else if got["attempts"] != float64(2) {
			t.Fatalf("got[\"attempts\"] = %v, want %v", got["attempts"], float64(2))
		} else if got["hedges_started"] != float64(1) {
			t.Fatalf("got[\"hedges_started\"] = %v, want %v", got["hedges_started"], float64(1))
		}
	})

	t.Run("every event is flushed", func(t *testing.T) {
		r := streamChat(ctx, sdk(tr.URL+"/flush/v1/"), "fl-1", "", func(i int) { gated.Received <- i })
		if r.err != nil {
			t.Fatalf("r.err = %v, want nil", r.err)
		} else if r.content != llmsim.ExpectedChatText("fl-1", 5) {
			t.Fatalf("r.content = %v, want %v", r.content, llmsim.ExpectedChatText("fl-1", 5))
		} else if !r.finished {
			t.Fatalf("r.finished = false, want true")
		}
		if n := gated.Late.Load(); n != 0 {
			t.Fatalf("%d events reached the client only after the upstream had waited 10s for them", n)
		}
	})

	t.Run("failure after the first token breaks the stream", func(t *testing.T) {
		r := streamChat(ctx, sdk(tr.URL+"/abort/v1/"), "ab-1", "A=reset_after:3", nil)
		if r.err == nil {
			t.Fatalf("the client saw a clean end: r.err = nil, want an error")
		} else if r.finished {
			t.Fatalf("the client saw a clean end: r.finished = true, want false")
		}
		if r.content != llmsim.ExpectedChatText("ab-1", 3) {
			t.Fatalf("r.content = %v, want %v", r.content, llmsim.ExpectedChatText("ab-1", 3))
		} else if len(r.ids) != 1 {
			t.Fatalf("len(r.ids) = %v, want 1", len(r.ids))
		} else if !r.ids["chatcmpl-A-ab-1"] {
			t.Fatalf("before the break the client got %q from %v", r.content, r.ids)
		}
		if strings.Contains(tr.logs.String(), "Recovered from panic") || strings.Contains(tr.logs.String(), "panic:") {
			t.Fatalf("Traefik treated the abort as a crash:\n%s", proc.Tail(tr.logs.String(), 3000))
		}
	})

	t.Run("pass-through calls next once for ineligible requests", func(t *testing.T) {
		resp, err := http.Get(tr.URL + "/pass/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET /v1/models: resp.StatusCode = %v, want 200", resp.StatusCode)
		} else if !strings.Contains(string(body), `"object":"list"`) {
			t.Fatalf("GET /v1/models: string(body) = %q, want it to contain `\"object\":\"list\"`", string(body))
		} else if nextCalls.Load() != 1 {
			t.Fatalf("GET /v1/models: nextCalls.Load() = %v, want 1", nextCalls.Load())
		}
		r := streamChat(ctx, sdk(tr.URL+"/pass/v1/"), "pa-1", "", nil)
		if _, ok := r.whole("pa-1", wl.WithDefaults().Tokens); !ok {
			t.Fatalf("hedged request: %s", r.notWhole("pa-1", wl.WithDefaults().Tokens))
		} else if nextCalls.Load() != 1 {
			t.Fatalf("hedged request: nextCalls.Load() = %v, want 1", nextCalls.Load())
		}
	})

	t.Run("no truncated stream under 20 concurrent clients", func(t *testing.T) {
		// Plain Traefik cuts a few streams under this load (see the
		// truncation study); the plugin must cut none.
		res := runLoad(ctx, sdk(tr.URL+"/load/v1/"), 400, 20, "ld-", wl.WithDefaults().Tokens)
		t.Logf("plugin: %v", res)
		if res.whole != res.n {
			t.Fatalf("plugin: %v", res)
		}
	})
}
