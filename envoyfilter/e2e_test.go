package envoyfilter_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

const tokens = 20

func simHeaders(id, behavior string) []option.RequestOption {
	opts := []option.RequestOption{option.WithHeader(llmsim.HeaderRequest, id)}
	if behavior != "" {
		opts = append(opts, option.WithHeader(llmsim.HeaderBehavior, behavior))
	}
	return opts
}

// streamChat streams a chat completion and returns its text, the upstreams
// named in the chunks, and the stream's error.
func streamChat(ctx context.Context, c openai.Client, opts ...option.RequestOption) (string, map[string]bool, error) {
	completions := c.Chat.Completions
	stream := completions.NewStreaming(ctx, chatParams(), opts...)
	defer stream.Close()
	var text strings.Builder
	from := map[string]bool{}
	for stream.Next() {
		chunk := stream.Current()
		from[chunk.SystemFingerprint] = true
		if len(chunk.Choices) > 0 {
			text.WriteString(chunk.Choices[0].Delta.Content)
		}
	}
	return text.String(), from, stream.Err()
}

// The primary sends 200, a role-only chunk and pings at once, then never
// sends its first token: the hedge wins on the first real token, behind
// early headers and pings, and the primary is cancelled.
func TestStreamingHedgeOnFirstToken(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	before := h.driver.Stats()
	text, from, err := streamChat(context.Background(), h.client(), simHeaders("stream-1", "A=stall")...)
	if err != nil {
		t.Fatal(err)
	}
	if want := llmsim.ExpectedChatText("stream-1", tokens); text != want {
		t.Fatalf("text %q, want %q", text, want)
	}
	if len(from) != 1 {
		t.Fatalf("len(from) = %v, want 1", len(from))
	} else if !from["B"] {
		t.Fatalf("chunks came from %v, want only B", from)
	}
	rep := h.report()
	if rep.Outcome != core.OutcomeOK {
		t.Fatalf("rep.Outcome = %v, want core.OutcomeOK", rep.Outcome)
	} else if rep.Winner != 1 {
		t.Fatalf("rep.Winner = %v, want 1", rep.Winner)
	} else if rep.Attempts[1].Role != core.RoleHedge {
		t.Fatalf("rep.Attempts[1].Role = %v, want core.RoleHedge", rep.Attempts[1].Role)
	}
	waitSim(t, h.A, "the primary's cancellation", func() bool { return h.A.Cancelled() == 1 })
	after := h.driver.Stats()
	if after.StreamedImmediate-before.StreamedImmediate != 1 {
		t.Fatalf("after.StreamedImmediate-before.StreamedImmediate = %v, want 1", after.StreamedImmediate-before.StreamedImmediate)
	} else if after.Immediate != before.Immediate {
		t.Fatalf("after.Immediate = %v, want %v", after.Immediate, before.Immediate)
	}
	if after.LostBodyBytes != 0 {
		t.Fatalf("driver saw protocol trouble: after.LostBodyBytes = %v, want 0", after.LostBodyBytes)
	} else if after.Spurious != 0 {
		t.Fatalf("driver saw protocol trouble: after.Spurious = %v, want 0", after.Spurious)
	} else if after.GRPCErrors != 0 {
		t.Fatalf("driver saw protocol trouble: after.GRPCErrors = %v, want 0", after.GRPCErrors)
	}
}

// The bytes the client receives are exactly one upstream's stream.
func TestStreamingBytesFromOneUpstream(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	body := `{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	req, _ := http.NewRequest(http.MethodPost, h.front.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(llmsim.HeaderRequest, "bytes-1")
	req.Header.Set(llmsim.HeaderBehavior, "A=stall") // only the hedge can answer
	resp, err := h.front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("resp.StatusCode = %v, want 200", resp.StatusCode)
	} else if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("resp.Header.Get(\"Content-Type\") = %q, want \"text/event-stream\"", resp.Header.Get("Content-Type"))
	} else if resp.Header.Get(llmsim.HeaderUpstream) != "B" {
		t.Fatalf("resp.Header.Get(llmsim.HeaderUpstream) = %q, want \"B\"", resp.Header.Get(llmsim.HeaderUpstream))
	}
	want := llmsim.ExpectedStream("B", "sim-model", "bytes-1", tokens)
	if !bytes.Equal(llmsim.StripPings(got), want) {
		t.Fatalf("body\n%q\nwant\n%q", got, want)
	}
}

// A non-streaming answer goes back as one ImmediateResponse.
func TestNonStreaming(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	before := h.driver.Stats()
	// A never answers: only the hedge can, however slow the machine.
	resp, err := chat(h).New(context.Background(), chatParams(), simHeaders("plain-1", "A=stall")...)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.Choices[0].Message.Content, llmsim.ExpectedChatText("plain-1", tokens); got != want {
		t.Fatalf("content %q, want %q", got, want)
	}
	if resp.SystemFingerprint != "B" {
		t.Fatalf("answer from %q, want B", resp.SystemFingerprint)
	}
	after := h.driver.Stats()
	if after.Immediate-before.Immediate != 1 {
		t.Fatalf("after.Immediate-before.Immediate = %v, want 1", after.Immediate-before.Immediate)
	} else if after.StreamedImmediate != before.StreamedImmediate {
		t.Fatalf("after.StreamedImmediate = %v, want %v", after.StreamedImmediate, before.StreamedImmediate)
	}
	if rep := h.report(); rep.Winner != 1 {
		t.Fatalf("rep.Winner = %v, want 1", rep.Winner)
	}
}

// A non-streaming answer larger than envoy.max_immediate_response is
// streamed instead of being cut or refused.
func TestLargeNonStreamingAnswerIsStreamed(t *testing.T) {
	wl := llmsim.Reference(1, testScale)
	wl.StallProb, wl.Tokens = noStalls, 300
	h := newHarness(t, harnessOptions{envoy: "  max_immediate_response: 1KiB", workload: &wl})
	resp, err := chat(h).New(context.Background(), chatParams(), simHeaders("large-1", "")...)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.Choices[0].Message.Content, llmsim.ExpectedChatText("large-1", 300); got != want {
		t.Fatalf("content has %d bytes, want %d", len(got), len(want))
	}
	if s := h.driver.Stats(); s.StreamedImmediate != 1 {
		t.Fatalf("s.StreamedImmediate = %v, want 1", s.StreamedImmediate)
	} else if s.Immediate != 0 {
		t.Fatalf("s.Immediate = %v, want 0", s.Immediate)
	}
}

// A winner that breaks after its answer started ends the client's
// response abruptly: no splice, no clean end.
func TestFailureAfterCommitResetsTheClient(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	text, from, err := streamChat(context.Background(), h.client(), simHeaders("abort-1", "A=stall;B=reset_after:3")...)
	if err == nil {
		t.Fatal("the stream ended cleanly; want an error")
	}
	if want := llmsim.ExpectedChatText("abort-1", 3); text != want {
		t.Fatalf("text = %q, want %q", text, want)
	} else if !from["B"] {
		t.Fatalf("text %q from %v, want %q from B only", text, from, want)
	} else if from["A"] {
		t.Fatalf("text %q from %v, want %q from B only", text, from, want)
	}
	if rep := h.report(); rep.Outcome != core.OutcomeStreamFailed {
		t.Fatalf("rep.Outcome = %v, want core.OutcomeStreamFailed", rep.Outcome)
	}
	waitFor(t, "the driver's reset", func() bool { return h.driver.Stats().Resets == 1 })
}

// The client going away ends the ext_proc stream, which cancels every
// upstream attempt; both ways Envoy ends it are covered.
func TestClientDisconnectCancelsAttempts(t *testing.T) {
	for _, reset := range []bool{false, true} {
		name := "half-close"
		if reset {
			name = "reset"
		}
		t.Run(name, func(t *testing.T) {
			// The driver would reset a half-closed stream only after a
			// minute: the attempts end within the test only if the server
			// acts on the half-close itself.
			h := newHarness(t, harnessOptions{routes: strings.Replace(defaultRoutes, "delay: 100ms", "delay: 20ms", 1),
				driver: envoydriver.Config{ResetOnClientGone: reset, RemoteCloseTimeout: time.Minute}})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, _, err := streamChat(ctx, h.client(), simHeaders("gone-1", "A=stall;B=stall")...)
				done <- err
			}()
			waitSim(t, h.A, "the primary", func() bool { return h.A.Served() == 1 })
			waitSim(t, h.B, "the hedge", func() bool { return h.B.Served() == 1 })
			cancel()
			if err := <-done; err == nil {
				t.Fatal("the cancelled stream reported no error")
			}
			waitSim(t, h.A, "the primary's cancellation", func() bool { return h.A.Cancelled() == 1 })
			waitSim(t, h.B, "the hedge's cancellation", func() bool { return h.B.Cancelled() == 1 })
			if rep := h.report(); rep.Outcome != core.OutcomeClientGone {
				t.Fatalf("rep.Outcome = %v, want core.OutcomeClientGone", rep.Outcome)
			}
			waitFor(t, "the ext_proc stream to end", func() bool { return h.srv.InFlight() == 0 })
		})
	}
}

// Requests no route matches continue untouched, with or without a body,
// and none of their body is lost.
func TestUnmatchedRoutesContinueUntouched(t *testing.T) {
	for _, mode := range []envoydriver.Mode{envoydriver.FullDuplex, envoydriver.Buffered} {
		h := newHarness(t, harnessOptions{driver: envoydriver.Config{Mode: mode}})
		resp, err := h.front.Client().Get(h.front.URL + "/healthz?x=1")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != "other:GET /healthz" {
			t.Fatalf("mode %d: GET answered %q", mode, got)
		}
		if seen := <-h.seen; seen.path != "/healthz?x=1" {
			t.Fatalf("seen.path = %q, want \"/healthz?x=1\"", seen.path)
		} else if seen.header.Get("X-Request-Id") == "" {
			t.Fatalf("seen.header.Get(\"X-Request-Id\") = \"\", want a non-empty value")
		}
		payload := strings.Repeat("0123456789", 10_000) // several chunks
		resp, err = h.front.Client().Post(h.front.URL+"/api/upload", "text/plain", strings.NewReader(payload))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if seen := <-h.seen; seen.method != "POST" || seen.body != payload {
			t.Fatalf("mode %d: upstream got a body of %d bytes, want %d", mode, len(seen.body), len(payload))
		}
		s := h.driver.Stats()
		if s.Continued != 2 {
			t.Fatalf("s.Continued = %v, want 2", s.Continued)
		} else if s.LostBodyBytes != 0 {
			t.Fatalf("s.LostBodyBytes = %v, want 0", s.LostBodyBytes)
		} else if s.Spurious != 0 {
			t.Fatalf("s.Spurious = %v, want 0", s.Spurious)
		} else if s.ErrorReplies != 0 {
			t.Fatalf("s.ErrorReplies = %v, want 0", s.ErrorReplies)
		}
		if h.A.Served()+h.B.Served() != 0 {
			t.Fatalf("mode %d: unmatched requests reached the hedged upstreams", mode)
		}
	}
}

// Envoy < 1.37 (buffered body, no streamed local responses): the answer
// arrives whole in an ImmediateResponse, after the server extended the
// message timer; without max_message_timeout the timer cuts the race.
func TestBufferedMode(t *testing.T) {
	h := newHarness(t, harnessOptions{driver: envoydriver.Config{Mode: envoydriver.Buffered, MaxMessageTimeout: 60_000_000_000}})
	// A never sends a token: only the hedge can answer.
	text, from, err := streamChat(context.Background(), h.client(), simHeaders("buf-1", "A=stall")...)
	if err != nil {
		t.Fatal(err)
	}
	if text != llmsim.ExpectedChatText("buf-1", tokens) {
		t.Fatalf("text = %q, want %q", text, llmsim.ExpectedChatText("buf-1", tokens))
	} else if !from["B"] {
		t.Fatalf("text %q from %v", text, from)
	} else if from["A"] {
		t.Fatalf("text %q from %v", text, from)
	}
	if s := h.driver.Stats(); s.Immediate != 1 {
		t.Fatalf("s.Immediate = %v, want 1", s.Immediate)
	} else if s.TimeoutOverrides != 1 {
		t.Fatalf("s.TimeoutOverrides = %v, want 1", s.TimeoutOverrides)
	} else if s.MessageTimeouts != 0 {
		t.Fatalf("s.MessageTimeouts = %v, want 0", s.MessageTimeouts)
	}

	h2 := newHarness(t, harnessOptions{driver: envoydriver.Config{Mode: envoydriver.Buffered}})
	// Neither upstream answers: only the message timer can end the request.
	_, err = chat(h2).New(context.Background(), chatParams(), simHeaders("buf-2", "A=stall;B=stall")...)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("err %v, want Envoy's 504 message timeout", err)
	} else if apiErr.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("apiErr.StatusCode = %v, want http.StatusGatewayTimeout", apiErr.StatusCode)
	}
	if s := h2.driver.Stats(); s.MessageTimeouts != 1 {
		t.Fatalf("s.MessageTimeouts = %v, want 1", s.MessageTimeouts)
	} else if s.OverridesIgnored != 1 {
		t.Fatalf("s.OverridesIgnored = %v, want 1", s.OverridesIgnored)
	}
	waitSim(t, h2.A, "the cancelled attempt", func() bool { return h2.A.Cancelled() == 1 })
}

// Upstream headers reach the client through both kinds of local response:
// repeated headers keep every value, x-envoy-* and hop-by-hop headers stay
// behind.
func TestResponseHeadersSurvive(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h := w.Header()
		h.Add("Set-Cookie", "a=1")
		h.Add("Set-Cookie", "b=2")
		h.Set("X-Upstream", "u")
		h.Set("X-Envoy-Decorator", "no")
		if bytes.Contains(body, []byte(`"stream":true`)) {
			h.Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
			return
		}
		h.Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`)
	}))
	defer up.Close()
	h := newHarness(t, harnessOptions{routes: `
  - name: chat
    upstreams: [{name: U, url: "` + up.URL + `"}]
`})
	for _, stream := range []string{"false", "true"} {
		resp, err := h.front.Client().Post(h.front.URL+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","stream":`+stream+`}`))
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := strings.Join(resp.Header.Values("Set-Cookie"), ","); got != "a=1,b=2" {
			t.Fatalf("got = %q, want \"a=1,b=2\"", got)
		} else if resp.Header.Get("X-Upstream") != "u" {
			t.Fatalf("resp.Header.Get(\"X-Upstream\") = %q, want \"u\"", resp.Header.Get("X-Upstream"))
		} else if resp.Header.Get("X-Envoy-Decorator") != "" {
			t.Fatalf("resp.Header.Get(\"X-Envoy-Decorator\") = %q, want \"\"", resp.Header.Get("X-Envoy-Decorator"))
		}
	}
	if s := h.driver.Stats(); s.Immediate != 1 {
		t.Fatalf("s.Immediate = %v, want 1", s.Immediate)
	} else if s.StreamedImmediate != 1 {
		t.Fatalf("s.StreamedImmediate = %v, want 1", s.StreamedImmediate)
	}
}

// brokenJSONUpstream answers every request with a JSON body that declares
// Content-Length 2 MiB and breaks off after 1.5 MiB.
func brokenJSONUpstream(t *testing.T) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(2<<20))
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(`{"choices":[{"message":{"content":"`))
		w.Write(bytes.Repeat([]byte("x"), 3<<19-64))
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // closes the connection mid-body
	}))
	t.Cleanup(up.Close)
	return up
}

// A non-streaming answer that breaks mid-body reaches the client broken,
// never as a complete answer: a reset after the start where Envoy can
// stream a local response, a 502 where it can only take one
// ImmediateResponse. Hedged or not.
func TestBrokenNonStreamingAnswerIsNeverComplete(t *testing.T) {
	up := brokenJSONUpstream(t)
	routes := `
  - name: chat
    upstreams: [{name: U1, url: "` + up.URL + `"}, {name: U2, url: "` + up.URL + `"}]
    delay: 10ms
`
	cases := []struct {
		name       string
		envoy      string
		driver     envoydriver.Config
		wantStatus int // 0: the response starts, then breaks
	}{
		{"streamed local response", "", envoydriver.Config{}, 0},
		{"immediate response only", "  streamed_immediate_response: false", envoydriver.Config{}, http.StatusBadGateway},
		{"buffered mode", "", envoydriver.Config{Mode: envoydriver.Buffered, MaxMessageTimeout: time.Minute}, http.StatusBadGateway},
	}
	for _, c := range cases {
		for _, hedge := range []string{"", "off"} {
			t.Run(c.name+"/hedge="+hedge, func(t *testing.T) {
				h := newHarness(t, harnessOptions{routes: routes, envoy: c.envoy, driver: c.driver})
				req, _ := http.NewRequest(http.MethodPost, h.front.URL+"/v1/chat/completions",
					strings.NewReader(`{"model":"m","messages":[]}`))
				req.Header.Set("Content-Type", "application/json")
				if hedge != "" {
					req.Header.Set(core.HeaderHedge, hedge)
				}
				resp, err := h.front.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, readErr := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case c.wantStatus == 0 && readErr == nil:
					t.Fatalf("status %d with %d body bytes read to a clean end; want the response reset", resp.StatusCode, len(body))
				case c.wantStatus != 0 && resp.StatusCode != c.wantStatus:
					t.Fatalf("status %d (%d body bytes, read error %v), want %d", resp.StatusCode, len(body), readErr, c.wantStatus)
				case c.wantStatus != 0 && !bytes.Contains(body, []byte("upstream_aborted")):
					t.Fatalf("the %d answer does not say upstream_aborted: %.200q", resp.StatusCode, body)
				}
				if rep := h.report(); rep.Outcome != core.OutcomeStreamFailed {
					t.Fatalf("report outcome %v, want %v", rep.Outcome, core.OutcomeStreamFailed)
				}
			})
		}
	}
}

// In buffered mode the answer goes out as one ImmediateResponse when it is
// complete, so early headers would only hide a failure's status: a
// streaming race that fails after the grace time still answers the
// upstreams' 500, with x-should-retry: false.
func TestBufferedModeNoEarlyHeaders(t *testing.T) {
	h := newHarness(t, harnessOptions{
		driver: envoydriver.Config{Mode: envoydriver.Buffered, MaxMessageTimeout: time.Minute},
		routes: defaultRoutes + "    early_headers: 200ms\n    max_attempts: 1\n",
	})
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	req, _ := http.NewRequest("POST", h.front.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(llmsim.HeaderRequest, "buf-early")
	req.Header.Set(llmsim.HeaderBehavior, "A=slow_headers:500ms,status:500")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 500 || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("status %d, X-Should-Retry %q; want the upstream's 500 and false", resp.StatusCode, resp.Header.Get("X-Should-Retry"))
	}
}
