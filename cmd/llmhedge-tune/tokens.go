package main

import (
	"bytes"
	"encoding/json"
)

// estimateTokens is the input estimate when an answer reports no usage:
// body bytes / 4 (core's rule for tenant budgets), rounded up.
func estimateTokens(body []byte) int64 { return int64(len(body)+3) / 4 }

// tokenCounter counts the tokens of one answer as it is read: the usage
// block when the answer has one (OpenAI's final chunk with
// stream_options.include_usage, Anthropic's message_start and
// message_delta, a whole JSON answer's "usage"), else one output token per
// content event (a Chat delta with content, refusal or tool calls, an
// Anthropic content_block_delta).
type tokenCounter struct {
	stream bool
	// line holds an SSE line not yet ended; body the whole of a JSON answer.
	line, body []byte
	events     int64
	in, out    int64 // from usage; -1 when not reported
}

// feed reads the next bytes of the answer.
func (c *tokenCounter) feed(p []byte) {
	if !c.stream {
		if len(c.body) < maxRequestLine {
			c.body = append(c.body, p...)
		}
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(c.line) < maxRequestLine {
				c.line = append(c.line, p...)
			}
			return
		}
		c.line = append(c.line, p[:i]...)
		c.event(c.line)
		c.line = c.line[:0]
		p = p[i+1:]
	}
}

// usageBlock is the usage object of OpenAI and Anthropic answers.
type usageBlock struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
	InputTokens      *int64 `json:"input_tokens"`
	OutputTokens     *int64 `json:"output_tokens"`
}

// streamEvent holds the fields of an SSE data payload that carry tokens.
type streamEvent struct {
	Type    string `json:"type"`
	Choices []struct {
		Delta struct {
			Content   string          `json:"content"`
			Refusal   string          `json:"refusal"`
			ToolCalls json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Usage   *usageBlock `json:"usage"`
	Message *struct {
		Usage *usageBlock `json:"usage"`
	} `json:"message"`
}

// event reads one SSE line.
func (c *tokenCounter) event(line []byte) {
	data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte("data:"))
	if !ok {
		return
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return // [DONE] and other markers
	}
	var ev streamEvent
	if json.Unmarshal(data, &ev) != nil {
		return
	}
	if ev.Type == "content_block_delta" {
		c.events++
	}
	for _, ch := range ev.Choices {
		if ch.Delta.Content != "" || ch.Delta.Refusal != "" || len(ch.Delta.ToolCalls) > 0 {
			c.events++
			break
		}
	}
	c.usage(ev.Usage)
	if ev.Message != nil {
		c.usage(ev.Message.Usage)
	}
}

// usage records a usage block; a later block wins (Anthropic's
// message_delta carries the final output count).
func (c *tokenCounter) usage(u *usageBlock) {
	if u == nil {
		return
	}
	for _, v := range []*int64{u.PromptTokens, u.InputTokens} {
		if v != nil && *v > 0 {
			c.in = *v
		}
	}
	for _, v := range []*int64{u.CompletionTokens, u.OutputTokens} {
		if v != nil {
			c.out = *v
		}
	}
}

// into stores the counts in s (only for an answer that is billed). The
// input is left 0 without a usage block, for the caller to estimate.
func (c *tokenCounter) into(s *sample) {
	if !s.Billed {
		return
	}
	if !c.stream {
		var whole struct {
			Usage *usageBlock `json:"usage"`
		}
		if json.Unmarshal(c.body, &whole) == nil {
			c.usage(whole.Usage)
		}
	}
	// A stream cut short keeps Anthropic's placeholder count of
	// message_start (1): the events counted are then the better number.
	s.OutTokens = max(c.out, c.events)
	if c.in > 0 {
		s.InTokens = c.in
	}
	s.Usage = c.in > 0 && c.out >= 0
}
