package stream

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/llmhedge/llmhedge/core/config"
)

// This file reads a complete answer (a JSON body, or a whole SSE or NDJSON
// stream) into what the validity checks look at: each choice's message
// text, whether it called a tool, how it finished and any refusal. It knows
// OpenAI Chat Completions, the Responses API, Anthropic Messages and
// Ollama's chat; anything else is "not recognised", which fails every check
// (a check that cannot be made does not pass).

// answerChoice is one choice of an answer (Responses, Anthropic and Ollama
// answers have one).
type answerChoice struct {
	text     string
	tool     bool   // it called a tool (its arguments are not checked)
	finish   string // finish_reason, status or stop_reason; "" when none came
	finishOK bool   // finish is a normal end
	refusal  string
}

// Answer is what the checks see of a complete Answer.
type Answer struct {
	family  string // RuleOpenAIChat, RuleOpenAIResponses, RuleAnthropic, "ollama", or "" when not recognised
	choices []*answerChoice
}

// maxChoices bounds the choices read from a streamed Chat answer (the
// index comes from the upstream).
const maxChoices = 128

// AnswerOf reads a complete answer body; streaming says it is an SSE
// (sse) or NDJSON stream rather than one JSON document.
func AnswerOf(body []byte, streaming, sse bool) *Answer {
	if !streaming {
		var v interface{}
		if json.Unmarshal(body, &v) != nil {
			return &Answer{}
		}
		obj, _ := v.(map[string]interface{})
		return documentAnswer(obj)
	}
	ans := &Answer{}
	if sse {
		for _, data := range sseData(body) {
			streamEvent(ans, data)
		}
	} else {
		for _, line := range bytes.Split(body, []byte("\n")) {
			if len(bytes.TrimSpace(line)) > 0 {
				streamEvent(ans, string(line))
			}
		}
	}
	return ans
}

// documentAnswer reads a non-streaming answer.
func documentAnswer(obj map[string]interface{}) *Answer {
	if obj == nil {
		return &Answer{}
	}
	if choices, ok := obj["choices"].([]interface{}); ok {
		return chatDocument(choices)
	}
	if stringOf(obj, "object") == "response" {
		ans := &Answer{family: config.RuleOpenAIResponses}
		responsesDocument(ans, obj)
		return ans
	}
	if stringOf(obj, "type") == "message" {
		if content, ok := obj["content"].([]interface{}); ok {
			return anthropicDocument(obj, content)
		}
	}
	if msg, ok := obj["message"].(map[string]interface{}); ok {
		if _, done := obj["done"]; done {
			ch := &answerChoice{}
			ollamaLine(ch, obj, msg)
			return &Answer{family: "ollama", choices: []*answerChoice{ch}}
		}
	}
	return &Answer{}
}

// chatDocument reads a Chat Completions answer's choices.
func chatDocument(choices []interface{}) *Answer {
	ans := &Answer{family: config.RuleOpenAIChat}
	for _, c := range choices {
		cm, _ := c.(map[string]interface{})
		ch := &answerChoice{}
		msg, _ := cm["message"].(map[string]interface{})
		if msg == nil {
			// Legacy completions: the text is the choice's.
			ch.text, _ = cm["text"].(string)
		} else {
			ch.text = textOf(msg["content"])
			ch.refusal, _ = msg["refusal"].(string)
			ch.tool = !isEmptyJSON(msg["tool_calls"]) || !isEmptyJSON(msg["function_call"])
		}
		setChatFinish(ch, cm["finish_reason"])
		ans.choices = append(ans.choices, ch)
	}
	return ans
}

// textOf is a Chat message's content: a string, or the text of an array of
// parts.
func textOf(content interface{}) string {
	if s, ok := content.(string); ok {
		return s
	}
	parts, _ := content.([]interface{})
	var b strings.Builder
	for _, p := range parts {
		pm, _ := p.(map[string]interface{})
		if s, ok := pm["text"].(string); ok {
			b.WriteString(s)
		}
	}
	return b.String()
}

// setChatFinish records a Chat finish_reason: stop, tool_calls and the
// legacy function_call are normal ends; length and content_filter are not.
func setChatFinish(ch *answerChoice, reason interface{}) {
	s, _ := reason.(string)
	if s == "" {
		return
	}
	ch.finish = s
	ch.finishOK = s == "stop" || s == "tool_calls" || s == "function_call"
}

// responsesDocument reads a Responses API response object (a whole answer,
// or the one a stream's final event carries) into ans's one choice.
func responsesDocument(ans *Answer, resp map[string]interface{}) {
	ch := &answerChoice{}
	ch.finish, _ = resp["status"].(string)
	ch.finishOK = ch.finish == "completed"
	output, _ := resp["output"].([]interface{})
	var text strings.Builder
	for _, item := range output {
		im, _ := item.(map[string]interface{})
		switch stringOf(im, "type") {
		case "message":
			content, _ := im["content"].([]interface{})
			for _, part := range content {
				pm, _ := part.(map[string]interface{})
				switch stringOf(pm, "type") {
				case "output_text":
					s, _ := pm["text"].(string)
					text.WriteString(s)
				case "refusal":
					s, _ := pm["refusal"].(string)
					ch.refusal += s
				}
			}
		case "function_call", "custom_tool_call":
			ch.tool = true
		}
	}
	ch.text = text.String()
	ans.choices = []*answerChoice{ch}
}

// anthropicDocument reads an Anthropic Messages answer.
func anthropicDocument(obj map[string]interface{}, content []interface{}) *Answer {
	ch := &answerChoice{}
	var text strings.Builder
	for _, block := range content {
		bm, _ := block.(map[string]interface{})
		switch stringOf(bm, "type") {
		case "text":
			s, _ := bm["text"].(string)
			text.WriteString(s)
		case "tool_use", "server_tool_use":
			ch.tool = true
		}
	}
	ch.text = text.String()
	setAnthropicStop(ch, obj["stop_reason"])
	return &Answer{family: config.RuleAnthropic, choices: []*answerChoice{ch}}
}

// setAnthropicStop records a stop_reason: end_turn, tool_use and
// stop_sequence are normal ends; max_tokens, pause_turn and refusal are
// not, and refusal is a refusal too.
func setAnthropicStop(ch *answerChoice, reason interface{}) {
	s, _ := reason.(string)
	if s == "" {
		return
	}
	ch.finish = s
	ch.finishOK = s == "end_turn" || s == "tool_use" || s == "stop_sequence"
	if s == "refusal" && ch.refusal == "" {
		ch.refusal = "stop_reason refusal"
	}
}

// ollamaLine reads one line (or the whole answer) of Ollama's chat into ch.
func ollamaLine(ch *answerChoice, obj, msg map[string]interface{}) {
	s, _ := msg["content"].(string)
	ch.text += s
	if !isEmptyJSON(msg["tool_calls"]) {
		ch.tool = true
	}
	if done, _ := obj["done"].(bool); done {
		reason, _ := obj["done_reason"].(string)
		ch.finish = reason
		if reason == "" {
			ch.finish = "done"
		}
		ch.finishOK = reason == "" || reason == "stop"
	}
}

// sseData returns the data of every event of a whole SSE stream (WHATWG EventSource rules: data lines joined with "\n", comments
// and other fields skipped; an unterminated last event is dropped).
func sseData(body []byte) []string {
	body = bytes.TrimPrefix(body, utf8BOM)
	var events []string
	var data []byte
	hasData := false
	for len(body) > 0 {
		i := bytes.IndexAny(body, "\r\n")
		if i < 0 {
			return events // an unterminated line: dropped, with its event
		}
		line := body[:i]
		next := i + 1
		if body[i] == '\r' && next < len(body) && body[next] == '\n' {
			next++
		}
		body = body[next:]
		if len(line) == 0 {
			if hasData {
				events = append(events, string(data))
			}
			data = data[:0]
			hasData = false
			continue
		}
		if !bytes.HasPrefix(line, []byte("data")) {
			continue // comments, event names, ids: the data says what it is
		}
		value := line[len("data"):]
		if len(value) > 0 && value[0] != ':' {
			continue // a field whose name only starts with "data"
		}
		if len(value) > 0 {
			value = value[1:]
		}
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
		if hasData {
			data = append(data, '\n')
		}
		data = append(data, value...)
		hasData = true
	}
	return events
}

// streamEvent adds one streamed event (SSE data or an NDJSON line) to ans.
func streamEvent(ans *Answer, data string) {
	s := strings.TrimSpace(data)
	if s == "" || s[0] != '{' {
		return // [DONE], keep-alives
	}
	var obj map[string]interface{}
	if json.Unmarshal([]byte(s), &obj) != nil {
		return
	}
	if choices, ok := obj["choices"].([]interface{}); ok {
		ans.family = config.RuleOpenAIChat
		addChatChunk(ans, choices)
		return
	}
	kind, _ := obj["type"].(string)
	switch {
	case strings.HasPrefix(kind, "response."):
		ans.family = config.RuleOpenAIResponses
		responsesEvent(ans, kind, obj)
	case anthropicKinds[kind]:
		ans.family = config.RuleAnthropic
		anthropicEvent(ans, kind, obj)
	default:
		if msg, ok := obj["message"].(map[string]interface{}); ok {
			ans.family = "ollama"
			ollamaLine(oneChoice(ans), obj, msg)
		}
	}
}

// oneChoice returns the answer's only choice, adding it when missing.
func oneChoice(ans *Answer) *answerChoice {
	if len(ans.choices) == 0 {
		ans.choices = append(ans.choices, new(answerChoice))
	}
	return ans.choices[0]
}

// addChatChunk adds a Chat Completions chunk's deltas to their choices.
func addChatChunk(ans *Answer, choices []interface{}) {
	for _, c := range choices {
		cm, _ := c.(map[string]interface{})
		idx := 0
		if f, ok := cm["index"].(float64); ok && f >= 0 && f < maxChoices {
			idx = int(f)
		}
		for len(ans.choices) <= idx {
			ans.choices = append(ans.choices, &answerChoice{})
		}
		ch := ans.choices[idx]
		if delta, ok := cm["delta"].(map[string]interface{}); ok {
			ch.text += textOf(delta["content"])
			if s, ok := delta["refusal"].(string); ok {
				ch.refusal += s
			}
			if !isEmptyJSON(delta["tool_calls"]) || !isEmptyJSON(delta["function_call"]) {
				ch.tool = true
			}
		} else if s, ok := cm["text"].(string); ok {
			ch.text += s
		}
		setChatFinish(ch, cm["finish_reason"])
	}
}

// responsesEvent adds one Responses API event to ans.
func responsesEvent(ans *Answer, kind string, obj map[string]interface{}) {
	ch := oneChoice(ans)
	switch kind {
	case "response.output_text.delta":
		s, _ := obj["delta"].(string)
		ch.text += s
	case "response.refusal.delta":
		s, _ := obj["delta"].(string)
		ch.refusal += s
	case "response.completed", "response.incomplete", "response.failed":
		// The final event carries the whole response: it is the answer,
		// unless it left out what the deltas brought.
		if resp, ok := obj["response"].(map[string]interface{}); ok {
			responsesDocument(ans, resp)
		}
		final := ans.choices[0]
		if final != ch {
			keepStreamed(final, ch)
		}
		if final.finish == "" {
			final.finish = strings.TrimPrefix(kind, "response.")
			final.finishOK = kind == "response.completed"
		}
	case "response.output_item.added", "response.output_item.done":
		item, _ := obj["item"].(map[string]interface{})
		if t := stringOf(item, "type"); t == "function_call" || t == "custom_tool_call" {
			ch.tool = true
		}
	}
}

// keepStreamed fills in what a final response object left out from what
// its stream's deltas brought.
func keepStreamed(final, streamed *answerChoice) {
	if final.text == "" {
		final.text = streamed.text
	}
	if final.refusal == "" {
		final.refusal = streamed.refusal
	}
	if streamed.tool {
		final.tool = true
	}
}

// anthropicEvent adds one Anthropic Messages event to ans.
func anthropicEvent(ans *Answer, kind string, obj map[string]interface{}) {
	ch := oneChoice(ans)
	switch kind {
	case "content_block_start":
		block, _ := obj["content_block"].(map[string]interface{})
		if t := stringOf(block, "type"); t == "tool_use" || t == "server_tool_use" {
			ch.tool = true
		}
		if s, ok := block["text"].(string); ok {
			ch.text += s
		}
	case "content_block_delta":
		delta, _ := obj["delta"].(map[string]interface{})
		if stringOf(delta, "type") == "text_delta" {
			s, _ := delta["text"].(string)
			ch.text += s
		}
	case "message_delta":
		delta, _ := obj["delta"].(map[string]interface{})
		setAnthropicStop(ch, delta["stop_reason"])
	}
}

// FailedCheck returns the first of the checks (a set of check bits) that
// ans fails, and why, naming the wrong value; "" when it passes them all.
// schema is the json_schema check's schema (nil: the content must be JSON).
func FailedCheck(ans *Answer, checks int, schema interface{}) (string, string) {
	if ans.family == "" || len(ans.choices) == 0 {
		return FirstCheckName(checks), "the answer is not a recognised Chat, Responses, Anthropic or Ollama answer"
	}
	for i, ch := range ans.choices {
		which := ""
		if len(ans.choices) > 1 {
			which = " of choice " + strconv.Itoa(i)
		}
		if check, why := choiceFails(ch, checks, schema, which); check != "" {
			return check, why
		}
	}
	return "", ""
}

// choiceFails is FailedCheck for one choice.
func choiceFails(ch *answerChoice, checks int, schema interface{}, which string) (string, string) {
	if checks&CheckFinish != 0 && !ch.finishOK {
		if ch.finish == "" {
			return config.ValidateFinish, "the answer" + which + " has no finish reason (it was cut off)"
		}
		return config.ValidateFinish, "the answer" + which + " finished with " + strconv.Quote(ch.finish) + ", not a normal end"
	}
	if checks&CheckNoRefusal != 0 && ch.refusal != "" {
		return config.ValidateNoRefusal, "the answer" + which + " is a refusal: " + config.QuoteCut(ch.refusal, 60)
	}
	if checks&(CheckJSON|CheckJSONSchema) == 0 || ch.text == "" && ch.tool {
		return "", "" // a tool call without text: its arguments are the provider's to check
	}
	check := config.ValidateJSON
	if checks&CheckJSONSchema != 0 {
		check = config.ValidateJSONSchema
	}
	var v interface{}
	if err := json.Unmarshal([]byte(ch.text), &v); err != nil {
		return check, "the content" + which + " is not JSON (" + err.Error() + "): " + config.QuoteCut(ch.text, 40)
	}
	if checks&CheckJSONSchema != 0 && schema != nil {
		if msg := schemaViolation(schema, v); msg != "" {
			return config.ValidateJSONSchema, "the content" + which + " does not match the schema: " + msg
		}
	}
	return "", ""
}

// stringOf is obj[key] when it is a string, else "". (Yaegi v0.16.1 panics
// comparing or switching an interface{} value against string constants.)
func stringOf(obj map[string]interface{}, key string) string {
	s, _ := obj[key].(string)
	return s
}
