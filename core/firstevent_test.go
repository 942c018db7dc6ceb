package core

import (
	"strings"
	"sync"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
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

var verdictNames = map[verdict]string{verdictPending: "pending", verdictOutput: "output", verdictFailure: "failure"}

// feedChunks feeds chunks in order and calls End when the body ends pending.
func feedChunks(d *firstEventDetector, chunks ...string) (verdict, string) {
	for _, c := range chunks {
		if v, reason := d.Feed([]byte(c)); v != verdictPending {
			return v, reason
		}
	}
	return d.End()
}

// checkBounded fails when a buffer of d can hold more than maxLine bytes.
func checkBounded(t *testing.T, d *firstEventDetector) {
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
func detectSplits(t *testing.T, format streamFormat, rule string, maxLine int, stream string, splits ...int) (verdict, string) {
	t.Helper()
	v0, r0 := feedChunks(newFirstEventDetector(format, rule, maxLine), stream)
	if v0 == verdictPending {
		t.Fatalf("End left the verdict pending (stream %q)", stream)
	}
	if (v0 == verdictFailure) != (r0 != "") {
		t.Fatalf("verdict %s with reason %q", verdictNames[v0], r0)
	}

	d := newFirstEventDetector(format, rule, maxLine)
	v, r := verdictPending, ""
	for i := 0; i < len(stream) && v == verdictPending; i++ {
		v, r = d.Feed([]byte{stream[i]})
		checkBounded(t, d)
	}
	if v == verdictPending {
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
		v, r := feedChunks(newFirstEventDetector(format, rule, maxLine), stream[:split], stream[split:])
		if v != v0 || r != r0 {
			t.Fatalf("whole: %s %q, split at %d: %s %q (stream %q)", verdictNames[v0], r0, split, verdictNames[v], r, stream)
		}
	}
	return v0, r0
}

func TestStreamFormatOf(t *testing.T) {
	cases := []struct {
		ct   string
		want streamFormat
		ok   bool
	}{
		{"text/event-stream", formatSSE, true},
		{"Text/Event-Stream; charset=utf-8", formatSSE, true},
		{"text/event-stream;charset=\"utf-8", formatSSE, true}, // broken parameter
		{"application/x-ndjson", formatNDJSON, true},
		{"application/jsonl; charset=utf-8", formatNDJSON, true},
		{"application/json", 0, false},
		{"application/json-seq", 0, false},
		{"text/plain", 0, false},
		{"", 0, false},
	}
	for _, c := range cases {
		got, ok := streamFormatOf(c.ct)
		if got != c.want || ok != c.ok {
			t.Errorf("streamFormatOf(%q) = %d, %v; want %d, %v", c.ct, got, ok, c.want, c.ok)
		}
	}
}

type detectorCase struct {
	name   string
	rule   string // "" means auto
	stream string
	want   verdict
	reason string // substring of the failure reason
}

func runDetectorCases(t *testing.T, format streamFormat, cases []detectorCase) {
	t.Helper()
	for _, c := range cases {
		v, reason := feedChunks(newFirstEventDetector(format, c.rule, 1024), c.stream)
		if v != c.want {
			t.Errorf("%s: verdict %s (reason %q), want %s", c.name, verdictNames[v], reason, verdictNames[c.want])
		} else if !strings.Contains(reason, c.reason) {
			t.Errorf("%s: reason %q, want it to contain %q", c.name, reason, c.reason)
		} else if c.want == verdictOutput && reason != "" {
			t.Errorf("%s: output with reason %q, want none", c.name, reason)
		}
	}
}

func chatChunk(delta string) string {
	return "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":" + delta + ",\"finish_reason\":null}]}\n\n"
}

const roleOnly = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n"

func TestFirstEventSSEOpenAIChat(t *testing.T) {
	runDetectorCases(t, formatSSE, []detectorCase{
		{"realistic", "", chatStream, verdictOutput, ""},
		{"realistic, explicit rule", config.RuleOpenAIChat, chatStream, verdictOutput, ""},
		{"role-only and pings never win", "", roleOnly + ": ping\n\n" + roleOnly, verdictFailure, "stream ended before the first output event"},
		{"empty content is not output", "", chatChunk(`{"role":"assistant","content":"","refusal":null,"tool_calls":[]}`), verdictFailure, "before the first output"},
		{"[DONE] before output", "", chatNoOutputStream, verdictFailure, "stream ended ([DONE]) before the first output event"},
		{"[DONE] before output, explicit rule", config.RuleOpenAIChat, chatNoOutputStream, verdictFailure, "[DONE]"},
		{"finish_reason without output is final", "", chatFinishOnlyStream, verdictOutput, ""},
		{"finish_reason without output, explicit rule", config.RuleOpenAIChat, chatFinishOnlyStream, verdictOutput, ""},
		{"finish_reason without output, rule any", config.RuleAny, chatFinishOnlyStream, verdictOutput, ""},
		{"content filter finish", "", roleOnly + "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"content_filter\"}]}\n\n", verdictOutput, ""},
		{"empty finish_reason is not final", "", roleOnly + "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"\"}]}\n\n", verdictFailure, "before the first output"},
		{"legacy completions finish", "", "data: {\"object\":\"text_completion\",\"choices\":[{\"text\":\"\",\"index\":0,\"finish_reason\":\"length\"}]}\n\n", verdictOutput, ""},
		{"tool_calls", "", roleOnly + chatChunk(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}`), verdictOutput, ""},
		{"refusal", "", chatChunk(`{"refusal":"I can't"}`), verdictOutput, ""},
		{"reasoning_content", "", chatChunk(`{"content":null,"reasoning_content":"Let me think"}`), verdictOutput, ""},
		{"reasoning", "", chatChunk(`{"reasoning":"Hmm"}`), verdictOutput, ""},
		{"audio with data", "", chatChunk(`{"audio":{"id":"a1","data":"UklGR"}}`), verdictOutput, ""},
		{"audio transcript", "", chatChunk(`{"audio":{"transcript":"Hi"}}`), verdictOutput, ""},
		{"audio without data", "", chatChunk(`{"audio":{"id":"a1"}}`), verdictFailure, "before the first output"},
		{"legacy completions text", "", "data: {\"object\":\"text_completion\",\"choices\":[{\"text\":\"Once\",\"index\":0}]}\n\n", verdictOutput, ""},
		{"second choice carries output", "", "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}},{\"index\":1,\"delta\":{\"content\":\"x\"}}]}\n\n", verdictOutput, ""},
		{"usage-only chunk", "", "data: {\"choices\":[],\"usage\":{\"total_tokens\":3}}\n\n", verdictFailure, "before the first output"},
		{"top-level error", "", roleOnly + "data: {\"error\":{\"message\":\"The server had an error\",\"type\":\"server_error\"}}\n\n", verdictFailure, "upstream error: The server had an error"},
		{"top-level error, explicit rule", config.RuleOpenAIChat, "data: {\"error\":{\"message\":\"boom\"}}\n\n", verdictFailure, "boom"},
		{"false error is no error", "", "data: {\"error\":false,\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", verdictOutput, ""},
		{"null error is no error", "", "data: {\"error\":null,\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", verdictOutput, ""},
		{"error event", "", roleOnly + "event: error\ndata: {\"error\":{\"message\":\"overloaded\"}}\n\n", verdictFailure, "upstream error event: overloaded"},
		{"error event with text data", "", "event: error\ndata: rate limited\n\n", verdictFailure, "upstream error event: rate limited"},
		{"error event, explicit rule", config.RuleOpenAIChat, "event:error\ndata: x\n\n", verdictFailure, "upstream error event"},
		{"content after output-less events", "", roleOnly + "data: \n\n" + "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", verdictOutput, ""},
		{"message instead of delta is not chat output", "", "data: {\"choices\":[{\"message\":{\"content\":\"a\"}}]}\n\n", verdictFailure, "before the first output"},
		{"explicit rule ignores other dialects", config.RuleOpenAIChat, anthropicStream, verdictFailure, "stream ended before the first output event"},
	})
}

func TestFirstEventSSEOpenAIResponses(t *testing.T) {
	created := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n\n"
	ev := func(typ, rest string) string {
		return "event: " + typ + "\ndata: {\"type\":\"" + typ + "\"" + rest + "}\n\n"
	}
	runDetectorCases(t, formatSSE, []detectorCase{
		{"realistic", "", responsesStream, verdictOutput, ""},
		{"realistic, explicit rule", config.RuleOpenAIResponses, responsesStream, verdictOutput, ""},
		{"control events never win", "", created + ev("response.in_progress", "") + ev("response.output_item.added", `,"item":{"type":"message"}`) + ev("response.content_part.added", ""), verdictFailure, "stream ended before the first output event"},
		{"function_call_arguments delta", "", created + ev("response.function_call_arguments.delta", `,"delta":"{\"a"`), verdictOutput, ""},
		{"refusal delta", "", ev("response.refusal.delta", `,"delta":"no"`), verdictOutput, ""},
		{"reasoning summary delta", "", ev("response.reasoning_summary_text.delta", `,"delta":"**Plan**"`), verdictOutput, ""},
		{"audio delta", "", ev("response.audio.delta", `,"delta":"UklGR"`), verdictOutput, ""},
		{"code interpreter delta", "", ev("response.code_interpreter_call_code.delta", `,"delta":"print(1)"`), verdictOutput, ""},
		{"empty delta", "", ev("response.output_text.delta", `,"delta":""`), verdictFailure, "stream ended before the first output event"},
		{"type without event name", "", "data: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n", verdictOutput, ""},
		{"failed", "", created + ev("response.failed", `,"response":{"status":"failed","error":{"code":"server_error","message":"The model failed"}}`), verdictFailure, "response.failed: The model failed"},
		{"failed without a message", "", created + ev("response.failed", `,"response":{"status":"failed"}`), verdictFailure, "stream ended (response.failed) before the first output event"},
		{"incomplete is final", "", created + ev("response.incomplete", `,"response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}`), verdictOutput, ""},
		{"completed without output is final", config.RuleOpenAIResponses, created + ev("response.completed", `,"response":{"status":"completed","error":null}`), verdictOutput, ""},
		{"completed without output, rule any", config.RuleAny, created + ev("response.completed", `,"response":{"status":"completed"}`), verdictOutput, ""},
		{"error type without event name", "", "data: {\"type\":\"error\",\"code\":\"ERR\",\"message\":\"Something went wrong\"}\n\n", verdictFailure, "upstream error event: Something went wrong"},
		{"error type", "", created + ev("error", `,"code":"ERR","message":"Something went wrong"`), verdictFailure, "upstream error event: Something went wrong"},
		{"explicit rule ignores chat chunks", config.RuleOpenAIResponses, chatChunk(`{"content":"x"}`), verdictFailure, "stream ended before the first output event"},
	})
}

func TestFirstEventSSEAnthropic(t *testing.T) {
	runDetectorCases(t, formatSSE, []detectorCase{
		{"realistic", "", anthropicStream, verdictOutput, ""},
		{"realistic, explicit rule", config.RuleAnthropic, anthropicStream, verdictOutput, ""},
		{"error event", "", anthropicErrorStream, verdictFailure, "upstream error event: Overloaded"},
		{"control events never win", "", strings.Split(anthropicStream, "event: content_block_delta")[0], verdictFailure, "stream ended before the first output event"},
		{"stop_reason without output is final", "", "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":0}}\n\n", verdictOutput, ""},
		{"stop_reason from event name", config.RuleAnthropic, "event: message_delta\ndata: {\"delta\":{\"stop_reason\":\"refusal\"}}\n\n", verdictOutput, ""},
		{"message_delta without stop_reason is control", "", "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null},\"usage\":{\"output_tokens\":3}}\n\n", verdictFailure, "stream ended before the first output event"},
		{"message_stop is final", "", "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", verdictOutput, ""},
		{"thinking delta", "", "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Hmm\"}}\n\n", verdictOutput, ""},
		{"type from event name", config.RuleAnthropic, "event: content_block_delta\ndata: {\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n", verdictOutput, ""},
		{"explicit rule ignores chat chunks", config.RuleAnthropic, chatStream, verdictFailure, "[DONE]"},
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
	runDetectorCases(t, formatSSE, []detectorCase{
		{"control events never win", "", start, verdictFailure, "stream ended before the first output event"},
		{"control events never win, rule any", config.RuleAny, start + ev("content-end", `,"index":0`), verdictFailure, "stream ended before the first output event"},
		{"content-delta", "", start + ev("content-delta", `,"index":0,"delta":{"message":{"content":{"text":"Hi"}}}`), verdictOutput, ""},
		{"tool-plan-delta", "", ev("message-start", `,"id":"c1"`) + ev("tool-plan-delta", `,"delta":{"message":{"tool_plan":"I will"}}`), verdictOutput, ""},
		{"message-end is final", "", start + ev("message-end", `,"delta":{"finish_reason":"MAX_TOKENS"}`), verdictOutput, ""},
	})
}

func TestFirstEventSSEAny(t *testing.T) {
	runDetectorCases(t, formatSSE, []detectorCase{
		{"plain text data", "", otherStream, verdictOutput, ""},
		{"plain text data, rule any", config.RuleAny, otherStream, verdictOutput, ""},
		{"unknown JSON", "", "data: {\"token\":\"Hi\"}\n\n", verdictOutput, ""},
		{"empty JSON object is control", "", "data: {}\n\ndata: {\"text\":\"\",\"meta\":null}\n\n", verdictFailure, "stream ended before the first output event"},
		{"empty data is control", config.RuleAny, "data:\n\ndata: \n\n", verdictFailure, "stream ended before the first output event"},
		{"[DONE]", config.RuleAny, "data: [DONE]\n\n", verdictFailure, "[DONE]"},
		{"top-level error", config.RuleAny, "data: {\"error\":\"quota\"}\n\n", verdictFailure, "upstream error: quota"},
		{"known control kinds", config.RuleAny, "event: ping\ndata: ping\n\n" + "data: {\"type\":\"response.in_progress\"}\n\n" + "data: {\"type\":\"message_start\"}\n\n", verdictFailure, "stream ended before the first output event"},
		{"known final event", config.RuleAny, "data: {\"type\":\"message_stop\"}\n\n", verdictOutput, ""},
		{"role-only chat chunk", config.RuleAny, roleOnly + chatChunk(`{"content":"","tool_calls":null}`), verdictFailure, "stream ended before the first output event"},
		{"any chat chunk with content", config.RuleAny, "data: {\"choices\":[{\"message\":{\"content\":\"a\"}}]}\n\n", verdictOutput, ""},
		{"chat content", config.RuleAny, chatStream, verdictOutput, ""},
		{"explicit rules ignore plain text", config.RuleOpenAIChat, otherStream, verdictFailure, "stream ended before the first output event"},
	})
}

func TestFirstEventSSEParsing(t *testing.T) {
	content := `{"choices":[{"delta":{"content":"a"}}]}`
	runDetectorCases(t, formatSSE, []detectorCase{
		{"CRLF line ends", "", strings.Replace(chatStream, "\n", "\r\n", -1), verdictOutput, ""},
		{"CR line ends", "", strings.Replace(chatStream, "\n", "\r", -1), verdictOutput, ""},
		{"CR line ends, no output", "", strings.Replace(chatNoOutputStream, "\n", "\r", -1), verdictFailure, "[DONE]"},
		{"mixed line ends", "", ": ping\r\n\r" + roleOnly + "data: " + content + "\r\n\n", verdictOutput, ""},
		{"multi-line data is joined with LF", "", "data: {\"choices\":\ndata: [{\"delta\":\ndata: {\"content\":\"a\"}}]}\n\n", verdictOutput, ""},
		{"multi-line data split mid-JSON string is not JSON", config.RuleOpenAIChat, "data: {\"choices\":[{\"delta\":{\"content\":\"a\ndata: b\"}}]}\n\n", verdictFailure, "before the first output"},
		{"no space after colon", "", "data:" + content + "\n\n", verdictOutput, ""},
		{"only one space is stripped", "", "event:  error\ndata: " + content + "\n\n", verdictOutput, ""},
		{"field without colon", "", "data\n\n", verdictFailure, "stream ended before the first output event"},
		{"event without data is ignored", "", "event: error\n\n" + "id: 7\nretry: 10\n\n" + "data: " + content + "\n\n", verdictOutput, ""},
		{"event name resets after dispatch", "", "event: token\ndata: \n\n" + "data: " + content + "\n\n", verdictOutput, ""},
		{"comment lines inside an event", "", "data: " + content + "\n: ping\n\n", verdictOutput, ""},
		{"unknown fields are ignored", "", "foo: bar\nid: 1\ndata: " + content + "\n\n", verdictOutput, ""},
		{"leading BOM", "", "\xEF\xBB\xBFdata: " + content + "\n\n", verdictOutput, ""},
		{"unterminated event at EOF is discarded", "", "data: " + content + "\n", verdictFailure, "stream ended before the first output event"},
		{"unterminated line at EOF is discarded", "", "data: " + content, verdictFailure, "stream ended before the first output event"},
		{"empty body", "", "", verdictFailure, "stream ended before the first output event"},
	})
}

// The verdict comes with the byte that completes the event (the blank
// line's line end), not earlier and not later.
func TestFirstEventDecidesAtEventEnd(t *testing.T) {
	cases := []struct {
		format       streamFormat
		prefix, rest string
	}{
		{formatSSE, chatStream[:strings.Index(chatStream, "Hello")] + "Hello\"},\"finish_reason\":null}]}\n\n", chatStream[strings.Index(chatStream, "Hello")+len("Hello\"},\"finish_reason\":null}]}\n\n"):]},
		{formatSSE, "data: {\"token\":1}\r\n\r", "\ndata: x\r\n\r\n"},
		{formatSSE, "data: {\"token\":1}\r\r", "data: x\r\r"},
		{formatNDJSON, ollamaChatStream[:strings.Index(ollamaChatStream, "Hi")] + "Hi\"},\"done\":false}\n", "{}\n"},
	}
	for _, c := range cases {
		stream := c.prefix + c.rest
		d := newFirstEventDetector(c.format, config.RuleAuto, 1024)
		at := -1
		for i := 0; i < len(stream); i++ {
			v, reason := d.Feed([]byte{stream[i]})
			if v != verdictPending {
				if v != verdictOutput {
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
		format streamFormat
		rule   string
		stream string
		want   verdict
	}{
		{formatSSE, config.RuleAuto, chatStream, verdictOutput},
		{formatSSE, config.RuleOpenAIChat, crlf(chatStream), verdictOutput},
		{formatSSE, config.RuleAuto, cr(chatStream), verdictOutput},
		{formatSSE, config.RuleAuto, chatNoOutputStream, verdictFailure},
		{formatSSE, config.RuleAuto, crlf(chatNoOutputStream), verdictFailure},
		{formatSSE, config.RuleAuto, chatFinishOnlyStream, verdictOutput},
		{formatSSE, config.RuleOpenAIChat, cr(chatFinishOnlyStream), verdictOutput},
		{formatSSE, config.RuleAuto, responsesStream, verdictOutput},
		{formatSSE, config.RuleOpenAIResponses, cr(responsesStream), verdictOutput},
		{formatSSE, config.RuleAuto, anthropicStream, verdictOutput},
		{formatSSE, config.RuleAnthropic, crlf(anthropicStream), verdictOutput},
		{formatSSE, config.RuleAuto, anthropicErrorStream, verdictFailure},
		{formatSSE, config.RuleAny, otherStream, verdictOutput},
		{formatSSE, config.RuleAuto, "data: {\"choices\":\r\ndata: [{\"delta\":\rdata: {\"content\":\"a\"}}]}\n\r\n", verdictOutput},
		{formatNDJSON, config.RuleAuto, ollamaChatStream, verdictOutput},
		{formatNDJSON, config.RuleAuto, crlf(ollamaGenerateStream), verdictOutput},
		{formatNDJSON, config.RuleAuto, strings.TrimSuffix(ollamaChatStream[:strings.Index(ollamaChatStream, "\n")+1]+"{\"message\":{\"content\":\"x\"}}", "\n"), verdictOutput},
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
	d := newFirstEventDetector(formatSSE, config.RuleAuto, maxLine)
	chunk := []byte(": " + strings.Repeat("x", 9))
	v, reason := verdictPending, ""
	fed := 0
	for i := 0; i < 1000 && v == verdictPending; i++ {
		v, reason = d.Feed(chunk)
		fed += len(chunk)
		checkBounded(t, d)
	}
	if v != verdictFailure {
		t.Fatalf("verdict %s (reason %q) after %d bytes, want failure", verdictNames[v], reason, fed)
	} else if reason != "SSE line exceeds 100 bytes" {
		t.Fatalf("reason %q, want \"SSE line exceeds 100 bytes\"", reason)
	} else if fed > maxLine+len(chunk) {
		t.Fatalf("failed after %d bytes, want at most %d", fed, maxLine+len(chunk))
	}

	line := "data: " + strings.Repeat("y", maxLine-len("data: "))
	runLimit := func(format streamFormat, stream string, want verdict, wantReason string) {
		t.Helper()
		v, reason := detectSplits(t, format, config.RuleAny, maxLine, stream)
		if v != want {
			t.Fatalf("%.60q: verdict %s (reason %q), want %s", stream, verdictNames[v], reason, verdictNames[want])
		} else if !strings.Contains(reason, wantReason) {
			t.Fatalf("%.60q: reason %q, want it to contain %q", stream, reason, wantReason)
		}
	}
	runLimit(formatSSE, line+"\n\n", verdictOutput, "")                                                       // exactly maxLine
	runLimit(formatSSE, line+"y\n\n", verdictFailure, "SSE line exceeds 100 bytes")                           // one more
	runLimit(formatSSE, line+"\r\n\r\n", verdictOutput, "")                                                   // the line end does not count
	runLimit(formatSSE, "data: 0123456789\n"+line+"\n\n", verdictFailure, "SSE event data exceeds 100 bytes") // data accumulates
	runLimit(formatSSE, strings.Repeat("data: "+strings.Repeat("d", 30)+"\n", 3)+"\n", verdictOutput, "")     // 92 bytes of data
	d50, d49 := "data: "+strings.Repeat("a", 50)+"\n", "data: "+strings.Repeat("b", 49)+"\n"
	runLimit(formatSSE, d50+d49+"\n", verdictOutput, "")                                  // 50+1+49 bytes of data
	runLimit(formatSSE, d50+d50+"\n", verdictFailure, "SSE event data exceeds 100 bytes") // the joining \n counts
	ndLine := "\"" + strings.Repeat("z", maxLine-2) + "\""
	runLimit(formatNDJSON, ndLine+"\n", verdictOutput, "")
	runLimit(formatNDJSON, ndLine+" \n", verdictFailure, "NDJSON line exceeds 100 bytes")
	runLimit(formatNDJSON, ndLine+" ", verdictFailure, "NDJSON line exceeds 100 bytes")
}

func TestFirstEventNDJSON(t *testing.T) {
	runDetectorCases(t, formatNDJSON, []detectorCase{
		{"ollama chat", "", ollamaChatStream, verdictOutput, ""},
		{"ollama chat, explicit rule", config.RuleAnthropic, ollamaChatStream, verdictOutput, ""},
		{"ollama generate", "", ollamaGenerateStream, verdictOutput, ""},
		{"ollama chat thinking", "", "{\"message\":{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"Hmm\"},\"done\":false}\n", verdictOutput, ""},
		{"ollama generate thinking", "", "{\"response\":\"\",\"thinking\":\"Hmm\",\"done\":false}\n", verdictOutput, ""},
		{"ollama tool calls", "", "{\"message\":{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{}}}]},\"done\":false}\n", verdictOutput, ""},
		{"done without output is final", "", strings.Replace(ollamaChatStream, "\"Hi\"", "\"\"", 1), verdictOutput, ""},
		{"error line", "", "{\"error\":\"model 'x' not found\"}\n", verdictFailure, "upstream error: model 'x' not found"},
		{"malformed line", "", "{\"message\":\n", verdictFailure, "malformed NDJSON line"},
		{"blank lines and CRLF", "", "\r\n\n" + strings.Replace(ollamaGenerateStream, "\n", "\r\n", -1), verdictOutput, ""},
		{"last line without newline is output", "", "{\"response\":\"\",\"done\":false}\n{\"response\":\"a\",\"done\":false}", verdictOutput, ""},
		{"last line without newline is malformed", "", "{\"response\":\"\",\"done\":false}\n{\"response\":", verdictFailure, "malformed NDJSON line"},
		{"ended without output", "", "{\"response\":\"\",\"done\":false}\n", verdictFailure, "stream ended before the first output event"},
		{"other NDJSON output", "", "{}\n{\"token\":\"a\"}\n", verdictOutput, ""},
		{"other NDJSON empty objects", "", "{}\n{\"text\":\"\"}\nnull\n", verdictFailure, "stream ended before the first output event"},
		{"chat chunks as NDJSON", "", "{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n{\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n", verdictOutput, ""},
		{"role-only chat chunk as NDJSON", "", "{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n", verdictFailure, "stream ended before the first output event"},
	})
}

func TestFirstEventVerdictIsSticky(t *testing.T) {
	d := newFirstEventDetector(formatSSE, config.RuleAuto, 1024)
	if v, _ := d.Feed([]byte(roleOnly + "data: [DONE]\n\n")); v != verdictFailure {
		t.Fatalf("got %s, want failure", verdictNames[v])
	}
	v, reason := d.Feed([]byte(chatChunk(`{"content":"late"}`)))
	if v != verdictFailure {
		t.Fatalf("after a verdict Feed returned %s, want the failure again", verdictNames[v])
	} else if !strings.Contains(reason, "[DONE]") {
		t.Fatalf("after a verdict Feed's reason is %q, want the first one, naming [DONE]", reason)
	}
	if v, _ := d.End(); v != verdictFailure {
		t.Fatalf("after a verdict End returned %s", verdictNames[v])
	}
}

// The detector's reason is single-line; redactReason, which makes the
// attempt's reason of it, cuts it short.
func TestFirstEventReasonIsShort(t *testing.T) {
	long := strings.Repeat("é", 300)
	v, reason := feedChunks(newFirstEventDetector(formatSSE, config.RuleAuto, 4096), "data: {\"error\":{\"message\":\"line1\\nline2 "+long+"\"}}\n\n")
	reason = redactReason(reason, nil)
	switch {
	case v != verdictFailure:
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
		format streamFormat
		stream string
		want   verdict
	}{
		{formatSSE, chatStream, verdictOutput},
		{formatSSE, chatNoOutputStream, verdictFailure},
		{formatSSE, responsesStream, verdictOutput},
		{formatSSE, anthropicErrorStream, verdictFailure},
		{formatNDJSON, ollamaGenerateStream, verdictOutput},
		{formatNDJSON, "{\"error\":\"gone\"}\n", verdictFailure},
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
				d := newFirstEventDetector(s.format, config.RuleAuto, 1024)
				// Feed in small chunks so goroutines interleave mid-stream.
				v, reason := verdictPending, ""
				for i := 0; i < len(s.stream) && v == verdictPending; i += 7 {
					j := i + 7
					if j > len(s.stream) {
						j = len(s.stream)
					}
					v, reason = d.Feed([]byte(s.stream[i:j]))
				}
				if v == verdictPending {
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
