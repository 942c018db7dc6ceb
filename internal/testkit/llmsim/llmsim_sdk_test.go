package llmsim

// These tests prove that the simulated answers are accepted by the official
// OpenAI Go SDK, the client most of the gateway's users run.

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
)

func sdkClient(run *Running, requestID string, extra ...option.RequestOption) openai.Client {
	opts := append([]option.RequestOption{
		option.WithBaseURL(run.URL + "/v1/"),
		option.WithAPIKey("sk-test"),
		option.WithMaxRetries(0),
		option.WithHeader(HeaderRequest, requestID),
	}, extra...)
	return openai.NewClient(opts...)
}

func chatParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    "gpt-sim",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	}
}

// The chat stream, pings and role-only chunk included, decodes chunk by
// chunk and accumulates into the expected answer.
func TestSDKChatStream(t *testing.T) {
	w := fast()
	w.PingEvery = ms // several pings before the first token
	run := Start("A", w)
	defer run.Close()
	client := sdkClient(run, "sdk-1")
	stream := client.Chat.Completions.NewStreaming(context.Background(), chatParams())
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		chunk := stream.Current()
		if !acc.AddChunk(chunk) {
			t.Fatalf("accumulator rejected chunk %d: %s", chunks, chunk.RawJSON())
		}
		if chunk.ID != "chatcmpl-A-sdk-1" || chunk.SystemFingerprint != "A" || chunk.Model != "gpt-sim" {
			t.Fatalf("chunk %d does not name its upstream: %s", chunks, chunk.RawJSON())
		}
		if chunks == 0 && (chunk.Choices[0].Delta.Role != "assistant" || chunk.Choices[0].Delta.Content != "") {
			t.Fatalf("first chunk is not role-only: %s", chunk.RawJSON())
		}
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks != 1+5+1 {
		t.Fatalf("%d chunks, want role + 5 tokens + finish", chunks)
	}
	if got, want := acc.Choices[0].Message.Content, ExpectedChatText("sdk-1", 5); got != want {
		t.Fatalf("accumulated %q, want %q", got, want)
	}
	if acc.Choices[0].FinishReason != "stop" {
		t.Fatalf("finish reason %q", acc.Choices[0].FinishReason)
	}
}

func TestSDKChatNonStreaming(t *testing.T) {
	run := Start("B", fast())
	defer run.Close()
	client := sdkClient(run, "sdk-2")
	resp, err := client.Chat.Completions.New(context.Background(), chatParams())
	if err != nil {
		t.Fatal(err)
	}
	if resp.ID != "chatcmpl-B-sdk-2" || resp.Choices[0].Message.Content != ExpectedChatText("sdk-2", 5) ||
		resp.Choices[0].FinishReason != "stop" || resp.Usage.CompletionTokens != 5 {
		t.Fatalf("completion %s", resp.RawJSON())
	}
}

// The SDK reports an error event as a stream error, and an error status as
// an *openai.Error.
func TestSDKErrors(t *testing.T) {
	run := Start("A", fast())
	defer run.Close()

	client := sdkClient(run, "sdk-3", option.WithHeader(HeaderBehavior, "A=error_event"))
	stream := client.Chat.Completions.NewStreaming(context.Background(), chatParams())
	for stream.Next() {
		if c := stream.Current(); len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
			t.Fatalf("output before the error: %s", c.RawJSON())
		}
	}
	var se *ssestream.StreamError
	if !errors.As(stream.Err(), &se) {
		t.Fatalf("stream error %v, want *ssestream.StreamError", stream.Err())
	}

	client = sdkClient(run, "sdk-4", option.WithHeader(HeaderBehavior, "A=status:429,retry_after:3"))
	_, err := client.Chat.Completions.New(context.Background(), chatParams())
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests ||
		apiErr.Code != "rate_limit_exceeded" || apiErr.Response.Header.Get("Retry-After") != "3" {
		t.Fatalf("error %v", err)
	}

	client = sdkClient(run, "sdk-5", option.WithHeader(HeaderBehavior, "A=reset_after:2"))
	stream = client.Chat.Completions.NewStreaming(context.Background(), chatParams())
	for stream.Next() {
	}
	if stream.Err() == nil {
		t.Fatal("a reset stream ended without error")
	}
}

func TestSDKResponses(t *testing.T) {
	w := fast()
	w.PingEvery = ms
	run := Start("A", w)
	defer run.Close()
	client := sdkClient(run, "sdk-6")
	params := responses.ResponseNewParams{
		Model: "gpt-sim",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
	}
	stream := client.Responses.NewStreaming(context.Background(), params)
	var deltas string
	var completed responses.Response
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			deltas += ev.Delta
		case "response.completed":
			completed = ev.AsResponseCompleted().Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	want := ExpectedChatText("sdk-6", 5)
	if deltas != want || completed.OutputText() != want || completed.ID != "resp_A_sdk-6" || completed.Status != "completed" {
		t.Fatalf("deltas %q, completed %s", deltas, completed.RawJSON())
	}

	resp, err := client.Responses.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if resp.OutputText() != want || resp.Usage.OutputTokens != 5 {
		t.Fatalf("response %s", resp.RawJSON())
	}
}
