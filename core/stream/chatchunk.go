package stream

import (
	"bytes"
	"encoding/json"
)

// This file is the detector's fast path for the most common event of all,
// an OpenAI Chat Completions chunk. Decoding it into a struct instead of
// generic maps, and judging it from raw field values, costs a fraction of
// the general rules (under Yaegi above all, where every map lookup and
// type assertion is interpreted). Anything unusual is left to the general
// rules, which stay the reference: an event the fast path takes gets the
// verdict they would give it. The one difference: encoding/json matches
// field names regardless of case, the general rules exactly; only an event
// that spells "content" or another field in capitals would be judged
// differently, and no provider sends one.

// chatEvent holds what decides whether a chunk carries output.
type chatEvent struct {
	Type    json.RawMessage   `json:"type"`
	Error   json.RawMessage   `json:"error"`
	Choices []chatEventChoice `json:"choices"`
}

type chatEventChoice struct {
	Text  json.RawMessage `json:"text"` // legacy completions
	Delta *chatEventDelta `json:"delta"`
	// A string pointer, not raw JSON: null (in every chunk but the last)
	// costs no allocation, and a value that is not a string fails the
	// decoding, which leaves the chunk to the general rules.
	FinishReason *string `json:"finish_reason"`
}

// chatEventDelta holds the delta members chatOutput looks at.
type chatEventDelta struct {
	Content          json.RawMessage `json:"content"`
	Refusal          json.RawMessage `json:"refusal"`
	ReasoningContent json.RawMessage `json:"reasoning_content"`
	Reasoning        json.RawMessage `json:"reasoning"`
	ToolCalls        json.RawMessage `json:"tool_calls"`
	FunctionCall     json.RawMessage `json:"function_call"`
	Audio            json.RawMessage `json:"audio"`
}

// choicesKey is the member every Chat chunk has.
var choicesKey = []byte(`"choices"`)

// classifyChatChunk judges SSE data that has no event name under the auto
// or Chat rule. ok=false: not a plain chunk, the general rules decide. data
// is not retained.
func classifyChatChunk(data []byte) (Verdict, bool) {
	if !bytes.Contains(data, choicesKey) {
		return VerdictPending, false
	}
	var c chatEvent
	if json.Unmarshal(data, &c) != nil || c.Choices == nil || len(c.Type)+len(c.Error) > 0 {
		return VerdictPending, false // a "type" or an "error", even null: the general rules
	}
	for i := range c.Choices {
		ch := &c.Choices[i]
		if (len(ch.Text) > 0 || ch.FinishReason != nil) && textOrFinish(ch) {
			return VerdictOutput, true
		}
		d := ch.Delta
		if d == nil {
			continue
		}
		// The plain delta has a role and content only: its length alone
		// tells "" (2 bytes) from text.
		if len(d.Refusal)+len(d.ReasoningContent)+len(d.Reasoning)+len(d.ToolCalls)+len(d.FunctionCall)+len(d.Audio) > 0 {
			v, ok := classifyRichDelta(d)
			if !ok || v == VerdictOutput {
				return v, ok
			}
			continue
		}
		if len(d.Content) > 2 && (d.Content[0] == '"' || jsonNonEmptyList(d.Content, '[', ']')) {
			return VerdictOutput, true
		}
	}
	return VerdictPending, true
}

// textOrFinish reports whether a choice carries legacy completions text or
// a finish reason (a final event): either is output. (Its own function:
// under Yaegi classifyChatChunk's frame, allocated for every chunk, stays
// smaller; a delta chunk has neither.)
func textOrFinish(ch *chatEventChoice) bool {
	return len(ch.Text) > 2 && ch.Text[0] == '"' || ch.FinishReason != nil && *ch.FinishReason != ""
}

// classifyRichDelta judges a delta with more than a role and content.
func classifyRichDelta(d *chatEventDelta) (Verdict, bool) {
	if !jsonAbsent(d.Audio) {
		return VerdictPending, false
	}
	if jsonNonEmptyString(d.Content) || jsonNonEmptyString(d.Refusal) || jsonNonEmptyString(d.ReasoningContent) ||
		jsonNonEmptyString(d.Reasoning) || jsonNonEmptyList(d.Content, '[', ']') ||
		jsonNonEmptyList(d.ToolCalls, '[', ']') || jsonNonEmptyList(d.FunctionCall, '{', '}') {
		return VerdictOutput, true
	}
	return VerdictPending, true
}

// jsonAbsent reports whether a raw member was missing or null.
func jsonAbsent(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// jsonNonEmptyString reports whether raw is a string of at least one
// character (any text between the quotes decodes to one or more).
func jsonNonEmptyString(raw json.RawMessage) bool {
	return len(raw) > 2 && raw[0] == '"'
}

// jsonNonEmptyList reports whether raw is an array (open '[') or object
// (open '{') with at least one element.
func jsonNonEmptyList(raw json.RawMessage, open, end byte) bool {
	if len(raw) < 2 || raw[0] != open {
		return false
	}
	for _, c := range raw[1:] {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c != end
	}
	return false
}
