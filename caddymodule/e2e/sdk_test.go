package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// simWorkload is a deterministic upstream: first token after ttft (while
// the stream already sent 200, a role-only chunk and pings every 3ms), then
// 5 tokens 2ms apart. Sigma and the stall probability -1 switch jitter and
// stalls off.
func simWorkload(ttft time.Duration) llmsim.Workload {
	return llmsim.Workload{MedianTTFT: ttft, Sigma: -1, StallProb: -1, Tokens: 5, TokenGap: 2 * time.Millisecond, PingEvery: 3 * time.Millisecond}
}

// simTokens is simWorkload's token count.
const simTokens = 5

// startSims starts upstreams A and B with the same fast workload.
func startSims(t testing.TB) (a, b *llmsim.Running) {
	t.Helper()
	a = llmsim.Start("A", simWorkload(10*time.Millisecond))
	b = llmsim.Start("B", simWorkload(10*time.Millisecond))
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	return a, b
}

// hedgeSite is a site body that hedges A with B, each upstream with its own
// API key and model, a 50ms delay, and a per-request log line at info.
func hedgeSite(a, b *llmsim.Running, extra string) string {
	return fmt.Sprintf(`	llm_hedge {
		route e2e
		upstream %s {
			name A
			header_up Authorization "Bearer sk-A-secret"
			model model-a
		}
		upstream %s {
			name B
			header_up Authorization "Bearer sk-B-secret"
			model model-b
		}
		delay 50ms
		log_level info
%s
	}`, a.URL, b.URL, extra)
}

// sdkClient is the official OpenAI Go client pointed at Caddy, with the
// simulation's request id and behaviors in headers and no client retries
// (the gateway's own behaviour is under test).
func sdkClient(baseURL, requestID, behavior string) openai.Client {
	opts := []option.RequestOption{
		option.WithBaseURL(baseURL + "/v1/"),
		option.WithAPIKey("sk-client-key"),
		option.WithMaxRetries(0),
		option.WithHeader(llmsim.HeaderRequest, requestID),
	}
	if behavior != "" {
		opts = append(opts, option.WithHeader(llmsim.HeaderBehavior, behavior))
	}
	return openai.NewClient(opts...)
}

// chatParams is a small chat request.
func chatParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    "client-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something.")},
	}
}

// streamed is what the SDK's streaming client received.
type streamed struct {
	text   string
	ids    map[string]bool // chunk ids: each names the upstream that made it
	models map[string]bool
	err    error
}

// streamChat runs one streaming chat completion through the SDK.
func streamChat(ctx context.Context, client openai.Client, opts ...option.RequestOption) streamed {
	out := streamed{ids: map[string]bool{}, models: map[string]bool{}}
	stream := client.Chat.Completions.NewStreaming(ctx, chatParams(), opts...)
	defer stream.Close()
	var text strings.Builder
	for stream.Next() {
		chunk := stream.Current()
		out.ids[chunk.ID] = true
		out.models[chunk.Model] = true
		for _, choice := range chunk.Choices {
			text.WriteString(choice.Delta.Content)
		}
	}
	out.text, out.err = text.String(), stream.Err()
	return out
}

// fromOnly checks that a whole answer came from exactly one upstream.
func (s streamed) fromOnly(upstream, requestID string) error {
	if s.err != nil {
		return fmt.Errorf("stream error: %v", s.err)
	}
	want := "chatcmpl-" + upstream + "-" + requestID
	if len(s.ids) != 1 || !s.ids[want] {
		return fmt.Errorf("chunk ids %v, want only %s", s.ids, want)
	}
	if got, wantText := s.text, llmsim.ExpectedChatText(requestID, simTokens); got != wantText {
		return fmt.Errorf("text %q, want %q", got, wantText)
	}
	return nil
}

// fromOneOf checks that a whole answer came from exactly one of upstreams.
func (s streamed) fromOneOf(upstreams []string, requestID string) error {
	var err error
	for _, up := range upstreams {
		if err = s.fromOnly(up, requestID); err == nil {
			return nil
		}
	}
	return err
}

// apiStatus returns the HTTP status of an SDK error, or 0.
func apiStatus(err error) int {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		return apiErr.StatusCode
	}
	return 0
}
