package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// clientTransport is shared by every SDK client so that 20 concurrent
// clients reuse their connections instead of exhausting loopback ports.
var clientTransport = &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}

// sdk returns an OpenAI SDK client for baseURL (e.g. traefik.URL+"/hedge/v1/").
// Retries are off: a failure must be seen, not papered over.
func sdk(baseURL string) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(baseURL),
		option.WithAPIKey("sk-client"),
		option.WithMaxRetries(0),
		option.WithHTTPClient(&http.Client{Transport: clientTransport}),
	)
}

func chatParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    openai.ChatModel(llmsim.DefaultModel),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something.")},
	}
}

// requestOptions are the per-request headers: the simulator's request id
// and, when set, its scripted behaviours.
func requestOptions(id, behavior string, extra ...option.RequestOption) []option.RequestOption {
	opts := []option.RequestOption{option.WithHeader(llmsim.HeaderRequest, id)}
	if behavior != "" {
		opts = append(opts, option.WithHeader(llmsim.HeaderBehavior, behavior))
	}
	return append(opts, extra...)
}

// streamed is what one streaming request delivered to the SDK.
type streamed struct {
	content  string
	ids      map[string]bool // chunk ids: "chatcmpl-<upstream>-<request id>"
	finished bool            // a chunk with finish_reason "stop" arrived
	err      error
	ttft     time.Duration // to the first chunk with content
	total    time.Duration
	header   http.Header
}

// streamChat runs one streaming chat completion through the SDK. onContent,
// when set, is called after every chunk that carries content; extra are
// further request options (an Idempotency-Key header).
func streamChat(ctx context.Context, c openai.Client, id, behavior string, onContent func(i int), extra ...option.RequestOption) streamed {
	var resp *http.Response
	start := time.Now()
	s := c.Chat.Completions.NewStreaming(ctx, chatParams(), requestOptions(id, behavior, append(extra, option.WithResponseInto(&resp))...)...)
	defer s.Close()
	out := streamed{ids: map[string]bool{}}
	n := 0
	for s.Next() {
		ch := s.Current()
		out.ids[ch.ID] = true
		for _, choice := range ch.Choices {
			if choice.Delta.Content != "" {
				if out.ttft == 0 {
					out.ttft = time.Since(start)
				}
				out.content += choice.Delta.Content
				if onContent != nil {
					onContent(n)
				}
				n++
			}
			if choice.FinishReason == "stop" {
				out.finished = true
			}
		}
	}
	out.err = s.Err()
	out.total = time.Since(start)
	if resp != nil {
		out.header = resp.Header
	}
	return out
}

// whole reports whether r is the complete answer to request id, from one
// upstream only (named in the returned string).
// notWhole names the first reason why r is not the whole answer to id
// that whole looks for.
func (r streamed) notWhole(id string, tokens int) string {
	switch want := llmsim.ExpectedChatText(id, tokens); {
	case r.err != nil:
		return fmt.Sprintf("stream error %v, want none", r.err)
	case !r.finished:
		return "the stream did not finish"
	case len(r.ids) != 1:
		return fmt.Sprintf("chunks from %d answers %v, want one", len(r.ids), r.ids)
	case r.content != want:
		return fmt.Sprintf("content %q, want %q", r.content, want)
	}
	return fmt.Sprintf("chunk ids %v do not name an upstream", r.ids)
}

func (r streamed) whole(id string, tokens int) (upstream string, ok bool) {
	if r.err != nil || !r.finished || len(r.ids) != 1 || r.content != llmsim.ExpectedChatText(id, tokens) {
		return "", false
	}
	for chunkID := range r.ids {
		name := strings.TrimSuffix(strings.TrimPrefix(chunkID, "chatcmpl-"), "-"+id)
		return name, name != chunkID
	}
	return "", false
}
