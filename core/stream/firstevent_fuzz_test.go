package stream

// Yaegi: `yaegi test` v0.16.1 loads this file as is. Its stdlib symbols
// include testing.F, so FuzzFirstEventDetector compiles; it only collects
// func(*testing.T) and func(*testing.B), so the fuzz target is never run
// there (the properties it checks are also checked on fixed streams by
// TestFirstEventSplitAtEveryByte, which Yaegi runs). Should a later Yaegi
// fail to load it, the guard is `//go:build gc` plus `// +build gc`: Yaegi
// honours only `+build` lines and does not set the gc tag, while the go tool
// (gc compiler) does.

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
)

// FuzzFirstEventDetector checks, for any body, rule, line limit and split
// point: no panic; the verdict and reason are the same whether the body is
// fed at once, in two pieces or byte by byte; End never leaves the verdict
// pending; the line and data buffers never exceed maxLine.
//
//	go test -run='^$' -fuzz=FuzzFirstEventDetector -fuzztime=20s ./core
func FuzzFirstEventDetector(f *testing.F) {
	rules := []string{config.RuleAuto, config.RuleOpenAIChat, config.RuleOpenAIResponses, config.RuleAnthropic, config.RuleAny}
	sse := []string{chatStream, chatNoOutputStream, chatFinishOnlyStream, responsesStream, anthropicStream, anthropicErrorStream, otherStream,
		"data: {\"choices\":\r\ndata: [{\"delta\":\rdata: {\"content\":\"a\"}}]}\n\r\n",
		"\xEF\xBB\xBFevent: error\ndata: {\"error\":{\"message\":\"overloaded\"}}\n\n",
		"data: {\"type\":\"response.failed\",\"response\":{\"error\":{\"message\":\"x\"}}}\r\r",
	}
	for i, s := range sse {
		f.Add([]byte(s), len(s)/2, uint8(i), false, uint16(4096))
		f.Add([]byte(s), i*7, uint8(0), false, uint16(40)) // small limit: line failures
	}
	nd := []string{ollamaChatStream, ollamaGenerateStream,
		"{\"error\":\"model not found\"}\n",
		"{\"response\":\"\",\"done\":false}\r\n{\"response\":\"a\"",
		"{}\n[1]\nnull\n{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n",
	}
	for i, s := range nd {
		f.Add([]byte(s), len(s)/3, uint8(i), true, uint16(4096))
		f.Add([]byte(s), i*11, uint8(4), true, uint16(50))
	}
	f.Fuzz(func(t *testing.T, body []byte, split int, rule uint8, ndjson bool, maxLine uint16) {
		format := FormatSSE
		if ndjson {
			format = FormatNDJSON
		}
		limit := 1 + int(maxLine)%8192
		if split < 0 {
			split = -(split + 1)
		}
		split = split % (len(body) + 1)
		detectSplits(t, format, rules[int(rule)%len(rules)], limit, string(body), split)
	})
}

// FuzzChatFastPath checks that wherever the Chat chunk fast path answers,
// it gives the general rules' verdict, for any event data.
//
//	go test -run='^$' -fuzz=FuzzChatFastPath -fuzztime=20s ./core
func FuzzChatFastPath(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`,
		`{"choices":[{"index":0,"delta":{},"finish_reason":""},{"delta":{"tool_calls":[]}}]}`,
		`{"choices":[{"text":"","finish_reason":0}]}`,
		`{"choices":[{"delta":{"reasoning":"","audio":null,"function_call":{}}}]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		fast, ok := classifyChatChunk([]byte(data))
		if !ok || spellsFieldInOtherCase(data) {
			return // the one known difference (see chatchunk.go)
		}
		for _, rule := range []string{config.RuleAuto, config.RuleOpenAIChat} {
			if general, _ := classifyEvent(rule, data, ""); fast != general {
				t.Fatalf("%s %q: fast path says %s, the general rules %s", rule, data, verdictNames[fast], verdictNames[general])
			}
		}
	})
}

// chatFields are the member names the fast path decodes.
var chatFields = []string{"type", "error", "choices", "text", "delta", "finish_reason", "content", "refusal",
	"reasoning_content", "reasoning", "tool_calls", "function_call", "audio"}

// spellsFieldInOtherCase reports whether data's chunk, choice or delta
// objects have a member that encoding/json matches to a fast-path field
// only by ignoring case.
func spellsFieldInOtherCase(data string) bool {
	var top map[string]interface{}
	if json.Unmarshal([]byte(data), &top) != nil {
		return false
	}
	objects := []map[string]interface{}{top}
	choices, _ := top["choices"].([]interface{})
	for _, c := range choices {
		if ch, ok := c.(map[string]interface{}); ok {
			objects = append(objects, ch)
			if d, ok := ch["delta"].(map[string]interface{}); ok {
				objects = append(objects, d)
			}
		}
	}
	for _, obj := range objects {
		for k := range obj {
			for _, f := range chatFields {
				if k != f && strings.EqualFold(k, f) {
					return true
				}
			}
		}
	}
	return false
}
