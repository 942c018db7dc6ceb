package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// builtinPrompts are short, cheap prompts: the command measures latency,
// so the answers only need to start, not to be long.
var builtinPrompts = []string{
	"In one sentence: what is a hedged request?",
	"Name three prime numbers greater than 100.",
	"Translate 'good morning' into French, Spanish and German.",
	"Give a one-line definition of latency.",
	"What is the capital of Australia? Answer in one word.",
	"Write a haiku about waiting.",
	"List the planets of the solar system, comma-separated.",
	"In one sentence, why is the sky blue?",
	"Suggest a name for a grey cat.",
	"What does HTTP status 429 mean? One sentence.",
	"Convert 100 degrees Fahrenheit to Celsius.",
	"Give one tip for writing clear error messages.",
	"What is 17 times 23?",
	"Summarise the plot of Hamlet in one sentence.",
	"Name two differences between TCP and UDP.",
	"Write a regular expression that matches an ISO date (YYYY-MM-DD).",
	"In one sentence: what is a p99 latency?",
	"Recommend one book about distributed systems.",
	"What is the boiling point of water at sea level in Kelvin?",
	"Say hello in Japanese, and give the romanisation.",
}

// anthropicMaxTokens is sent to Anthropic endpoints when a request has no
// max_tokens, which the Messages API requires.
const anthropicMaxTokens = 256

// maxRequestLine bounds one JSONL line (a chat body with a long context).
const maxRequestLine = 16 << 20

// chatRequest is one request as read: a Chat Completions body.
type chatRequest map[string]json.RawMessage

// builtinRequests turns the built-in prompts into chat bodies.
func builtinRequests() []chatRequest {
	out := make([]chatRequest, len(builtinPrompts))
	for i, p := range builtinPrompts {
		out[i] = promptRequest(p, nil)
	}
	return out
}

// promptRequest is a chat body with prompt as the user's message and the
// other fields of rest.
func promptRequest(prompt string, rest chatRequest) chatRequest {
	req := chatRequest{}
	for k, v := range rest {
		req[k] = v
	}
	req["messages"] = mustJSON([]map[string]string{{"role": "user", "content": prompt}})
	return req
}

// loadRequests reads a JSONL file of chat bodies or {"prompt": ...} lines.
// Blank lines are skipped; any other line that is not such an object is an
// error naming the line.
func loadRequests(path string) ([]chatRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("-requests: %w", err)
	}
	defer f.Close()
	reqs, err := readRequests(f)
	if err != nil {
		return nil, fmt.Errorf("-requests %s: %w", path, err)
	}
	return reqs, nil
}

func readRequests(r io.Reader) ([]chatRequest, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxRequestLine)
	var out []chatRequest
	for line := 1; sc.Scan(); line++ {
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var req chatRequest
		if err := json.Unmarshal(text, &req); err != nil || req == nil {
			return nil, fmt.Errorf("line %d: not a JSON object (want a chat body or {\"prompt\": \"...\"}): %.80s", line, text)
		}
		if raw, ok := req["prompt"]; ok {
			var prompt string
			if err := json.Unmarshal(raw, &prompt); err != nil || prompt == "" {
				return nil, fmt.Errorf("line %d: \"prompt\" must be a non-empty string", line)
			}
			if _, both := req["messages"]; both {
				return nil, fmt.Errorf("line %d: give either \"prompt\" or \"messages\", not both", line)
			}
			delete(req, "prompt")
			req = promptRequest(prompt, req)
		}
		var msgs []json.RawMessage
		if err := json.Unmarshal(req["messages"], &msgs); err != nil || len(msgs) == 0 {
			return nil, fmt.Errorf("line %d: want \"messages\" as a non-empty array (a chat body) or \"prompt\"", line)
		}
		out = append(out, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("a line is longer than %d MiB", maxRequestLine>>20)
		}
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no requests in the file")
	}
	return out, nil
}

// bodyFor is req as sent to e: streaming, with e's model, in e's format.
func bodyFor(req chatRequest, e endpoint) ([]byte, error) {
	out := chatRequest{}
	for k, v := range req {
		out[k] = v
	}
	out["stream"] = json.RawMessage("true")
	if e.Model != "" {
		out["model"] = mustJSON(e.Model)
	}
	if _, ok := out["model"]; !ok {
		return nil, fmt.Errorf("endpoint %s: the requests name no \"model\": add model= to the -endpoint", e.Name)
	}
	if e.Format == formatAnthropic {
		if err := toAnthropic(out); err != nil {
			return nil, fmt.Errorf("endpoint %s: %w", e.Name, err)
		}
	}
	// The endpoint's own fields (body.FIELD=) come last, so they win.
	for k, v := range e.Body {
		out[k] = v
	}
	return json.Marshal(out)
}

// toAnthropic adapts a chat body to the Messages API in place: system
// messages move to "system" (Anthropic rejects the role) and max_tokens,
// which it requires, gets a small default.
func toAnthropic(req chatRequest) error {
	var msgs []map[string]json.RawMessage
	if err := json.Unmarshal(req["messages"], &msgs); err != nil {
		return fmt.Errorf("messages: %v", err)
	}
	var system []string
	kept := msgs[:0]
	for _, m := range msgs {
		var role string
		_ = json.Unmarshal(m["role"], &role)
		if role != "system" {
			kept = append(kept, m)
			continue
		}
		var text string
		if err := json.Unmarshal(m["content"], &text); err != nil {
			return errors.New("a system message's content must be a string for an anthropic endpoint")
		}
		system = append(system, text)
	}
	req["messages"] = mustJSON(kept)
	if len(system) > 0 {
		if _, ok := req["system"]; !ok {
			req["system"] = mustJSON(strings.Join(system, "\n\n"))
		}
	}
	if _, ok := req["max_tokens"]; !ok {
		req["max_tokens"] = mustJSON(anthropicMaxTokens)
	}
	delete(req, "stream_options") // OpenAI-only; Anthropic rejects unknown fields
	return nil
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only called with values that always marshal
	}
	return b
}
