package lighttrace

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
)

// W3C Trace Context (https://www.w3.org/TR/trace-context/): the
// traceparent header is version-traceid-parentid-flags in lower-case hex,
// "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" for version
// 00. An invalid traceparent is treated as absent, and so is the
// tracestate that came with it.

const (
	traceparentLen = 55 // version 00: 2+1+32+1+16+1+2
	zeroTraceID    = "00000000000000000000000000000000"
	zeroSpanID     = "0000000000000000"
)

// parent is a request's trace context, as its traceparent header says.
type parent struct {
	traceID string // 32 lower-case hex digits
	spanID  string // 16 lower-case hex digits
	sampled bool
}

// hexAndDashes are the characters of a traceparent's first 55.
const hexAndDashes = "0123456789abcdef-"

// parseTraceparent reads a traceparent header value. ok is false when it
// is malformed: not lower-case hex, a version of ff or one this parser
// cannot read, an all-zero trace or span id, a wrong length. The checks
// are compiled calls (strings.Trim, Count), not loops: under Yaegi a loop
// over the header's 55 characters would cost more than the request's
// other tracing work.
func parseTraceparent(v string) (parent, bool) {
	var p parent
	if len(v) < traceparentLen || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return p, false
	}
	head := v[:traceparentLen]
	if strings.Trim(head, hexAndDashes) != "" || strings.Count(head, "-") != 3 {
		return p, false
	}
	version := v[0:2]
	if version == "ff" {
		return p, false
	}
	// Version 00 is exactly 55 characters. A later version may append
	// fields after a dash; its first four are read as version 00's.
	if version == "00" && len(v) != traceparentLen {
		return p, false
	}
	if len(v) > traceparentLen && v[traceparentLen] != '-' {
		return p, false
	}
	traceID := v[3:35]
	spanID := v[36:52]
	if traceID == zeroTraceID || spanID == zeroSpanID {
		return p, false
	}
	p.traceID = traceID
	p.spanID = spanID
	p.sampled = hexDigit(v[54])&1 == 1
	return p, true
}

// isLowerHex reports whether s is made of 0-9 and a-f only.
func isLowerHex(s string) bool {
	return strings.Trim(s, "0123456789abcdef") == ""
}

// hexDigit is the value of a lower-case hex digit.
func hexDigit(c byte) byte {
	if c >= 'a' {
		return c - 'a' + 10
	}
	return c - '0'
}

// requestParent reads r's trace context: its one traceparent header and,
// when that is valid, its tracestate (header lines joined with commas, as
// HTTP allows a list header to be split). Several traceparent headers are
// invalid.
func requestParent(h http.Header) (parent, string, bool) {
	values := h["Traceparent"]
	if len(values) != 1 {
		return parent{}, "", false
	}
	p, ok := parseTraceparent(strings.TrimSpace(values[0]))
	if !ok {
		return p, "", false
	}
	state := h["Tracestate"]
	switch len(state) {
	case 0:
		return p, "", true
	case 1:
		return p, state[0], true
	}
	return p, strings.Join(state, ","), true
}

// newSpanID returns a random span id, 16 hex digits, never all zeros
// (W3C: an all-zero id is invalid).
func newSpanID() string {
	id := hex.EncodeToString(randomBytes(8))
	for id == zeroSpanID {
		id = hex.EncodeToString(randomBytes(8))
	}
	return id
}

// randomBytes returns n bytes from crypto/rand, compiled code and cheap
// under Yaegi.
func randomBytes(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		// crypto/rand does not fail on supported platforms (recent Go
		// crashes instead); a constant keeps the ids well formed.
		b[n-1] = 1
	}
	return b
}
