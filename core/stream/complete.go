package stream

import (
	"bytes"
	"encoding/json"
)

// An upstream can end its body cleanly (a chunked terminator, a closed
// connection without Content-Length) in the middle of its answer. Such an
// answer is broken however cleanly it ended, and must reach the client as
// a failed stream, never as a complete one. These checks see only what the
// bytes prove: an SSE stream that stops inside a line, a JSON document
// whose brackets or strings are still open.

// EndsMidLine reports whether an SSE stream whose last bytes are tail
// stopped inside a line: every EventSource parser drops that line.
func EndsMidLine(tail []byte) bool {
	n := len(tail)
	return n > 0 && tail[n-1] != '\n' && tail[n-1] != '\r'
}

// Shape follows a JSON text's nesting as it streams by, to tell at its
// end whether the document was closed. It does not validate the grammar
// (the upstream is not hostile): it counts brackets outside strings.
type Shape struct {
	depth    int
	started  bool
	inString bool
	escaped  bool
}

// structural are the bytes Shape must look at; the rest are skipped
// with one IndexAny call (the loop is interpreted under Yaegi).
const structural = "{}[]\"\\"

func FeedShape(s *Shape, p []byte) {
	for len(p) > 0 {
		if !s.started {
			t := bytes.TrimLeft(p, " \t\r\n")
			if len(t) == 0 {
				return
			}
			s.started = true
			p = t
		}
		if s.escaped {
			s.escaped = false
			p = p[1:]
			continue
		}
		i := bytes.IndexAny(p, structural)
		if i < 0 {
			return
		}
		c := p[i]
		p = p[i+1:]
		if s.inString {
			if c == '\\' {
				s.escaped = true
			} else if c == '"' {
				s.inString = false
			}
			continue
		}
		switch c {
		case '"':
			s.inString = true
		case '{', '[':
			s.depth++
		case '}', ']':
			s.depth--
		}
	}
}

// ShapeOpen reports whether the document started and is not closed.
func ShapeOpen(s *Shape) bool {
	return s.started && (s.depth > 0 || s.inString)
}

// Finished reports whether a stream's last bytes hold its end marker:
// OpenAI Chat `data: [DONE]`, Responses `response.completed`, Anthropic
// `message_stop`, Ollama `"done":true`.
func Finished(tail []byte) bool {
	end := bytes.TrimRight(tail, "\r\n")
	if bytes.HasSuffix(end, []byte("data: [DONE]")) || bytes.HasSuffix(end, []byte("data:[DONE]")) {
		return true
	}
	if i := bytes.LastIndex(end, []byte("\n\n")); i >= 0 {
		end = end[i:]
	}
	return bytes.Contains(end, []byte(`"response.completed"`)) || bytes.Contains(end, []byte("message_stop")) ||
		bytes.Contains(end, []byte(`"done":true`))
}

// EndsWhole reports whether tail ends with a stream's end event, whole
// and exactly: the last SSE event (after a blank line in tail, or from its
// start when fromStart: tail starts at a line) is `data: [DONE]`, or an
// event whose type (its event field, or its data's "type") is
// response.completed or message_stop; or the last NDJSON line (after a
// line end in tail, or from its start) has "done": true at its top level.
// Finished is the loose check; nothing follows an end EndsWhole finds, so
// a fleet leader may end its generation there, before the upstream's EOF.
func EndsWhole(tail []byte, fromStart bool) bool {
	body, ok := bytes.CutSuffix(tail, []byte("\n\n"))
	if !ok {
		body, ok = bytes.CutSuffix(tail, []byte("\r\n\r\n"))
	}
	if !ok {
		return endsWithDoneLine(tail, fromStart)
	}
	body = bytes.ReplaceAll(body, []byte("\r\n"), []byte("\n"))
	start := 0
	if i := bytes.LastIndex(body, []byte("\n\n")); i >= 0 {
		start = i + 2
	} else if !fromStart {
		return false // the event may start before tail
	}
	var event, data string
	for _, line := range bytes.Split(body[start:], []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if data != "" {
				data += "\n"
			}
			data += string(bytes.TrimPrefix(v, []byte(" ")))
		} else if v, ok := bytes.CutPrefix(line, []byte("event:")); ok {
			event = string(bytes.TrimPrefix(v, []byte(" ")))
		}
	}
	if data == "[DONE]" {
		return event == ""
	}
	var typed struct {
		Type string `json:"type"`
	}
	if json.Unmarshal([]byte(data), &typed) != nil || event != "" && event != typed.Type {
		return false
	}
	return typed.Type == "response.completed" || typed.Type == "message_stop"
}

// endsWithDoneLine is EndsWhole for NDJSON (Ollama).
func endsWithDoneLine(tail []byte, fromStart bool) bool {
	body, ok := bytes.CutSuffix(tail, []byte("\n"))
	if !ok {
		return false
	}
	i := bytes.LastIndexByte(body, '\n')
	if i < 0 && !fromStart {
		return false
	}
	var line struct {
		Done bool `json:"done"`
	}
	return json.Unmarshal(bytes.TrimSuffix(body[i+1:], []byte("\r")), &line) == nil && line.Done
}

// endMarkers are the spellings HasEndMarker looks for. An answer's text
// cannot forge them: inside its JSON strings quotes and line ends are
// escaped, and these hold a bare quote or start a line.
var endMarkers = [][]byte{
	[]byte("\ndata: [DONE]"), []byte("\ndata:[DONE]"), // OpenAI Chat
	[]byte(`"type":"message_stop"`), []byte("\nevent: message_stop"), // Anthropic
	[]byte(`"type":"response.completed"`), []byte("\nevent: response.completed"), // Responses
	[]byte(`"done":true`), // Ollama
}

// markerSpan bounds an end marker's length, for the seam between writes.
const markerSpan = 32

// HasEndMarker reports whether p, written after a stream's last bytes
// prev, holds a stream's end marker or its start (a marker split between
// writes included). Unlike Finished it finds one however long the event
// around it, and never in an answer's text.
func HasEndMarker(prev, p []byte) bool {
	var seam [2 * markerSpan]byte
	from := len(prev) - markerSpan
	if from < 0 {
		from = 0
	}
	n := copy(seam[:], prev[from:])
	n += copy(seam[n:markerSpan+n], p)
	for _, m := range endMarkers {
		if bytes.Contains(p, m) || bytes.Contains(seam[:n], m) {
			return true
		}
	}
	return false
}

// AtLineStart reports whether the bytes after a stream's last bytes prev
// start a line (prev empty, or ended by a line end).
func AtLineStart(prev []byte) bool {
	return len(prev) == 0 || prev[len(prev)-1] == '\n'
}
