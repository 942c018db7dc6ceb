package stream

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
)

// answerSchema is the schema of the answers below: {"city": string}.
// roleChunk is a Chat stream's first chunk: the role, no content.
const roleChunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"

const answerSchema = `{"type":"object","required":["city"],"properties":{"city":{"type":"string"}},"additionalProperties":false}`

// Every check on every format: Chat, Responses and Anthropic, whole and
// streamed (and Ollama's chat); each failure names the wrong value.
func TestValidityChecksEveryFormat(t *testing.T) {
	var schema interface{}
	if err := json.Unmarshal([]byte(answerSchema), &schema); err != nil {
		t.Fatal(err)
	}
	all := CheckFinish | CheckNoRefusal | CheckJSON | CheckJSONSchema
	cases := []struct {
		name       string
		body       string
		streaming  bool
		sse        bool
		checks     int
		wantCheck  string
		wantReason string
	}{
		// Chat Completions, whole.
		{"chat valid", `{"choices":[{"message":{"role":"assistant","content":"{\"city\":\"Paris\"}"},"finish_reason":"stop"}]}`, false, false, all, "", ""},
		{"chat tool call", `{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c"}]},"finish_reason":"tool_calls"}]}`, false, false, all, "", ""},
		{"chat length", `{"choices":[{"message":{"content":"{\"city\":"},"finish_reason":"length"}]}`, false, false, all, config.ValidateFinish, `finished with "length"`},
		{"chat content_filter", `{"choices":[{"message":{"content":""},"finish_reason":"content_filter"}]}`, false, false, CheckFinish, config.ValidateFinish, `"content_filter"`},
		{"chat refusal", `{"choices":[{"message":{"content":null,"refusal":"I can't help"},"finish_reason":"stop"}]}`, false, false, all, config.ValidateNoRefusal, `refusal: "I can't help"`},
		{"chat not json", `{"choices":[{"message":{"content":"Paris"},"finish_reason":"stop"}]}`, false, false, CheckJSON, config.ValidateJSON, `not JSON`},
		{"chat schema", `{"choices":[{"message":{"content":"{\"city\":7}"},"finish_reason":"stop"}]}`, false, false, all, config.ValidateJSONSchema, `$.city: got number 7, want string`},
		{"chat second choice", `{"choices":[{"message":{"content":"{\"city\":\"a\"}"},"finish_reason":"stop"},{"message":{"content":"{}"},"finish_reason":"stop"}]}`, false, false, all, config.ValidateJSONSchema, `choice 1`},
		// Chat Completions, streamed.
		{"chat stream valid", roleChunk + tokenChunk(`{\"city\":`) + tokenChunk(`\"Rome\"}`) +
			"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n", true, true, all, "", ""},
		{"chat stream cut", roleChunk + tokenChunk(`{\"city\":`) + "data: [DONE]\n\n", true, true, CheckFinish, config.ValidateFinish, `no finish reason`},
		{"chat stream refusal", "data: {\"choices\":[{\"index\":0,\"delta\":{\"refusal\":\"No.\"}}]}\n\n" +
			"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n", true, true, CheckNoRefusal, config.ValidateNoRefusal, `"No."`},
		{"chat stream schema", tokenChunk(`{\"town\":\"x\"}`) + "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
			true, true, CheckJSONSchema, config.ValidateJSONSchema, `required property "city" is missing`},
		// Responses API, whole and streamed.
		{"responses valid", `{"object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"{\"city\":\"Oslo\"}"}]}]}`, false, false, all, "", ""},
		{"responses incomplete", `{"object":"response","status":"incomplete","output":[{"type":"message","content":[{"type":"output_text","text":"{"}]}]}`, false, false, all, config.ValidateFinish, `"incomplete"`},
		{"responses refusal", `{"object":"response","status":"completed","output":[{"type":"message","content":[{"type":"refusal","refusal":"Sorry"}]}]}`, false, false, all, config.ValidateNoRefusal, `"Sorry"`},
		{"responses schema", `{"object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"{\"city\":null}"}]}]}`, false, false, all, config.ValidateJSONSchema, `$.city: got null, want string`},
		{"responses stream valid", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"{\\\"city\\\":\\\"Bern\\\"}\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"{\\\"city\\\":\\\"Bern\\\"}\"}]}]}}\n\n",
			true, true, all, "", ""},
		{"responses stream final without output", "data: {\"type\":\"response.output_text.delta\",\"delta\":\"{\\\"city\\\":\\\"Bern\\\"}\"}\n\n" +
			"data: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\"}}\n\n", true, true, all, "", ""},
		{"responses stream incomplete", "data: {\"type\":\"response.output_text.delta\",\"delta\":\"{\"}\n\n" +
			"data: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\"}}\n\n", true, true, CheckFinish, config.ValidateFinish, `"incomplete"`},
		{"responses stream no final event", "data: {\"type\":\"response.output_text.delta\",\"delta\":\"{}\"}\n\n", true, true, CheckFinish, config.ValidateFinish, `no finish reason`},
		{"responses stream refusal", "data: {\"type\":\"response.refusal.delta\",\"delta\":\"I won't\"}\n\n", true, true, CheckNoRefusal, config.ValidateNoRefusal, `"I won't"`},
		// Anthropic Messages, whole and streamed.
		{"anthropic valid", `{"type":"message","content":[{"type":"text","text":"{\"city\":\"Lima\"}"}],"stop_reason":"end_turn"}`, false, false, all, "", ""},
		{"anthropic tool use", `{"type":"message","content":[{"type":"tool_use","id":"t"}],"stop_reason":"tool_use"}`, false, false, all, "", ""},
		{"anthropic max_tokens", `{"type":"message","content":[{"type":"text","text":"{"}],"stop_reason":"max_tokens"}`, false, false, all, config.ValidateFinish, `"max_tokens"`},
		{"anthropic refusal", `{"type":"message","content":[],"stop_reason":"refusal"}`, false, false, CheckNoRefusal, config.ValidateNoRefusal, `stop_reason refusal`},
		{"anthropic schema", `{"type":"message","content":[{"type":"text","text":"[]"}],"stop_reason":"end_turn"}`, false, false, CheckJSONSchema, config.ValidateJSONSchema, `$: got array of 0, want object`},
		{"anthropic stream valid", "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"{\\\"city\\\":\\\"Kyiv\\\"}\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", true, true, all, "", ""},
		{"anthropic stream max_tokens", "data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"{\"}}\n\n" +
			"data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"}}\n\n", true, true, CheckFinish, config.ValidateFinish, `"max_tokens"`},
		{"anthropic stream refusal", "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"refusal\"}}\n\n", true, true, CheckNoRefusal, config.ValidateNoRefusal, `refusal`},
		// Ollama chat, whole and NDJSON.
		{"ollama valid", `{"message":{"content":"{\"city\":\"Riga\"}"},"done":true,"done_reason":"stop"}`, false, false, all, "", ""},
		{"ollama ndjson length", "{\"message\":{\"content\":\"{\"},\"done\":false}\n{\"message\":{\"content\":\"\"},\"done\":true,\"done_reason\":\"length\"}\n", true, false, CheckFinish, config.ValidateFinish, `"length"`},
		// Unrecognised answers fail: a check that cannot be made does not pass.
		{"unknown shape", `{"hello":"world"}`, false, false, CheckJSON, config.ValidateJSON, `not a recognised`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ans := AnswerOf([]byte(c.body), c.streaming, c.sse)
			check, why := FailedCheck(ans, c.checks, schema)
			if check != c.wantCheck {
				t.Fatalf("failed check = %q (%s), want %q", check, why, c.wantCheck)
			} else if !strings.Contains(why, c.wantReason) {
				t.Fatalf("reason = %q, want it to contain %q", why, c.wantReason)
			}
		})
	}
}

// The schema comes from the request: Chat's response_format, the Responses
// API's text.format, Anthropic's output_format.
func TestRequestSchema(t *testing.T) {
	for name, body := range map[string]string{
		"chat":      `{"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}}`,
		"responses": `{"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}}}`,
		"anthropic": `{"output_format":{"type":"json_schema","schema":{"type":"object"}}}`,
	} {
		s, _ := RequestSchema([]byte(body)).(map[string]interface{})
		if s["type"] != "object" {
			t.Errorf("%s: RequestSchema type = %v, want object", name, s["type"])
		}
	}
	if s := RequestSchema([]byte(`{"response_format":{"type":"json_object"}}`)); s != nil {
		t.Errorf("json_object: RequestSchema = %v, want none", s)
	}
}

// tokenChunk is a Chat stream chunk carrying s as content.
func tokenChunk(s string) string {
	return "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + s + "\"}}]}\n\n"
}
