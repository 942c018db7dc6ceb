package stream

import (
	"bytes"
	"encoding/json"
	"mime"
	"strconv"
	"strings"
	"unicode"

	"github.com/llmhedge/llmhedge/core/config"
)

// This file decides when an attempt has produced its first output event
// (core/README.md, "The first output event decides"). The detector is fed the
// upstream body incrementally, keeps at most one line and one event's data
// (each bounded by maxLine), and parses JSON only for complete events before
// the first output, so its cost ends when the race is decided.

// Verdict is what the bytes of an attempt seen so far say about it.
type Verdict int

const (
	VerdictPending Verdict = iota // no output event yet
	VerdictOutput                 // the bytes fed so far complete the first output event
	VerdictFailure                // the stream failed before any output
)

// Format is the framing of a streamed response body.
type Format int

// Explicit values, not iota+1: Yaegi v0.16.1 gives typed constants declared
// with `iota + 1` a value that compares unequal to the same constant stored
// in a variable.
const (
	FormatSSE    Format = 1 // text/event-stream
	FormatNDJSON Format = 2 // application/x-ndjson, application/jsonl (not application/json-seq)
)

// FormatOf returns the stream format of a response Content-Type
// (parameters and case ignored); ok=false for anything that is not a stream,
// e.g. application/json.
func FormatOf(contentType string) (Format, bool) {
	if contentType == "text/event-stream" || strings.HasPrefix(contentType, "text/event-stream;") {
		return FormatSSE, true // the common spellings, without parsing
	}
	if contentType == "application/json" {
		return 0, false // a whole answer's usual spelling: no parse, no call
	}
	f, ok := parseStreamFormat(contentType)
	return f, ok
}

// parseStreamFormat is FormatOf for every other spelling.
func parseStreamFormat(contentType string) (Format, bool) {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		// Be lenient with broken parameters: the media type alone decides.
		mt = strings.ToLower(strings.TrimSpace(strings.SplitN(contentType, ";", 2)[0]))
	}
	switch mt {
	case "text/event-stream":
		return FormatSSE, true
	case "application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonl", "application/jsonlines":
		return FormatNDJSON, true
	}
	return 0, false
}

const (
	ReasonEnded = "stream ended before the first output event"
	ReasonDone  = "stream ended ([DONE]) before the first output event"
	// MaxReason bounds a failed attempt's reason (logs, headers), cut once
	// redacted (see redactReason).
	MaxReason = 160
	// MaxDetail bounds the upstream text the detector quotes: far more than
	// MaxReason, so that redaction can shorten it first.
	MaxDetail = 4 << 10
)

var utf8BOM = []byte("\xEF\xBB\xBF")

// Detector finds the first output event of one attempt's body.
type Detector struct {
	format  Format
	rule    string
	maxLine int

	line    []byte // the current unterminated line (only when it spans Feed calls)
	skipLF  bool   // SSE: the last line ended in \r, so a leading \n is part of that line end
	started bool   // the first line was seen (a UTF-8 BOM is stripped from it)

	// SSE event being accumulated (WHATWG EventSource data and event buffers).
	data    []byte
	hasData bool
	event   string
	// quiet: SSE with no line, data or event name pending, so that an event
	// read whole can take feed's fast path.
	quiet bool
	// chatRule: the rule lets classifyChatChunk judge events without a name.
	chatRule bool

	done   Verdict // sticky non-pending verdict
	reason string
}

// NewDetector returns a detector for a body of the given format.
// rule is one of RuleAuto, RuleOpenAIChat, RuleOpenAIResponses, RuleAnthropic,
// RuleAny ("" means auto); maxLine bounds a single line and one event's
// accumulated data, in bytes (<= 0 means the 256 KiB default).
func NewDetector(format Format, rule string, maxLine int) *Detector {
	if rule == "" {
		rule = config.RuleAuto
	}
	if maxLine <= 0 {
		maxLine = 256 << 10
	}
	return &Detector{format: format, rule: rule, maxLine: maxLine, quiet: format == FormatSSE,
		chatRule: rule == config.RuleAuto || rule == config.RuleOpenAIChat}
}

// Feed consumes the next bytes read from the upstream body. It returns
// VerdictOutput as soon as an event carrying model output has been completely
// received (SSE: its terminating blank line; NDJSON: its newline),
// VerdictFailure with a short reason when the stream failed before output,
// else VerdictPending. p is not retained. Once a verdict is reached it is
// returned again by any later call.
//
// A function, not a method: it is the engine's hot path, and under Yaegi a
// method call costs several function calls. It takes the common event, one "data: " line ending in "\n\n" within
// maxLine, read whole while nothing is pending: it dispatches exactly its
// line's value with no event name, without the line machinery (each
// interpreted step costs microseconds under Yaegi). Anything else goes to
// feedLoop, which handles every case. (Two functions: under Yaegi a call
// allocates every slot of its frame, so the common path's stays small.)
func Feed(d *Detector, p []byte) (Verdict, string) {
	if d.done != VerdictPending {
		return d.done, d.reason
	}
	for len(p) > 0 {
		if d.skipLF || !d.quiet || !bytes.HasPrefix(p, sseDataPrefixBytes) {
			return feedLoop(d, p)
		}
		i := bytes.IndexAny(p, "\r\n")
		if i <= 0 || i+1 >= len(p) || p[i] != '\n' || p[i+1] != '\n' || i > d.maxLine {
			return feedLoop(d, p)
		}
		d.started = true // "data: " is not a BOM
		// classifySSE with no event name, inline: a call's frame per event.
		// The chunk is judged from p itself: no string copy of it.
		data := p[len(sseDataPrefix):i]
		v := VerdictPending
		plain := false
		if d.chatRule {
			v, plain = classifyChatChunk(data)
		}
		reason := ""
		if !plain {
			v, reason = classifyEvent(d.rule, string(data), "")
		}
		p = p[i+2:]
		if v != VerdictPending {
			return finish(d, v, reason)
		}
	}
	return VerdictPending, ""
}

// feedLoop is feed for bytes that may hold anything: line ends split
// across reads, comments, event names, multi-line data.
func feedLoop(d *Detector, p []byte) (Verdict, string) {
	for len(p) > 0 {
		if d.skipLF {
			d.skipLF = false
			if p[0] == '\n' {
				p = p[1:]
				continue
			}
		}
		if d.quiet && bytes.HasPrefix(p, sseDataPrefixBytes) {
			// The fast path of feed, same result.
			if i := bytes.IndexAny(p, "\r\n"); i > 0 && i+1 < len(p) && p[i] == '\n' && p[i+1] == '\n' && i <= d.maxLine {
				d.started = true
				v, reason := classifySSE(d, string(p[len(sseDataPrefix):i]), "")
				p = p[i+2:]
				if v != VerdictPending {
					return finish(d, v, reason)
				}
				continue
			}
		}
		n, v, reason := feedLine(d, p)
		p = p[n:]
		if v != VerdictPending {
			return finish(d, v, reason)
		}
	}
	return VerdictPending, ""
}

// feedLine consumes p up to and including its first line end, handling
// the line, or all of p when it has none (kept until the line completes).
// It returns how many bytes it consumed and the verdict so far.
func feedLine(d *Detector, p []byte) (int, Verdict, string) {
	var i int
	if d.format == FormatSSE {
		i = bytes.IndexAny(p, "\r\n")
	} else {
		i = bytes.IndexByte(p, '\n')
	}
	if i < 0 {
		if len(d.line)+len(p) > d.maxLine {
			return len(p), VerdictFailure, d.tooLong()
		}
		d.line = appendBounded(d.line, p, d.maxLine)
		d.quiet = false
		return len(p), VerdictPending, ""
	}
	if len(d.line)+i > d.maxLine {
		return i + 1, VerdictFailure, d.tooLong()
	}
	line := p[:i]
	if len(d.line) > 0 {
		d.line = appendBounded(d.line, line, d.maxLine)
		line = d.line
	}
	d.skipLF = p[i] == '\r'
	v, reason := d.onLine(line)
	d.line = d.line[:0]
	d.quiet = d.format == FormatSSE && !d.hasData && d.event == ""
	return i + 1, v, reason
}

// sseDataPrefix starts the data line of the common event.
const sseDataPrefix = "data: "

var sseDataPrefixBytes = []byte(sseDataPrefix)

// End is called when the body hit EOF while the verdict was still pending.
// It never returns VerdictPending. SSE: an unterminated event is discarded
// (EventSource rules), so the result is a failure. NDJSON: a last line
// without a newline is still classified, so End may return VerdictOutput
// (with an empty reason) or a failure of that line; otherwise a failure.
func (d *Detector) End() (Verdict, string) {
	if d.done != VerdictPending {
		return d.done, d.reason
	}
	if d.format == FormatNDJSON && len(d.line) > 0 {
		v, reason := d.onLine(d.line)
		d.line = d.line[:0]
		if v != VerdictPending {
			return finish(d, v, reason)
		}
	}
	return finish(d, VerdictFailure, ReasonEnded)
}

func finish(d *Detector, v Verdict, reason string) (Verdict, string) {
	d.done = v
	d.reason = reason
	// Nothing more is parsed: release the buffers. (Separate statements: Yaegi
	// v0.16.1 panics on `a, b = nil, nil`.)
	d.line = nil
	d.data = nil
	return v, reason
}

func (d *Detector) tooLong() string {
	if d.format == FormatSSE {
		return "SSE line exceeds " + strconv.Itoa(d.maxLine) + " bytes"
	}
	return "NDJSON line exceeds " + strconv.Itoa(d.maxLine) + " bytes"
}

// onLine handles one complete line (without its line end).
func (d *Detector) onLine(line []byte) (Verdict, string) {
	if !d.started {
		d.started = true
		line = bytes.TrimPrefix(line, utf8BOM)
	}
	if d.format == FormatNDJSON {
		return d.ndjsonLine(line)
	}
	return d.sseLine(line)
}

// sseLine applies the WHATWG EventSource line rules.
func (d *Detector) sseLine(line []byte) (Verdict, string) {
	if len(line) == 0 {
		// A blank line dispatches the event; one without data is ignored.
		hasData, event := d.hasData, d.event
		d.hasData = false
		d.event = ""
		if !hasData {
			d.data = d.data[:0]
			return VerdictPending, ""
		}
		v, reason := classifySSE(d, string(d.data), event)
		d.data = d.data[:0]
		return v, reason
	}
	if line[0] == ':' {
		return VerdictPending, "" // comment, e.g. ": ping"
	}
	field, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "data":
		n := len(d.data) + len(value)
		if d.hasData {
			n++ // the \n joining data lines
		}
		if n > d.maxLine {
			return VerdictFailure, "SSE event data exceeds " + strconv.Itoa(d.maxLine) + " bytes"
		}
		if d.hasData {
			d.data = appendBounded(d.data, []byte{'\n'}, d.maxLine)
		}
		d.data = appendBounded(d.data, value, d.maxLine)
		d.hasData = true
	case "event":
		d.event = string(value)
	}
	// id, retry and unknown fields do not matter here.
	return VerdictPending, ""
}

// appendBounded appends p to b, growing b to at most limit bytes of capacity
// (append's own growth could reach about twice the limit). The caller has
// checked len(b)+len(p) <= limit.
func appendBounded(b, p []byte, limit int) []byte {
	n := len(b) + len(p)
	if n > cap(b) {
		c := 2 * cap(b)
		if c < n {
			c = n
		}
		if c > limit {
			c = limit
		}
		nb := make([]byte, len(b), c)
		copy(nb, b)
		b = nb
	}
	return append(b, p...)
}

// Event kinds (JSON "type" or SSE event name) of the Anthropic Messages
// stream; content_block_delta carries output, and message_delta with a
// stop_reason and message_stop end the answer.
var anthropicKinds = map[string]bool{
	"message_start":       true,
	"content_block_start": true,
	"content_block_delta": true,
	"content_block_stop":  true,
	"message_delta":       true,
	"message_stop":        true,
	"ping":                true,
}

// Event kinds of Cohere's v2 chat stream that carry no output: the
// message's and a content block's start (content-start's text is empty;
// its delta follows) and ends, citations and debug events. content-delta,
// tool-plan-delta and the tool-call events are output, message-end (with
// its finish_reason) is final; unknown events count as output, as for any
// other SSE.
var cohereControlKinds = map[string]bool{
	"message-start":  true,
	"content-start":  true,
	"content-end":    true,
	"tool-call-end":  true,
	"citation-start": true,
	"citation-end":   true,
	"debug":          true,
}

// classifySSE classifies one dispatched SSE event of d's stream: a plain
// Chat chunk by its fast path, anything else by the general rules.
func classifySSE(d *Detector, data, event string) (Verdict, string) {
	if event == "" && d.chatRule {
		if v, ok := classifyChatChunk([]byte(data)); ok {
			return v, ""
		}
	}
	v, reason := classifyEvent(d.rule, data, event)
	return v, reason
}

// classifyEvent applies the general rules to one dispatched SSE event.
func classifyEvent(rule, data, event string) (Verdict, string) {
	s := strings.TrimSpace(data)
	var val interface{}
	isJSON := false
	if s != "" && (s[0] == '{' || s[0] == '[') {
		isJSON = json.Unmarshal([]byte(s), &val) == nil
	}
	obj, _ := val.(map[string]interface{})
	if event == "error" {
		msg := s
		if obj != nil {
			msg = errorMessage(obj)
		}
		return VerdictFailure, WithDetail("upstream error event", msg)
	}
	if s == "" {
		return VerdictPending, "" // empty data is a keep-alive, never output
	}
	if s == "[DONE]" {
		return VerdictFailure, ReasonDone
	}
	if !isJSON {
		val = s // plain text: output for auto/any unless its event name is a known control
	}
	kind := event
	if t, ok := obj["type"].(string); ok && t != "" {
		kind = t
	}
	return classifyJSON(rule, val, obj, kind)
}

// classifyJSON classifies one event (SSE data or an NDJSON line that is not
// in Ollama's shape) given its decoded JSON value (or its text when it is
// not JSON); obj is val when it is an object, kind its "type" or SSE event
// name.
func classifyJSON(rule string, val interface{}, obj map[string]interface{}, kind string) (Verdict, string) {
	if obj != nil {
		if e, ok := obj["error"]; ok && e != nil && e != false {
			return VerdictFailure, WithDetail("upstream error", errorMessage(obj))
		}
	}
	if kind == "error" {
		return VerdictFailure, WithDetail("upstream error event", errorMessage(obj))
	}
	family := rule
	if rule == config.RuleAuto || rule == config.RuleAny {
		_, isChat := obj["choices"].([]interface{})
		switch {
		case isChat:
			family = config.RuleOpenAIChat
		case strings.HasPrefix(kind, "response."):
			family = config.RuleOpenAIResponses
		case anthropicKinds[kind]:
			family = config.RuleAnthropic
		case cohereControlKinds[kind]:
			return VerdictPending, "" // Cohere v2: no output yet
		default:
			// Unknown event: output for auto/any unless it carries nothing.
			return outputIf(!isEmptyJSON(val))
		}
	}
	switch family {
	case config.RuleOpenAIChat:
		choices, _ := obj["choices"].([]interface{})
		if rule == config.RuleAny {
			// Lenient: anything but role-only or empty choices is output.
			return outputIf(!choicesEmpty(choices) || chatFinished(choices))
		}
		return outputIf(chatOutput(choices) || chatFinished(choices))
	case config.RuleOpenAIResponses:
		return classifyResponses(kind, obj)
	case config.RuleAnthropic:
		switch kind {
		case "content_block_delta", "message_stop":
			return VerdictOutput, ""
		case "message_delta":
			delta, _ := obj["delta"].(map[string]interface{})
			return outputIf(!isEmptyJSON(delta["stop_reason"]))
		}
	}
	return VerdictPending, "" // not recognised by an explicit rule: control
}

func outputIf(ok bool) (Verdict, string) {
	if ok {
		return VerdictOutput, ""
	}
	return VerdictPending, ""
}

// chatTextFields are the delta members whose non-empty text is output.
var chatTextFields = []string{"content", "refusal", "reasoning_content", "reasoning"}

// chatOutput reports whether a Chat Completions chunk carries model output.
func chatOutput(choices []interface{}) bool {
	for _, c := range choices {
		ch, _ := c.(map[string]interface{})
		if s, _ := ch["text"].(string); s != "" { // legacy completions
			return true
		}
		delta, _ := ch["delta"].(map[string]interface{})
		if delta == nil {
			continue
		}
		for _, k := range chatTextFields {
			if s, _ := delta[k].(string); s != "" {
				return true
			}
		}
		// Some providers send content as an array of parts; function_call is
		// the legacy form of tool_calls.
		if a, _ := delta["content"].([]interface{}); len(a) > 0 {
			return true
		}
		if a, _ := delta["tool_calls"].([]interface{}); len(a) > 0 {
			return true
		}
		if f, _ := delta["function_call"].(map[string]interface{}); len(f) > 0 {
			return true
		}
		if a, _ := delta["audio"].(map[string]interface{}); a != nil {
			if !isEmptyJSON(a["data"]) || !isEmptyJSON(a["transcript"]) {
				return true
			}
		}
	}
	return false
}

// chatFinished reports whether a Chat Completions chunk is a final event:
// a choice with a finish_reason. A complete answer decides the race even
// without visible output (a reasoning model that spent its budget on
// hidden reasoning, a content filter).
func chatFinished(choices []interface{}) bool {
	for _, c := range choices {
		ch, _ := c.(map[string]interface{})
		if !isEmptyJSON(ch["finish_reason"]) {
			return true
		}
	}
	return false
}

// choicesEmpty reports whether every choice is role-only or empty: nothing
// but index, finish_reason, logprobs, and a delta/message with nothing but a
// role.
func choicesEmpty(choices []interface{}) bool {
	for _, c := range choices {
		ch, ok := c.(map[string]interface{})
		if !ok {
			if !isEmptyJSON(c) {
				return false
			}
			continue
		}
		for k, v := range ch {
			switch k {
			case "index", "finish_reason", "logprobs":
				continue
			case "delta", "message":
				if m, ok := v.(map[string]interface{}); ok {
					for mk, mv := range m {
						if mk != "role" && !isEmptyJSON(mv) {
							return false
						}
					}
					continue
				}
			}
			if !isEmptyJSON(v) {
				return false
			}
		}
	}
	return true
}

// classifyResponses classifies an OpenAI Responses API event: a delta with
// content is output, response.completed and response.incomplete are final
// events (a complete answer, which decides as output does).
func classifyResponses(kind string, obj map[string]interface{}) (Verdict, string) {
	switch kind {
	case "response.completed", "response.incomplete":
		return VerdictOutput, ""
	case "response.failed":
		resp, _ := obj["response"].(map[string]interface{})
		if msg := errorMessage(resp); msg != "" {
			return VerdictFailure, WithDetail(kind, msg)
		}
		return VerdictFailure, "stream ended (" + kind + ") before the first output event"
	}
	if strings.HasPrefix(kind, "response.") && strings.HasSuffix(kind, ".delta") {
		return outputIf(!isEmptyJSON(obj["delta"]))
	}
	return VerdictPending, "" // response.created, response.in_progress, ...added, ...done
}

// ndjsonLine classifies one NDJSON line.
func (d *Detector) ndjsonLine(line []byte) (Verdict, string) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return VerdictPending, ""
	}
	var val interface{}
	if json.Unmarshal(line, &val) != nil {
		return VerdictFailure, "malformed NDJSON line"
	}
	obj, _ := val.(map[string]interface{})
	if obj == nil {
		return outputIf(!isEmptyJSON(val) && (d.rule == config.RuleAuto || d.rule == config.RuleAny))
	}
	if e, ok := obj["error"]; ok && e != nil && e != false {
		return VerdictFailure, WithDetail("upstream error", errorMessage(obj))
	}
	_, hasMessage := obj["message"]
	_, hasResponse := obj["response"]
	_, hasDone := obj["done"]
	if !hasMessage && !hasResponse && !hasDone {
		kind, _ := obj["type"].(string)
		return classifyJSON(d.rule, val, obj, kind)
	}
	// Ollama's shape (chat: message, generate: response/thinking), whatever
	// the rule: the rules name SSE dialects.
	msg, _ := obj["message"].(map[string]interface{})
	if s, _ := msg["content"].(string); s != "" {
		return VerdictOutput, ""
	}
	if s, _ := msg["thinking"].(string); s != "" {
		return VerdictOutput, ""
	}
	if a, _ := msg["tool_calls"].([]interface{}); len(a) > 0 {
		return VerdictOutput, ""
	}
	if s, _ := obj["response"].(string); s != "" {
		return VerdictOutput, ""
	}
	if s, _ := obj["thinking"].(string); s != "" {
		return VerdictOutput, ""
	}
	if done, _ := obj["done"].(bool); done {
		return VerdictOutput, "" // the final line: a complete answer decides as output does
	}
	return VerdictPending, ""
}

// isEmptyJSON reports whether a decoded JSON value carries nothing: null,
// false, "", [], {} or an object whose members all carry nothing.
func isEmptyJSON(v interface{}) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case string:
		return x == ""
	case []interface{}:
		return len(x) == 0
	case map[string]interface{}:
		for _, m := range x {
			if !isEmptyJSON(m) {
				return false
			}
		}
		return true
	}
	return false
}

// errorMessage digs the message out of an error-carrying JSON object: the
// OpenAI/Anthropic {"error":{"message"}} shape, Ollama's {"error":"..."}, or
// a top-level "message" (Responses API error events).
func errorMessage(obj map[string]interface{}) string {
	if obj == nil {
		return ""
	}
	switch e := obj["error"].(type) {
	case string:
		return e
	case map[string]interface{}:
		if m, _ := e["message"].(string); m != "" {
			return m
		}
		if t, _ := e["type"].(string); t != "" {
			return t
		}
		if c, _ := e["code"].(string); c != "" {
			return c
		}
	}
	m, _ := obj["message"].(string)
	return m
}

// WithDetail returns prefix, followed by ": " and msg made single-line
// when msg is not empty, at most MaxDetail bytes of it. A cut drops the word
// it falls in: that may be the start of a key, which redaction (later)
// would not recognise. (A plain loop, not strings.Map: no interpreted
// callback is handed to compiled code under Yaegi.)
func WithDetail(prefix, msg string) string {
	var b strings.Builder
	space := false
	for _, r := range msg {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			space = b.Len() > 0
			continue
		}
		if b.Len() >= MaxDetail {
			return prefix + ": " + withoutLastWord(b.String()) + "…"
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		b.WriteRune(r)
	}
	if b.Len() == 0 {
		return prefix
	}
	return prefix + ": " + b.String()
}

// withoutLastWord returns s up to its last space ("" when it has none).
func withoutLastWord(s string) string {
	if i := strings.LastIndexByte(s, ' '); i >= 0 {
		return s[:i+1]
	}
	return ""
}
