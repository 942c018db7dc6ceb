package stream

import (
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
)

// TestChatFastPathAgreesWithGeneralRules feeds chat-like event data to the
// fast path and the general rules: wherever the fast path answers, it must
// give the general rules' verdict, and it must answer for the plain shapes
// every OpenAI-compatible server sends.
func TestChatFastPathAgreesWithGeneralRules(t *testing.T) {
	cases := []struct {
		data     string
		fastPath bool // the fast path must take it
	}{
		{`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`, true},
		{`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`, true},
		{` {"choices":[{"delta":{"content":"x"}}]} `, true},
		{`{"choices":[]}`, true},
		{`{"choices":[{"delta":{}}]}`, true},
		{`{"choices":[{"delta":null}]}`, true},
		{`{"choices":[null]}`, true},
		{`{"choices":[{"text":"legacy"}]}`, true},
		{`{"choices":[{"text":""}]}`, true},
		{`{"choices":[{"delta":{"refusal":"no"}}]}`, true},
		{`{"choices":[{"delta":{"reasoning_content":"hmm"}}]}`, true},
		{`{"choices":[{"delta":{"reasoning":"hmm"}}]}`, true},
		{`{"choices":[{"delta":{"content":[{"type":"text","text":"a"}]}}]}`, true},
		{`{"choices":[{"delta":{"content":[ ]}}]}`, true},
		{`{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"t","function":{"name":"f","arguments":""}}]}}]}`, true},
		{`{"choices":[{"delta":{"tool_calls":[]}}]}`, true},
		{`{"choices":[{"delta":{"function_call":{"name":"f"}}}]}`, true},
		{`{"choices":[{"delta":{"function_call":{ }}}]}`, true},
		{`{"choices":[{"delta":{"content":null,"role":"assistant"}}]}`, true},
		{`{"choices":[{"delta":{"content":"\u0000"}}]}`, true},
		{`{"choices":[{"delta":{"content":1,"tool_calls":{}}}]}`, true},
		{`{"choices":[{"index":0,"delta":{"role":"assistant"}},{"index":1,"delta":{"content":"b"}}]}`, true},
		{`{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`, true},
		{`{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"content_filter"}]}`, true},
		{`{"choices":[{"index":0,"finish_reason":"stop"}],"usage":{"completion_tokens":9}}`, true},
		{`{"choices":[{"index":0,"delta":{},"finish_reason":""}]}`, true},
		{`{"choices":[{"index":0,"delta":{},"finish_reason":null},{"index":1,"delta":{},"finish_reason":"stop"}]}`, true},
		{`{"choices":[{"text":"","finish_reason":"length"}]}`, true},
		{`{"choices":[{"delta":{"reasoning_content":""},"finish_reason":"length"}]}`, true},
		// Left to the general rules.
		{`{"choices":[{"delta":{"audio":{"id":"a1"}}}]}`, false},
		{`{"choices":[{"delta":{"audio":{"transcript":"Hi"}}}]}`, false},
		{`{"choices":[{"delta":{"content":"x"}}],"error":{"message":"boom"}}`, false},
		{`{"choices":[{"delta":{"content":"x"}}],"error":false}`, false},
		{`{"choices":[{"delta":{"content":""}}],"error":null}`, false},
		{`{"type":"response.output_text.delta","delta":"x","choices":[]}`, false},
		{`{"choices":null}`, false},
		{`{"choices":"x"}`, false},
		{`{"choices":[1]}`, false},
		{`{"choices":[{"delta":"x"}]}`, false},
		{`{"choices":[{"delta":{},"finish_reason":1}]}`, false},
		{`{"choices":[{"delta":{},"finish_reason":false}]}`, false},
		{`{"choices":[{"delta":{},"finish_reason":{}}]}`, false},
		{`{"object":"chat.completion.chunk"}`, false},
		{`{"choices":[`, false},
		{`[DONE]`, false},
		{``, false},
		{`not json "choices"`, false},
	}
	for _, rule := range []string{config.RuleAuto, config.RuleOpenAIChat} {
		for _, c := range cases {
			fast, ok := classifyChatChunk([]byte(c.data))
			if ok != c.fastPath {
				t.Errorf("%s %s: fast path taken = %v, want %v", rule, c.data, ok, c.fastPath)
			}
			if !ok {
				continue
			}
			general, _ := classifyEvent(rule, c.data, "")
			if fast != general {
				t.Errorf("%s %s: fast path says %v, the general rules %v", rule, c.data, fast, general)
			}
		}
	}
}
