package core

import "bytes"

// An upstream can end its body cleanly (a chunked terminator, a closed
// connection without Content-Length) in the middle of its answer. Such an
// answer is broken however cleanly it ended, and must reach the client as
// a failed stream, never as a complete one. These checks see only what the
// bytes prove: an SSE stream that stops inside a line, a JSON document
// whose brackets or strings are still open.

// endsMidLine reports whether an SSE stream whose last bytes are tail
// stopped inside a line: every EventSource parser drops that line.
func endsMidLine(tail []byte) bool {
	n := len(tail)
	return n > 0 && tail[n-1] != '\n' && tail[n-1] != '\r'
}

// jsonShape follows a JSON text's nesting as it streams by, to tell at its
// end whether the document was closed. It does not validate the grammar
// (the upstream is not hostile): it counts brackets outside strings.
type jsonShape struct {
	depth    int
	started  bool
	inString bool
	escaped  bool
}

// structural are the bytes jsonShape must look at; the rest are skipped
// with one IndexAny call (the loop is interpreted under Yaegi).
const structural = "{}[]\"\\"

func feedShape(s *jsonShape, p []byte) {
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

// shapeOpen reports whether the document started and is not closed.
func shapeOpen(s *jsonShape) bool {
	return s.started && (s.depth > 0 || s.inString)
}
