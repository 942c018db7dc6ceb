// Package conformance is the behaviour every adapter's end-to-end tests
// check through its real proxy, written once: the hedge wins on the first
// token behind early headers and pings, a non-streaming answer is hedged
// whole, a fatal 4xx passes through unhedged, a client that goes away
// cancels every attempt, a failure after the answer started breaks the
// client's stream, and each retryable failure starts the next attempt at
// once.
//
// The suite starts two simulated upstreams, A and B (llmsim). The adapter
// gives a Start function that serves every Route the suite asks for, with
// upstream A first and B second and the route's fixed hedge delay, and
// returns each route's OpenAI base URL. Run then drives one scenario per
// route with the official OpenAI Go SDK and checks what the client got
// and what each upstream saw. Each route is its own hedging route, so no
// scenario's cool-downs or breaker counts reach another's.
//
// It is test support: nothing outside this module's tests imports it.
package conformance

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// Env is the suite's two upstreams.
type Env struct {
	A, B *llmsim.Running
	// Tokens is the number of tokens in every whole answer.
	Tokens int
}

// Route is one hedging route an adapter must serve: upstreams A then B,
// hedge delay Delay, the adapter's defaults for everything else.
type Route struct {
	// Name is short, unique and safe in a URL path and a config key.
	Name  string
	Delay time.Duration
}

// Start serves every route through the adapter's proxy and returns each
// route's OpenAI base URL by name (ending in "/v1/": the suite requests
// base + "chat/completions"). The proxy stops at the end of the test.
type Start func(t *testing.T, env *Env, routes []Route) map[string]string

// Long is a hedge delay no scenario outlives: a second attempt on a route
// with it is a retry, never a hedge.
const Long = 30 * time.Second

// scenario is one check, on its own route.
type scenario struct {
	name  string
	delay time.Duration
	run   func(t *testing.T, s *suite, id string)
}

// Retryable failures of upstream A, one route each; the 429 with
// Retry-After comes last, as it cools A down.
var retryable = []struct{ name, behavior string }{
	{"retry-503", "A=status:503"},
	{"retry-500", "A=status:500"},
	{"retry-reset", "A=reset_after:0"},
	{"retry-error-event", "A=error_event"},
	{"retry-done-early", "A=done_early"},
	{"retry-429", "A=status:429,retry_after:1"},
}

func scenarios() []scenario {
	list := []scenario{
		{"first-token", 100 * time.Millisecond, firstTokenWins},
		{"non-streaming", 100 * time.Millisecond, nonStreaming},
		{"fatal-4xx", 100 * time.Millisecond, fatalPassthrough},
		{"client-gone", 20 * time.Millisecond, clientDisconnect},
		{"after-commit", Long, failureAfterCommit},
	}
	for _, r := range retryable {
		behavior := r.behavior
		list = append(list, scenario{r.name, Long, func(t *testing.T, s *suite, id string) {
			retryAtOnce(t, s, id, behavior)
		}})
	}
	return list
}

// Run starts the upstreams, has start serve one route per scenario and runs
// every scenario as a subtest named after its behaviour.
func Run(t *testing.T, start Start) {
	t.Helper()
	wl := llmsim.Reference(7, 0.05)
	wl.StallProb = -1 // stalls are scripted per scenario, never drawn
	env := &Env{A: llmsim.Start("A", wl), B: llmsim.Start("B", wl), Tokens: wl.WithDefaults().Tokens}
	t.Cleanup(env.A.Close)
	t.Cleanup(env.B.Close)
	list := scenarios()
	routes := make([]Route, 0, len(list))
	for _, sc := range list {
		routes = append(routes, Route{Name: sc.name, Delay: sc.delay})
	}
	urls := start(t, env, routes)
	for _, sc := range list {
		base, ok := urls[sc.name]
		if !ok {
			t.Fatalf("start served no route %q", sc.name)
		}
		sc := sc
		s := &suite{env: env, client: openai.NewClient(option.WithBaseURL(base), option.WithAPIKey("sk-conformance"), option.WithMaxRetries(0))}
		t.Run(sc.name, func(t *testing.T) { sc.run(t, s, "cf-"+sc.name) })
	}
}

type suite struct {
	env    *Env
	client openai.Client
}

// streamed is what a streaming client got.
type streamed struct {
	content  string
	ids      map[string]bool // chunk ids: "chatcmpl-<upstream>-<request id>"
	finished bool            // a finish_reason arrived
	err      error
}

func (s *suite) stream(ctx context.Context, id, behavior string) streamed {
	stream := s.client.Chat.Completions.NewStreaming(ctx, chatParams(), requestOptions(id, behavior)...)
	defer stream.Close()
	got := streamed{ids: map[string]bool{}}
	var text strings.Builder
	for stream.Next() {
		chunk := stream.Current()
		got.ids[chunk.ID] = true
		for _, ch := range chunk.Choices {
			text.WriteString(ch.Delta.Content)
			if ch.FinishReason != "" {
				got.finished = true
			}
		}
	}
	got.content, got.err = text.String(), stream.Err()
	return got
}

// wantWhole fails t unless got is upstream's whole answer to id.
func (s *suite) wantWhole(t *testing.T, got streamed, upstream, id string) {
	t.Helper()
	if got.err != nil {
		t.Fatalf("stream error %v, want %s's whole answer", got.err, upstream)
	}
	if want := "chatcmpl-" + upstream + "-" + id; len(got.ids) != 1 || !got.ids[want] {
		t.Fatalf("chunks came from %v, want %s only", keys(got.ids), want)
	}
	if want := llmsim.ExpectedChatText(id, s.env.Tokens); got.content != want {
		t.Fatalf("content %q, want %q", got.content, want)
	}
	if !got.finished {
		t.Fatal("no finish_reason: the answer was cut")
	}
}

func chatParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    llmsim.DefaultModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	}
}

func requestOptions(id, behavior string) []option.RequestOption {
	opts := []option.RequestOption{option.WithHeader(llmsim.HeaderRequest, id)}
	if behavior != "" {
		opts = append(opts, option.WithHeader(llmsim.HeaderBehavior, behavior))
	}
	return opts
}

// waitFor fails t unless cond holds within 10s of the upstream's last change.
func waitFor(t *testing.T, up *llmsim.Running, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := up.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func cancelled(up *llmsim.Running, id string) bool {
	for _, c := range up.Cancellations() {
		if c.RequestID == id {
			return true
		}
	}
	return false
}

func wantAttempts(t *testing.T, s *suite, id string, a, b int) {
	t.Helper()
	if gotA, gotB := s.env.A.Attempts(id), s.env.B.Attempts(id); gotA != a || gotB != b {
		t.Fatalf("attempts A %d, B %d, want A %d, B %d", gotA, gotB, a, b)
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// firstTokenWins: A answers 200 with a role-only chunk and pings at once,
// then waits 3s for its first token; a race on headers would pick it. The
// hedge to B starts after the delay and wins on B's first real token; A's
// attempt is cancelled.
func firstTokenWins(t *testing.T, s *suite, id string) {
	got := s.stream(context.Background(), id, "A=ttft:3s;B=ttft:20ms")
	s.wantWhole(t, got, "B", id)
	waitFor(t, s.env.A, "the losing attempt on A to be cancelled", func() bool { return cancelled(s.env.A, id) })
	wantAttempts(t, s, id, 1, 1)
}

// nonStreaming: a non-streaming request is hedged on the complete JSON
// answer; the client decodes the winner's.
func nonStreaming(t *testing.T, s *suite, id string) {
	got, err := s.client.Chat.Completions.New(context.Background(), chatParams(), requestOptions(id, "A=ttft:3s")...)
	if err != nil {
		t.Fatal(err)
	}
	if want := "chatcmpl-B-" + id; got.ID != want {
		t.Fatalf("completion id %q, want %q", got.ID, want)
	}
	if len(got.Choices) != 1 {
		t.Fatalf("%d choices, want 1", len(got.Choices))
	}
	if want := llmsim.ExpectedChatText(id, s.env.Tokens); got.Choices[0].Message.Content != want {
		t.Fatalf("content %q, want %q", got.Choices[0].Message.Content, want)
	}
	waitFor(t, s.env.A, "the losing attempt on A to be cancelled", func() bool { return cancelled(s.env.A, id) })
}

// fatalPassthrough: a fatal client error reaches the client as the
// upstream sent it, and is never hedged or retried.
func fatalPassthrough(t *testing.T, s *suite, id string) {
	for _, status := range []int{400, 401, 404, 422} {
		id := id + "-" + strconv.Itoa(status)
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			_, err := s.client.Chat.Completions.New(context.Background(), chatParams(), requestOptions(id, "A=status:"+strconv.Itoa(status))...)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("error %v, want A's %d as an API error", err, status)
			}
			if apiErr.StatusCode != status {
				t.Fatalf("status %d, want %d", apiErr.StatusCode, status)
			}
			if want := "simulated " + strconv.Itoa(status); !strings.Contains(apiErr.Message, want) {
				t.Fatalf("error message %q is not the upstream's (no %q)", apiErr.Message, want)
			}
			wantAttempts(t, s, id, 1, 0)
		})
	}
}

// clientDisconnect: a client that goes away while both attempts wait for
// their first token cancels both upstream requests.
func clientDisconnect(t *testing.T, s *suite, id string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan streamed, 1)
	go func() { done <- s.stream(ctx, id, "*=stall") }()
	waitFor(t, s.env.A, "the first attempt", func() bool { return s.env.A.Attempts(id) == 1 })
	waitFor(t, s.env.B, "the hedge", func() bool { return s.env.B.Attempts(id) == 1 })
	cancel()
	if got := <-done; got.err == nil {
		t.Fatalf("the cancelled client's stream ended without an error (content %q)", got.content)
	}
	waitFor(t, s.env.A, "A to see the cancellation", func() bool { return cancelled(s.env.A, id) })
	waitFor(t, s.env.B, "B to see the cancellation", func() bool { return cancelled(s.env.B, id) })
}

// failureAfterCommit: the only attempt breaks after three tokens reached
// the client. The client's stream must end in an error, never cleanly,
// and hold exactly those tokens: nothing is spliced from another upstream.
func failureAfterCommit(t *testing.T, s *suite, id string) {
	got := s.stream(context.Background(), id, "A=reset_after:3")
	if got.err == nil || got.finished {
		t.Fatalf("the client saw a clean end (error %v, finished %v), want a broken stream", got.err, got.finished)
	}
	if want := llmsim.ExpectedChatText(id, 3); got.content != want {
		t.Fatalf("content %q before the break, want %q", got.content, want)
	}
	if want := "chatcmpl-A-" + id; len(got.ids) != 1 || !got.ids[want] {
		t.Fatalf("chunks came from %v, want %s only", keys(got.ids), want)
	}
	wantAttempts(t, s, id, 1, 0)
}

// retryAtOnce: a retryable failure of A before its first token starts the
// attempt on B at once (the route's delay is Long), and B's whole answer
// reaches the client.
func retryAtOnce(t *testing.T, s *suite, id, behavior string) {
	got := s.stream(context.Background(), id, behavior)
	s.wantWhole(t, got, "B", id)
	wantAttempts(t, s, id, 1, 1)
}
