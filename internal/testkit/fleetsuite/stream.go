package fleetsuite

import (
	"context"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// StreamChat sends one streaming chat completion of prompt with the
// Idempotency-Key key through client and returns the text it got and the
// stream's error. firstChunk, when set, runs on the first chunk; each,
// when set, sees every chunk.
func StreamChat(ctx context.Context, client openai.Client, key, prompt string, firstChunk func(), each func(openai.ChatCompletionChunk)) (string, error) {
	params := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}
	stream := client.Chat.Completions.NewStreaming(ctx, params, option.WithHeader("Idempotency-Key", key))
	defer stream.Close()
	var text strings.Builder
	for stream.Next() {
		if firstChunk != nil {
			firstChunk()
			firstChunk = nil
		}
		chunk := stream.Current()
		if each != nil {
			each(chunk)
		}
		for _, choice := range chunk.Choices {
			text.WriteString(choice.Delta.Content)
		}
	}
	return text.String(), stream.Err()
}
