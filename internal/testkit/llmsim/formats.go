package llmsim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Format is an LLM API wire format.
type Format int

// The formats the Server speaks, chosen by the request path's suffix.
const (
	// Chat is OpenAI Chat Completions, path suffix /v1/chat/completions: SSE
	// "data:" chunks of object chat.completion.chunk ending with
	// "data: [DONE]", or one chat.completion JSON object.
	Chat Format = iota + 1
	// Responses is the OpenAI Responses API, path suffix /v1/responses: SSE
	// events with "event:" and "data:" lines (response.created …
	// response.output_text.delta … response.completed), or one response
	// JSON object.
	Responses
	// Messages is Anthropic Messages, path suffix /v1/messages: SSE events
	// message_start … content_block_delta … message_stop, or one message JSON
	// object.
	Messages
	// Ollama is Ollama chat, path suffix /api/chat: application/x-ndjson, one
	// JSON object per line, the last with "done": true. Like Ollama, it
	// streams unless the body says "stream": false.
	Ollama
)

// String returns the format's name: chat, responses, messages or ollama.
func (f Format) String() string {
	switch f {
	case Chat:
		return "chat"
	case Responses:
		return "responses"
	case Messages:
		return "messages"
	case Ollama:
		return "ollama"
	}
	return "Format(" + strconv.Itoa(int(f)) + ")"
}

// FormatForPath returns the format served at path, matched by suffix so that
// a prefix such as /openai/v1/chat/completions works. A trailing slash is
// ignored.
func FormatForPath(path string) (Format, bool) {
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/v1/chat/completions"):
		return Chat, true
	case strings.HasSuffix(path, "/v1/responses"):
		return Responses, true
	case strings.HasSuffix(path, "/v1/messages"):
		return Messages, true
	case strings.HasSuffix(path, "/api/chat"):
		return Ollama, true
	}
	return 0, false
}

// DefaultModel is the model named in answers when the request body has none.
const DefaultModel = "sim-model"

// Created is the fixed creation time (Unix seconds) in every answer, so that
// answers are byte-for-byte reproducible.
const Created int64 = 1735689600 // 2025-01-01T00:00:00Z

// PromptTokens is the fixed prompt token count reported in usage.
const PromptTokens = 16

// Ping is the keep-alive comment an SSE stream sends while it waits for its
// first token. NDJSON streams send none.
const Ping = ": ping\n\n"

// TokenText returns the content of token i (0-based) of the answer to
// requestID: "<requestID>:<i> ". Every upstream answers with the same text;
// the upstream is named in the answer's ids instead.
func TokenText(requestID string, i int) string {
	return requestID + ":" + strconv.Itoa(i) + " "
}

// ExpectedChatText returns the whole text of the answer to requestID with
// the given number of tokens: the concatenated TokenText of every token. It
// is the same in every format.
func ExpectedChatText(requestID string, tokens int) string {
	var b strings.Builder
	for i := 0; i < tokens; i++ {
		b.WriteString(TokenText(requestID, i))
	}
	return b.String()
}

// ExpectedStream returns the exact body of a Chat Completions stream from
// upstream for requestID, without keep-alive pings (see StripPings).
func ExpectedStream(upstream, model, requestID string, tokens int) []byte {
	return Call{Format: Chat, Stream: true, Upstream: upstream, Model: model, RequestID: requestID, Tokens: tokens}.Body()
}

// StripPings removes the keep-alive comments (Ping) from an SSE body, so that
// a body received with pings enabled can be compared with Call.Body.
func StripPings(body []byte) []byte {
	return bytes.ReplaceAll(body, []byte(Ping), nil)
}

// KeepAlive is the comment a gateway sends while a streaming race whose
// headers went out early (llmhedge's early_headers) is still undecided.
const KeepAlive = ": keep-alive\n\n"

// StripKeepAlives returns body without the gateway's keep-alive comments.
func StripKeepAlives(body []byte) []byte {
	return bytes.ReplaceAll(body, []byte(KeepAlive), nil)
}

// Call describes one successful request to one upstream: enough to compute
// the exact bytes of its answer.
type Call struct {
	Format    Format
	Stream    bool
	Upstream  string // the Server's Name
	Model     string // the request's "model"; "" means DefaultModel
	RequestID string
	Tokens    int // <= 0 means the default, 20
}

// Body returns the exact response body of c, for a stream without the
// keep-alive pings (which depend on timing).
func (c Call) Body() []byte {
	s := c.script()
	if !c.Stream {
		return s.full()
	}
	var b bytes.Buffer
	b.Write(s.preamble)
	for i := 0; i < s.tokens; i++ {
		b.Write(s.token(i))
	}
	b.Write(s.trailer)
	return b.Bytes()
}

// ContentType returns the Content-Type of c's answer.
func (c Call) ContentType() string {
	return c.script().contentType
}

// script is everything a format sends, piece by piece.
type script struct {
	contentType string
	tokens      int
	preamble    []byte             // sent with the headers, before any wait
	ping        []byte             // keep-alive while waiting; nil for none
	token       func(i int) []byte // token i (0-based)
	trailer     []byte             // after the last token
	doneEarly   []byte             // the end of a stream that has no output
	errorEvent  []byte             // a failure event instead of the first token
	full        func() []byte      // the non-streaming answer
}

func (c Call) script() script {
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.Tokens <= 0 {
		c.Tokens = Reference(0, 1).Tokens
	}
	switch c.Format {
	case Responses:
		return c.responsesScript()
	case Messages:
		return c.messagesScript()
	case Ollama:
		return c.ollamaScript()
	}
	return c.chatScript()
}

// ---- OpenAI Chat Completions ----

func (c Call) chatScript() script {
	id := "chatcmpl-" + c.Upstream + "-" + c.RequestID
	chunk := func(delta json.RawMessage, finish any) []byte {
		return sseData(obj(
			"id", id,
			"object", "chat.completion.chunk",
			"created", Created,
			"model", c.Model,
			"system_fingerprint", c.Upstream,
			"choices", []json.RawMessage{obj(
				"index", 0,
				"delta", delta,
				"logprobs", nil,
				"finish_reason", finish,
			)},
		))
	}
	done := []byte("data: [DONE]\n\n")
	return script{
		contentType: "text/event-stream",
		tokens:      c.Tokens,
		preamble:    chunk(obj("role", "assistant", "content", ""), nil),
		ping:        []byte(Ping),
		token: func(i int) []byte {
			return chunk(obj("content", TokenText(c.RequestID, i)), nil)
		},
		trailer:    append(chunk(obj(), "stop"), done...),
		doneEarly:  done,
		errorEvent: sseData(openAIError(http.StatusInternalServerError, "simulated upstream error")),
		full: func() []byte {
			return obj(
				"id", id,
				"object", "chat.completion",
				"created", Created,
				"model", c.Model,
				"system_fingerprint", c.Upstream,
				"choices", []json.RawMessage{obj(
					"index", 0,
					"message", obj("role", "assistant", "content", ExpectedChatText(c.RequestID, c.Tokens), "refusal", nil),
					"logprobs", nil,
					"finish_reason", "stop",
				)},
				"usage", obj("prompt_tokens", PromptTokens, "completion_tokens", c.Tokens, "total_tokens", PromptTokens+c.Tokens),
			)
		},
	}
}

// ---- OpenAI Responses API ----

func (c Call) responsesScript() script {
	id := "resp_" + c.Upstream + "_" + c.RequestID
	itemID := "msg_" + c.Upstream + "_" + c.RequestID
	part := func(text string) json.RawMessage {
		return obj("type", "output_text", "text", text, "annotations", []any{}, "logprobs", []any{})
	}
	item := func(status string, content []json.RawMessage) json.RawMessage {
		return obj("id", itemID, "type", "message", "status", status, "role", "assistant", "content", content)
	}
	response := func(status string, output []json.RawMessage, usage any) json.RawMessage {
		return obj(
			"id", id,
			"object", "response",
			"created_at", Created,
			"status", status,
			"model", c.Model,
			"output", output,
			"usage", usage,
		)
	}
	usage := func(n int) json.RawMessage {
		return obj(
			"input_tokens", PromptTokens,
			"input_tokens_details", obj("cached_tokens", 0),
			"output_tokens", n,
			"output_tokens_details", obj("reasoning_tokens", 0),
			"total_tokens", PromptTokens+n,
		)
	}
	event := func(typ string, seq int, fields ...any) []byte {
		return sseEvent(typ, obj(append([]any{"type", typ, "sequence_number", seq}, fields...)...))
	}
	// end is every event after the deltas, for an answer of n tokens.
	end := func(n int) []byte {
		text := ExpectedChatText(c.RequestID, n)
		seq := 4 + n
		done := item("completed", []json.RawMessage{part(text)})
		var b bytes.Buffer
		b.Write(event("response.output_text.done", seq, "item_id", itemID, "output_index", 0, "content_index", 0, "text", text, "logprobs", []any{}))
		b.Write(event("response.content_part.done", seq+1, "item_id", itemID, "output_index", 0, "content_index", 0, "part", part(text)))
		b.Write(event("response.output_item.done", seq+2, "output_index", 0, "item", done))
		b.Write(event("response.completed", seq+3, "response", response("completed", []json.RawMessage{done}, usage(n))))
		return b.Bytes()
	}
	var pre bytes.Buffer
	pre.Write(event("response.created", 0, "response", response("in_progress", []json.RawMessage{}, nil)))
	pre.Write(event("response.in_progress", 1, "response", response("in_progress", []json.RawMessage{}, nil)))
	pre.Write(event("response.output_item.added", 2, "output_index", 0, "item", item("in_progress", []json.RawMessage{})))
	pre.Write(event("response.content_part.added", 3, "item_id", itemID, "output_index", 0, "content_index", 0, "part", part("")))
	return script{
		contentType: "text/event-stream",
		tokens:      c.Tokens,
		preamble:    pre.Bytes(),
		ping:        []byte(Ping),
		token: func(i int) []byte {
			return event("response.output_text.delta", 4+i, "item_id", itemID, "output_index", 0, "content_index", 0,
				"delta", TokenText(c.RequestID, i), "logprobs", []any{})
		},
		trailer:   end(c.Tokens),
		doneEarly: end(0),
		errorEvent: event("error", 4, "code", "server_error", "message", "simulated upstream error", "param", nil,
			"error", obj("type", "server_error", "code", "server_error", "message", "simulated upstream error")),
		full: func() []byte {
			return response("completed", []json.RawMessage{item("completed", []json.RawMessage{part(ExpectedChatText(c.RequestID, c.Tokens))})}, usage(c.Tokens))
		},
	}
}

// ---- Anthropic Messages ----

func (c Call) messagesScript() script {
	id := "msg_" + c.Upstream + "_" + c.RequestID
	message := func(content []json.RawMessage, stop any, usage json.RawMessage) json.RawMessage {
		return obj(
			"id", id,
			"type", "message",
			"role", "assistant",
			"model", c.Model,
			"content", content,
			"stop_reason", stop,
			"stop_sequence", nil,
			"usage", usage,
		)
	}
	event := func(typ string, fields ...any) []byte {
		return sseEvent(typ, obj(append([]any{"type", typ}, fields...)...))
	}
	end := func(n int) []byte {
		var b bytes.Buffer
		b.Write(event("content_block_stop", "index", 0))
		b.Write(event("message_delta", "delta", obj("stop_reason", "end_turn", "stop_sequence", nil), "usage", obj("output_tokens", n)))
		b.Write(event("message_stop"))
		return b.Bytes()
	}
	var pre bytes.Buffer
	pre.Write(event("message_start", "message", message([]json.RawMessage{}, nil, obj("input_tokens", PromptTokens, "output_tokens", 1))))
	pre.Write(event("content_block_start", "index", 0, "content_block", obj("type", "text", "text", "")))
	pre.Write(event("ping"))
	return script{
		contentType: "text/event-stream",
		tokens:      c.Tokens,
		preamble:    pre.Bytes(),
		ping:        []byte(Ping),
		token: func(i int) []byte {
			return event("content_block_delta", "index", 0, "delta", obj("type", "text_delta", "text", TokenText(c.RequestID, i)))
		},
		trailer:    end(c.Tokens),
		doneEarly:  end(0),
		errorEvent: event("error", "error", obj("type", "overloaded_error", "message", "simulated upstream error")),
		full: func() []byte {
			return message(
				[]json.RawMessage{obj("type", "text", "text", ExpectedChatText(c.RequestID, c.Tokens))},
				"end_turn",
				obj("input_tokens", PromptTokens, "output_tokens", c.Tokens),
			)
		},
	}
}

// ---- Ollama chat ----

func (c Call) ollamaScript() script {
	createdAt := time.Unix(Created, 0).UTC().Format(time.RFC3339Nano)
	line := func(content string, done bool, extra ...any) []byte {
		fields := append([]any{
			"model", c.Model,
			"created_at", createdAt,
			"message", obj("role", "assistant", "content", content),
			"done", done,
		}, extra...)
		return append(obj(fields...), '\n')
	}
	end := func(n int) []byte { return line("", true, "done_reason", "stop", "eval_count", n) }
	return script{
		contentType: "application/x-ndjson",
		tokens:      c.Tokens,
		preamble:    line("", false),
		token:       func(i int) []byte { return line(TokenText(c.RequestID, i), false) },
		trailer:     end(c.Tokens),
		doneEarly:   end(0),
		errorEvent:  append(obj("error", "simulated upstream error"), '\n'),
		full: func() []byte {
			l := line(ExpectedChatText(c.RequestID, c.Tokens), true, "done_reason", "stop", "eval_count", c.Tokens)
			return l[:len(l)-1]
		},
	}
}

// ---- errors ----

// errorBody is the JSON error answer for an error status in format f: the
// OpenAI shape {"error":{"message","type","param","code"}}; for Anthropic
// Messages with Anthropic's top-level "type":"error" added.
func errorBody(f Format, status int, message string) []byte {
	if f == Messages {
		typ, code := errorKind(status)
		return obj("type", "error", "error", obj("message", message, "type", typ, "code", code))
	}
	return openAIError(status, message)
}

func openAIError(status int, message string) json.RawMessage {
	typ, code := errorKind(status)
	return obj("error", obj("message", message, "type", typ, "param", nil, "code", code))
}

// errorKind names the error type and code of an HTTP status.
func errorKind(status int) (typ, code string) {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return "invalid_request_error", "invalid_request"
	case http.StatusUnauthorized:
		return "authentication_error", "invalid_api_key"
	case http.StatusForbidden:
		return "permission_error", "permission_denied"
	case http.StatusNotFound:
		return "not_found_error", "not_found"
	case http.StatusMethodNotAllowed:
		return "invalid_request_error", "method_not_allowed"
	case http.StatusRequestTimeout:
		return "timeout_error", "timeout"
	case http.StatusRequestEntityTooLarge:
		return "invalid_request_error", "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error", "rate_limit_exceeded"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error", "overloaded"
	}
	return "server_error", "server_error"
}

// ---- JSON and SSE helpers ----

// obj marshals alternating keys and values into a JSON object whose keys
// keep the given order, so answers are readable and byte-for-byte stable.
func obj(pairs ...any) json.RawMessage {
	var b bytes.Buffer
	b.WriteByte('{')
	for i := 0; i+1 < len(pairs); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(mustJSON(pairs[i].(string)))
		b.WriteByte(':')
		b.Write(mustJSON(pairs[i+1]))
	}
	b.WriteByte('}')
	return b.Bytes()
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("llmsim: " + err.Error())
	}
	return b
}

func sseData(data []byte) []byte {
	return []byte("data: " + string(data) + "\n\n")
}

func sseEvent(typ string, data []byte) []byte {
	return []byte("event: " + typ + "\ndata: " + string(data) + "\n\n")
}
