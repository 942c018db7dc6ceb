package stream

import "bytes"

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
