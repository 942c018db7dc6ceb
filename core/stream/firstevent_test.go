package stream

import (
	"strings"
	"sync"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/redact"
)

// Realistic streams, shared with the fuzz seeds. Each reaches its first
// output event in the middle and then goes on, so a detector that looks past
// the event or decides too early is caught.
const (
	chatStream = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n" +
		": ping\n\n" +
		": ping\n\n" +
		"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n" +
		"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: [DONE]\n\n"
	// No output and no final event: [DONE] decides, as a failure.
	chatNoOutputStream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n" +
		": ping\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":null}]}\n\n" +
		"data: [DONE]\n\n"
	// No visible output, but a final event (a reasoning model that spent
	// its budget on hidden reasoning): the finish_reason chunk decides.
	chatFinishOnlyStream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n" +
		": ping\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}],\"usage\":{\"completion_tokens\":4096}}\n\n" +
		"data: [DONE]\n\n"
	responsesStream = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n" +
		"event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n" +
		"event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}\n\n" +
		"event: response.content_part.added\ndata: {\"type\":\"response.content_part.added\",\"sequence_number\":3,\"part\":{\"type\":\"output_text\",\"text\":\"\"}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":5,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\"}}\n\n"
	anthropicStream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: ping\ndata: {\"type\": \"ping\"}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	anthropicErrorStream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\"}}\n\n" +
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	otherStream = "retry: 3000\n\n" +
		": keep-alive\n\n" +
		"id: 1\nevent: token\ndata: Hello\n\n" +
		"data: world\n\n"
	ollamaChatStream = "{\"model\":\"llama3.2\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":false}\n" +
		"{\"model\":\"llama3.2\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"done\":false}\n" +
		"{\"model\":\"llama3.2\",\"created_at\":\"2024-01-01T00:00:01Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\"}\n"
	ollamaGenerateStream = "{\"model\":\"llama3.2\",\"created_at\":\"2024-01-01T00:00:00Z\",\"response\":\"\",\"done\":false}\n" +
		"{\"model\":\"llama3.2\",\"created_at\":\"2024-01-01T00:00:00Z\",\"response\":\"The\",\"done\":false}\n" +
		"{\"model\":\"llama3.2\",\"created_at\":\"2024-01-01T00:00:01Z\",\"response\":\"\",\"done\":true,\"done_reason\":\"stop\",\"context\":[1,2,3]}\n"
)

var verdictNames = map[Verdict]string{VerdictPending: "pending", VerdictOutput: "output", VerdictFailure: "failure"}

// feedChunks feeds chunks in order and calls End when the body ends pending.
func feedChunks(d *Detector, chunks ...string) (Verdict, string) {
	for _, c := range chunks {
		if v, reason := Feed(d, []byte(c)); v != VerdictPending {
			return v, reason
		}
	}
	return d.End()
}

// checkBounded fails when a buffer of d can hold more than maxLine bytes.
func checkBounded(t *testing.T, d *Detector) {
	t.Helper()
	if cap(d.line) > d.maxLine {
		t.Fatalf("cap(d.line) = %v, want <= d.maxLine (%v)", cap(d.line), d.maxLine)
	} else if cap(d.data) > d.maxLine {
		t.Fatalf("cap(d.data) = %v, want <= d.maxLine (%v)", cap(d.data), d.maxLine)
	}
}

// detectSplits feeds stream to a detector all at once, byte by byte, and in
// two pieces at each of splits (every split point when none is given), fails
// unless all give the same verdict and reason with bounded buffers, and
// returns that verdict. Used by the split tests and the fuzz target.
func detectSplits(t *testing.T, format Format, rule string, maxLine int, stream string, splits ...int) (Verdict, string) {
	t.Helper()
	v0, r0 := feedChunks(NewDetector(format, rule, maxLine), stream)
	if v0 == VerdictPending {
		t.Fatalf("End left the verdict pending (stream %q)", stream)
	}
	if (v0 == VerdictFailure) != (r0 != "") {
		t.Fatalf("verdict %s with reason %q", verdictNames[v0], r0)
	}

	d := NewDetector(format, rule, maxLine)
	v, r := VerdictPending, ""
	for i := 0; i < len(stream) && v == VerdictPending; i++ {
		v, r = Feed(d, []byte{stream[i]})
		checkBounded(t, d)
	}
	if v == VerdictPending {
		v, r = d.End()
	}
	if v != v0 || r != r0 {
		t.Fatalf("whole: %s %q, byte by byte: %s %q (stream %q)", verdictNames[v0], r0, verdictNames[v], r, stream)
	}

	if len(splits) == 0 {
		for i := 0; i <= len(stream); i++ {
			splits = append(splits, i)
		}
	}
	for _, split := range splits {
		if split < 0 || split > len(stream) {
			split = len(stream)
		}
		v, r := feedChunks(NewDetector(format, rule, maxLine), stream[:split], stream[split:])
		if v != v0 || r != r0 {
			t.Fatalf("whole: %s %q, split at %d: %s %q (stream %q)", verdictNames[v0], r0, split, verdictNames[v], r, stream)
		}
	}
	return v0, r0
}

func TestStreamFormatOf(t *testing.T) {
	cases := []struct {
		ct   string
		want Format
		ok   bool
	}{
		{"text/event-stream", FormatSSE, true},
		{"Text/Event-Stream; charset=utf-8", FormatSSE, true},
		{"text/event-stream;charset=\"utf-8", FormatSSE, true}, // broken parameter
		{"application/x-ndjson", FormatNDJSON, true},
		{"application/jsonl; charset=utf-8", FormatNDJSON, true},
		{"application/json", 0, false},
		{"application/json-seq", 0, false},
		{"text/plain", 0, false},
		{"", 0, false},
	}
	for _, c := range cases {
		got, ok := FormatOf(c.ct)
		if got != c.want || ok != c.ok {
			t.Errorf("FormatOf(%q) = %d, %v; want %d, %v", c.ct, got, ok, c.want, c.ok)
		}
	}
}

type detectorCase struct {
	name   string
	rule   string // "" means auto
	stream string
	want   Verdict
	reason string // substring of the failure reason
}

func runDetectorCases(t *testing.T, format Format, cases []detectorCase) {
	t.Helper()
	for _, c := range cases {
		v, reason := feedChunks(NewDetector(format, c.rule, 1024), c.stream)
		if v != c.want {
			t.Errorf("%s: verdict %s (reason %q), want %s", c.name, verdictNames[v], reason, verdictNames[c.want])
		} else if !strings.Contains(reason, c.reason) {
			t.Errorf("%s: reason %q, want it to contain %q", c.name, reason, c.reason)
		} else if c.want == VerdictOutput && reason != "" {
			t.Errorf("%s: output with reason %q, want none", c.name, reason)
		}
	}
}

func chatChunk(delta string) string {
	return "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":" + delta + ",\"finish_reason\":null}]}\n\n"
}

const roleOnly = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n"

func TestFirstEventSSEOpenAIChat(t *testing.T) {
	runDetectorCases(t, FormatSSE, []detectorCase{
		{"realistic", "", chatStream, VerdictOutput, ""},
		{"realistic, explicit rule", config.RuleOpenAIChat, chatStream, VerdictOutput, ""},
		{"role-only and pings never win", "", roleOnly + ": ping\n\n" + roleOnly, VerdictFailure, "stream ended before the first output event"},
		{"empty content is not output", "", chatChunk(`{"role":"assistant","content":"","refusal":null,"tool_calls":[]}`), VerdictFailure, "before the first output"},
		{"[DONE] before output", "", chatNoOutputStream, VerdictFailure, "stream ended ([DONE]) before the first output event"},
		{"[DONE] before output, explicit rule", config.RuleOpenAIChat, chatNoOutputStream, VerdictFailure, "[DONE]"},
		{"finish_reason without output is final", "", chatFinishOnlyStream, VerdictOutput, ""},
		{"finish_reason without output, explicit rule", config.RuleOpenAIChat, chatFinishOnlyStream, VerdictOutput, ""},
		{"finish_reason without output, rule any", config.RuleAny, chatFinishOnlyStream, VerdictOutput, ""},
		{"content filter finish", "", roleOnly + "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"content_filter\"}]}\n\n", VerdictOutput, ""},
		{"empty finish_reason is not final", "", roleOnly + "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"\"}]}\n\n", VerdictFailure, "before the first output"},
		{"legacy completions finish", "", "data: {\"object\":\"text_completion\",\"choices\":[{\"text\":\"\",\"index\":0,\"finish_reason\":\"length\"}]}\n\n", VerdictOutput, ""},
		{"tool_calls", "", roleOnly + chatChunk(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}`), VerdictOutput, ""},
		{"refusal", "", chatChunk(`{"refusal":"I can't"}`), VerdictOutput, ""},
		{"reasoning_content", "", chatChunk(`{"content":null,"reasoning_content":"Let me think"}`), VerdictOutput, ""},
		{"reasoning", "", chatChunk(`{"reasoning":"Hmm"}`), VerdictOutput, ""},
		{"audio with data", "", chatChunk(`{"audio":{"id":"a1","data":"UklGR"}}`), VerdictOutput, ""},
		{"audio transcript", "", chatChunk(`{"audio":{"transcript":"Hi"}}`), VerdictOutput, ""},
		{"audio without data", "", chatChunk(`{"audio":{"id":"a1"}}`), VerdictFailure, "before the first output"},
		{"legacy completions text", "", "data: {\"object\":\"text_completion\",\"choices\":[{\"text\":\"Once\",\"index\":0}]}\n\n", VerdictOutput, ""},
		{"second choice carries output", "", "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}},{\"index\":1,\"delta\":{\"content\":\"x\"}}]}\n\n", VerdictOutput, ""},
		{"usage-only chunk", "", "data: {\"choices\":[],\"usage\":{\"total_tokens\":3}}\n\n", VerdictFailure, "before the first output"},
		{"top-level error", "", roleOnly + "data: {\"error\":{\"message\":\"The server had an error\",\"type\":\"server_error\"}}\n\n", VerdictFailure, "upstream error: The server had an error"},
		{"top-level error, explicit rule", config.RuleOpenAIChat, "data: {\"error\":{\"message\":\"boom\"}}\n\n", VerdictFailure, "boom"},
		{"false error is no error", "", "data: {\"error\":false,\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", VerdictOutput, ""},
		{"null error is no error", "", "data: {\"error\":null,\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", VerdictOutput, ""},
		{"error event", "", roleOnly + "event: error\ndata: {\"error\":{\"message\":\"overloaded\"}}\n\n", VerdictFailure, "upstream error event: overloaded"},
		{"error event with text data", "", "event: error\ndata: rate limited\n\n", VerdictFailure, "upstream error event: rate limited"},
		{"error event, explicit rule", config.RuleOpenAIChat, "event:error\ndata: x\n\n", VerdictFailure, "upstream error event"},
		{"content after output-less events", "", roleOnly + "data: \n\n" + "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", VerdictOutput, ""},
		{"message instead of delta is not chat output", "", "data: {\"choices\":[{\"message\":{\"content\":\"a\"}}]}\n\n", VerdictFailure, "before the first output"},
		{"explicit rule ignores other dialects", config.RuleOpenAIChat, anthropicStream, VerdictFailure, "stream ended before the first output event"},
	})
}

func TestFirstEventSSEOpenAIResponses(t *testing.T) {
	created := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n\n"
	ev := func(typ, rest string) string {
		return "event: " + typ + "\ndata: {\"type\":\"" + typ + "\"" + rest + "}\n\n"
	}
	runDetectorCases(t, FormatSSE, []detectorCase{
		{"realistic", "", responsesStream, VerdictOutput, ""},
		{"realistic, explicit rule", config.RuleOpenAIResponses, responsesStream, VerdictOutput, ""},
		{"control events never win", "", created + ev("response.in_progress", "") + ev("response.output_item.added", `,"item":{"type":"message"}`) + ev("response.content_part.added", ""), VerdictFailure, "stream ended before the first output event"},
		{"function_call_arguments delta", "", created + ev("response.function_call_arguments.delta", `,"delta":"{\"a"`), VerdictOutput, ""},
		{"refusal delta", "", ev("response.refusal.delta", `,"delta":"no"`), VerdictOutput, ""},
		{"reasoning summary delta", "", ev("response.reasoning_summary_text.delta", `,"delta":"**Plan**"`), VerdictOutput, ""},
		{"audio delta", "", ev("response.audio.delta", `,"delta":"UklGR"`), VerdictOutput, ""},
		{"code interpreter delta", "", ev("response.code_interpreter_call_code.delta", `,"delta":"print(1)"`), VerdictOutput, ""},
		{"empty delta", "", ev("response.output_text.delta", `,"delta":""`), VerdictFailure, "stream ended before the first output event"},
		{"type without event name", "", "data: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n", VerdictOutput, ""},
		{"failed", "", created + ev("response.failed", `,"response":{"status":"failed","error":{"code":"server_error","message":"The model failed"}}`), VerdictFailure, "response.failed: The model failed"},
		{"failed without a message", "", created + ev("response.failed", `,"response":{"status":"failed"}`), VerdictFailure, "stream ended (response.failed) before the first output event"},
		{"incomplete is final", "", created + ev("response.incomplete", `,"response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}`), VerdictOutput, ""},
		{"completed without output is final", config.RuleOpenAIResponses, created + ev("response.completed", `,"response":{"status":"completed","error":null}`), VerdictOutput, ""},
		{"completed without output, rule any", config.RuleAny, created + ev("response.completed", `,"response":{"status":"completed"}`), VerdictOutput, ""},
		{"error type without event name", "", "data: {\"type\":\"error\",\"code\":\"ERR\",\"message\":\"Something went wrong\"}\n\n", VerdictFailure, "upstream error event: Something went wrong"},
		{"error type", "", created + ev("error", `,"code":"ERR","message":"Something went wrong"`), VerdictFailure, "upstream error event: Something went wrong"},
		{"explicit rule ignores chat chunks", config.RuleOpenAIResponses, chatChunk(`{"content":"x"}`), VerdictFailure, "stream ended before the first output event"},
	})
}

func TestFirstEventSSEAnthropic(t *testing.T) {
	runDetectorCases(t, FormatSSE, []detectorCase{
		{"realistic", "", anthropicStream, VerdictOutput, ""},
		{"realistic, explicit rule", config.RuleAnthropic, anthropicStream, VerdictOutput, ""},
		{"error event", "", anthropicErrorStream, VerdictFailure, "upstream error event: Overloaded"},
		{"control events never win", "", strings.Split(anthropicStream, "event: content_block_delta")[0], VerdictFailure, "stream ended before the first output event"},
		{"stop_reason without output is final", "", "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":0}}\n\n", VerdictOutput, ""},
		{"stop_reason from event name", config.RuleAnthropic, "event: message_delta\ndata: {\"delta\":{\"stop_reason\":\"refusal\"}}\n\n", VerdictOutput, ""},
		{"message_delta without stop_reason is control", "", "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null},\"usage\":{\"output_tokens\":3}}\n\n", VerdictFailure, "stream ended before the first output event"},
		{"message_stop is final", "", "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", VerdictOutput, ""},
		{"thinking delta", "", "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Hmm\"}}\n\n", VerdictOutput, ""},
		{"type from event name", config.RuleAnthropic, "event: content_block_delta\ndata: {\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n", VerdictOutput, ""},
		{"explicit rule ignores chat chunks", config.RuleAnthropic, chatStream, VerdictFailure, "[DONE]"},
	})
}

// Cohere v2 chat: message-start and content-start announce the answer and
// carry none of it; a stream that stalls after them is hedged.
func TestFirstEventSSECohere(t *testing.T) {
	ev := func(typ, rest string) string {
		return "event: " + typ + "\ndata: {\"type\":\"" + typ + "\"" + rest + "}\n\n"
	}
	start := ev("message-start", `,"id":"c1","delta":{"message":{"role":"assistant","content":[],"tool_plan":"","tool_calls":[],"citations":[]}}`) +
		ev("content-start", `,"index":0,"delta":{"message":{"content":{"type":"text","text":""}}}`)
	runDetectorCases(t, FormatSSE, []detectorCase{
		{"control events never win", "", start, VerdictFailure, "stream ended before the first output event"},
		{"control events never win, rule any", config.RuleAny, start + ev("content-end", `,"index":0`), VerdictFailure, "stream ended before the first output event"},
		{"content-delta", "", start + ev("content-delta", `,"index":0,"delta":{"message":{"content":{"text":"Hi"}}}`), VerdictOutput, ""},
		{"tool-plan-delta", "", ev("message-start", `,"id":"c1"`) + ev("tool-plan-delta", `,"delta":{"message":{"tool_plan":"I will"}}`), VerdictOutput, ""},
		{"message-end is final", "", start + ev("message-end", `,"delta":{"finish_reason":"MAX_TOKENS"}`), VerdictOutput, ""},
	})
}

func TestFirstEventSSEAny(t *testing.T) {
	runDetectorCases(t, FormatSSE, []detectorCase{
		{"plain text data", "", otherStream, VerdictOutput, ""},
		{"plain text data, rule any", config.RuleAny, otherStream, VerdictOutput, ""},
		{"unknown JSON", "", "data: {\"token\":\"Hi\"}\n\n", VerdictOutput, ""},
		{"empty JSON object is control", "", "data: {}\n\ndata: {\"text\":\"\",\"meta\":null}\n\n", VerdictFailure, "stream ended before the first output event"},
		{"empty data is control", config.RuleAny, "data:\n\ndata: \n\n", VerdictFailure, "stream ended before the first output event"},
		{"[DONE]", config.RuleAny, "data: [DONE]\n\n", VerdictFailure, "[DONE]"},
		{"top-level error", config.RuleAny, "data: {\"error\":\"quota\"}\n\n", VerdictFailure, "upstream error: quota"},
		{"known control kinds", config.RuleAny, "event: ping\ndata: ping\n\n" + "data: {\"type\":\"response.in_progress\"}\n\n" + "data: {\"type\":\"message_start\"}\n\n", VerdictFailure, "stream ended before the first output event"},
		{"known final event", config.RuleAny, "data: {\"type\":\"message_stop\"}\n\n", VerdictOutput, ""},
		{"role-only chat chunk", config.RuleAny, roleOnly + chatChunk(`{"content":"","tool_calls":null}`), VerdictFailure, "stream ended before the first output event"},
		{"any chat chunk with content", config.RuleAny, "data: {\"choices\":[{\"message\":{\"content\":\"a\"}}]}\n\n", VerdictOutput, ""},
		{"chat content", config.RuleAny, chatStream, VerdictOutput, ""},
		{"explicit rules ignore plain text", config.RuleOpenAIChat, otherStream, VerdictFailure, "stream ended before the first output event"},
	})
}

func TestFirstEventSSEParsing(t *testing.T) {
	content := `{"choices":[{"delta":{"content":"a"}}]}`
	runDetectorCases(t, FormatSSE, []detectorCase{
		{"CRLF line ends", "", strings.Replace(chatStream, "\n", "\r\n", -1), VerdictOutput, ""},
		{"CR line ends", "", strings.Replace(chatStream, "\n", "\r", -1), VerdictOutput, ""},
		{"CR line ends, no output", "", strings.Replace(chatNoOutputStream, "\n", "\r", -1), VerdictFailure, "[DONE]"},
		{"mixed line ends", "", ": ping\r\n\r" + roleOnly + "data: " + content + "\r\n\n", VerdictOutput, ""},
		{"multi-line data is joined with LF", "", "data: {\"choices\":\ndata: [{\"delta\":\ndata: {\"content\":\"a\"}}]}\n\n", VerdictOutput, ""},
		{"multi-line data split mid-JSON string is not JSON", config.RuleOpenAIChat, "data: {\"choices\":[{\"delta\":{\"content\":\"a\ndata: b\"}}]}\n\n", VerdictFailure, "before the first output"},
		{"no space after colon", "", "data:" + content + "\n\n", VerdictOutput, ""},
		{"only one space is stripped", "", "event:  error\ndata: " + content + "\n\n", VerdictOutput, ""},
		{"field without colon", "", "data\n\n", VerdictFailure, "stream ended before the first output event"},
		{"event without data is ignored", "", "event: error\n\n" + "id: 7\nretry: 10\n\n" + "data: " + content + "\n\n", VerdictOutput, ""},
		{"event name resets after dispatch", "", "event: token\ndata: \n\n" + "data: " + content + "\n\n", VerdictOutput, ""},
		{"comment lines inside an event", "", "data: " + content + "\n: ping\n\n", VerdictOutput, ""},
		{"unknown fields are ignored", "", "foo: bar\nid: 1\ndata: " + content + "\n\n", VerdictOutput, ""},
		{"leading BOM", "", "\xEF\xBB\xBFdata: " + content + "\n\n", VerdictOutput, ""},
		{"unterminated event at EOF is discarded", "", "data: " + content + "\n", VerdictFailure, "stream ended before the first output event"},
		{"unterminated line at EOF is discarded", "", "data: " + content, VerdictFailure, "stream ended before the first output event"},
		{"empty body", "", "", VerdictFailure, "stream ended before the first output event"},
	})
}

// The verdict comes with the byte that completes the event (the blank
// line's line end), not earlier and not later.
func TestFirstEventDecidesAtEventEnd(t *testing.T) {
	cases := []struct {
		format       Format
		prefix, rest string
	}{
		{FormatSSE, chatStream[:strings.Index(chatStream, "Hello")] + "Hello\"},\"finish_reason\":null}]}\n\n", chatStream[strings.Index(chatStream, "Hello")+len("Hello\"},\"finish_reason\":null}]}\n\n"):]},
		{FormatSSE, "data: {\"token\":1}\r\n\r", "\ndata: x\r\n\r\n"},
		{FormatSSE, "data: {\"token\":1}\r\r", "data: x\r\r"},
		{FormatNDJSON, ollamaChatStream[:strings.Index(ollamaChatStream, "Hi")] + "Hi\"},\"done\":false}\n", "{}\n"},
	}
	for _, c := range cases {
		stream := c.prefix + c.rest
		d := NewDetector(c.format, config.RuleAuto, 1024)
		at := -1
		for i := 0; i < len(stream); i++ {
			v, reason := Feed(d, []byte{stream[i]})
			if v != VerdictPending {
				if v != VerdictOutput {
					t.Fatalf("%q: got %s %q", stream, verdictNames[v], reason)
				}
				at = i + 1
				break
			}
		}
		if at != len(c.prefix) {
			t.Errorf("%q: decided after %d bytes, want %d", stream, at, len(c.prefix))
		}
	}
}

// Every split of a realistic stream gives the same verdict as feeding it at
// once, in two pieces, or byte by byte.
func TestFirstEventSplitAtEveryByte(t *testing.T) {
	crlf := func(s string) string { return strings.Replace(s, "\n", "\r\n", -1) }
	cr := func(s string) string { return strings.Replace(s, "\n", "\r", -1) }
	cases := []struct {
		format Format
		rule   string
		stream string
		want   Verdict
	}{
		{FormatSSE, config.RuleAuto, chatStream, VerdictOutput},
		{FormatSSE, config.RuleOpenAIChat, crlf(chatStream), VerdictOutput},
		{FormatSSE, config.RuleAuto, cr(chatStream), VerdictOutput},
		{FormatSSE, config.RuleAuto, chatNoOutputStream, VerdictFailure},
		{FormatSSE, config.RuleAuto, crlf(chatNoOutputStream), VerdictFailure},
		{FormatSSE, config.RuleAuto, chatFinishOnlyStream, VerdictOutput},
		{FormatSSE, config.RuleOpenAIChat, cr(chatFinishOnlyStream), VerdictOutput},
		{FormatSSE, config.RuleAuto, responsesStream, VerdictOutput},
		{FormatSSE, config.RuleOpenAIResponses, cr(responsesStream), VerdictOutput},
		{FormatSSE, config.RuleAuto, anthropicStream, VerdictOutput},
		{FormatSSE, config.RuleAnthropic, crlf(anthropicStream), VerdictOutput},
		{FormatSSE, config.RuleAuto, anthropicErrorStream, VerdictFailure},
		{FormatSSE, config.RuleAny, otherStream, VerdictOutput},
		{FormatSSE, config.RuleAuto, "data: {\"choices\":\r\ndata: [{\"delta\":\rdata: {\"content\":\"a\"}}]}\n\r\n", VerdictOutput},
		{FormatNDJSON, config.RuleAuto, ollamaChatStream, VerdictOutput},
		{FormatNDJSON, config.RuleAuto, crlf(ollamaGenerateStream), VerdictOutput},
		{FormatNDJSON, config.RuleAuto, strings.TrimSuffix(ollamaChatStream[:strings.Index(ollamaChatStream, "\n")+1]+"{\"message\":{\"content\":\"x\"}}", "\n"), VerdictOutput},
	}
	for _, c := range cases {
		if v, reason := detectSplits(t, c.format, c.rule, 1024, c.stream); v != c.want {
			t.Fatalf("%q: got %s %q, want %s", c.stream, verdictNames[v], reason, verdictNames[c.want])
		}
	}
}

func TestFirstEventLineLimit(t *testing.T) {
	const maxLine = 100 // not a power of two: append's own growth would pass it
	// A comment line that never ends: failure as soon as it passes maxLine,
	// with buffers that never grow past it.
	d := NewDetector(FormatSSE, config.RuleAuto, maxLine)
	chunk := []byte(": " + strings.Repeat("x", 9))
	v, reason := VerdictPending, ""
	fed := 0
	for i := 0; i < 1000 && v == VerdictPending; i++ {
		v, reason = Feed(d, chunk)
		fed += len(chunk)
		checkBounded(t, d)
	}
	if v != VerdictFailure {
		t.Fatalf("verdict %s (reason %q) after %d bytes, want failure", verdictNames[v], reason, fed)
	} else if reason != "SSE line exceeds 100 bytes" {
		t.Fatalf("reason %q, want \"SSE line exceeds 100 bytes\"", reason)
	} else if fed > maxLine+len(chunk) {
		t.Fatalf("failed after %d bytes, want at most %d", fed, maxLine+len(chunk))
	}

	line := "data: " + strings.Repeat("y", maxLine-len("data: "))
	runLimit := func(format Format, stream string, want Verdict, wantReason string) {
		t.Helper()
		v, reason := detectSplits(t, format, config.RuleAny, maxLine, stream)
		if v != want {
			t.Fatalf("%.60q: verdict %s (reason %q), want %s", stream, verdictNames[v], reason, verdictNames[want])
		} else if !strings.Contains(reason, wantReason) {
			t.Fatalf("%.60q: reason %q, want it to contain %q", stream, reason, wantReason)
		}
	}
	runLimit(FormatSSE, line+"\n\n", VerdictOutput, "")                                                       // exactly maxLine
	runLimit(FormatSSE, line+"y\n\n", VerdictFailure, "SSE line exceeds 100 bytes")                           // one more
	runLimit(FormatSSE, line+"\r\n\r\n", VerdictOutput, "")                                                   // the line end does not count
	runLimit(FormatSSE, "data: 0123456789\n"+line+"\n\n", VerdictFailure, "SSE event data exceeds 100 bytes") // data accumulates
	runLimit(FormatSSE, strings.Repeat("data: "+strings.Repeat("d", 30)+"\n", 3)+"\n", VerdictOutput, "")     // 92 bytes of data
	d50, d49 := "data: "+strings.Repeat("a", 50)+"\n", "data: "+strings.Repeat("b", 49)+"\n"
	runLimit(FormatSSE, d50+d49+"\n", VerdictOutput, "")                                  // 50+1+49 bytes of data
	runLimit(FormatSSE, d50+d50+"\n", VerdictFailure, "SSE event data exceeds 100 bytes") // the joining \n counts
	ndLine := "\"" + strings.Repeat("z", maxLine-2) + "\""
	runLimit(FormatNDJSON, ndLine+"\n", VerdictOutput, "")
	runLimit(FormatNDJSON, ndLine+" \n", VerdictFailure, "NDJSON line exceeds 100 bytes")
	runLimit(FormatNDJSON, ndLine+" ", VerdictFailure, "NDJSON line exceeds 100 bytes")
}

func TestFirstEventNDJSON(t *testing.T) {
	runDetectorCases(t, FormatNDJSON, []detectorCase{
		{"ollama chat", "", ollamaChatStream, VerdictOutput, ""},
		{"ollama chat, explicit rule", config.RuleAnthropic, ollamaChatStream, VerdictOutput, ""},
		{"ollama generate", "", ollamaGenerateStream, VerdictOutput, ""},
		{"ollama chat thinking", "", "{\"message\":{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"Hmm\"},\"done\":false}\n", VerdictOutput, ""},
		{"ollama generate thinking", "", "{\"response\":\"\",\"thinking\":\"Hmm\",\"done\":false}\n", VerdictOutput, ""},
		{"ollama tool calls", "", "{\"message\":{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{}}}]},\"done\":false}\n", VerdictOutput, ""},
		{"done without output is final", "", strings.Replace(ollamaChatStream, "\"Hi\"", "\"\"", 1), VerdictOutput, ""},
		{"error line", "", "{\"error\":\"model 'x' not found\"}\n", VerdictFailure, "upstream error: model 'x' not found"},
		{"malformed line", "", "{\"message\":\n", VerdictFailure, "malformed NDJSON line"},
		{"blank lines and CRLF", "", "\r\n\n" + strings.Replace(ollamaGenerateStream, "\n", "\r\n", -1), VerdictOutput, ""},
		{"last line without newline is output", "", "{\"response\":\"\",\"done\":false}\n{\"response\":\"a\",\"done\":false}", VerdictOutput, ""},
		{"last line without newline is malformed", "", "{\"response\":\"\",\"done\":false}\n{\"response\":", VerdictFailure, "malformed NDJSON line"},
		{"ended without output", "", "{\"response\":\"\",\"done\":false}\n", VerdictFailure, "stream ended before the first output event"},
		{"other NDJSON output", "", "{}\n{\"token\":\"a\"}\n", VerdictOutput, ""},
		{"other NDJSON empty objects", "", "{}\n{\"text\":\"\"}\nnull\n", VerdictFailure, "stream ended before the first output event"},
		{"chat chunks as NDJSON", "", "{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n{\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n", VerdictOutput, ""},
		{"role-only chat chunk as NDJSON", "", "{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n", VerdictFailure, "stream ended before the first output event"},
	})
}

func TestFirstEventVerdictIsSticky(t *testing.T) {
	d := NewDetector(FormatSSE, config.RuleAuto, 1024)
	if v, _ := Feed(d, []byte(roleOnly+"data: [DONE]\n\n")); v != VerdictFailure {
		t.Fatalf("got %s, want failure", verdictNames[v])
	}
	v, reason := Feed(d, []byte(chatChunk(`{"content":"late"}`)))
	if v != VerdictFailure {
		t.Fatalf("after a verdict Feed returned %s, want the failure again", verdictNames[v])
	} else if !strings.Contains(reason, "[DONE]") {
		t.Fatalf("after a verdict Feed's reason is %q, want the first one, naming [DONE]", reason)
	}
	if v, _ := d.End(); v != VerdictFailure {
		t.Fatalf("after a verdict End returned %s", verdictNames[v])
	}
}

// The detector's reason is single-line; redaction, which makes the
// attempt's reason of it, cuts it short.
func TestFirstEventReasonIsShort(t *testing.T) {
	long := strings.Repeat("é", 300)
	v, reason := feedChunks(NewDetector(FormatSSE, config.RuleAuto, 4096), "data: {\"error\":{\"message\":\"line1\\nline2 "+long+"\"}}\n\n")
	reason = redact.Reason(reason, nil, MaxReason)
	switch {
	case v != VerdictFailure:
		t.Fatalf("verdict %s, want failure", verdictNames[v])
	case !strings.HasPrefix(reason, "upstream error: line1 line2 é"):
		t.Fatalf("reason %.60q, want it to start with \"upstream error: line1 line2 é\"", reason)
	case len(reason) > 200:
		t.Fatalf("reason is %d bytes, want at most 200", len(reason))
	case strings.Contains(reason, "\n"):
		t.Fatalf("reason %q has a line break, want one line", reason)
	case !strings.HasSuffix(reason, "é…"):
		t.Fatalf("reason %q, want it to end with \"é…\" (cut short)", reason)
	}
}

// Detectors of concurrent attempts share nothing: many goroutines at once
// (as under Yaegi with concurrent requests) each get their own stream's
// verdict.
func TestFirstEventConcurrentDetectors(t *testing.T) {
	streams := []struct {
		format Format
		stream string
		want   Verdict
	}{
		{FormatSSE, chatStream, VerdictOutput},
		{FormatSSE, chatNoOutputStream, VerdictFailure},
		{FormatSSE, responsesStream, VerdictOutput},
		{FormatSSE, anthropicErrorStream, VerdictFailure},
		{FormatNDJSON, ollamaGenerateStream, VerdictOutput},
		{FormatNDJSON, "{\"error\":\"gone\"}\n", VerdictFailure},
	}
	const goroutines, rounds = 20, 50
	errs := make(chan string, goroutines)
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		g := g // Yaegi shares loop variables across iterations
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				s := streams[(g+r)%len(streams)]
				d := NewDetector(s.format, config.RuleAuto, 1024)
				// Feed in small chunks so goroutines interleave mid-stream.
				v, reason := VerdictPending, ""
				for i := 0; i < len(s.stream) && v == VerdictPending; i += 7 {
					j := i + 7
					if j > len(s.stream) {
						j = len(s.stream)
					}
					v, reason = Feed(d, []byte(s.stream[i:j]))
				}
				if v == VerdictPending {
					v, reason = d.End()
				}
				if v != s.want {
					errs <- s.stream + ": got " + verdictNames[v] + " " + reason
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
