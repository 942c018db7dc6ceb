package core

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
)

// errorBody is the OpenAI error shape every error of ours uses.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// The types of the errors the engine writes: a request refused before any
// upstream was tried, and no attempt won (the message names the upstream
// by its configured name only).
const (
	errTypeInvalidRequest = "invalid_request_error"
	errTypeUpstream       = "upstream_error"
)

// writeJSONError answers with an OpenAI-shaped JSON error.
func writeJSONError(w http.ResponseWriter, status int, typ, code, message string) {
	body, _ := json.Marshal(errorBody{Error: errorDetail{Message: message, Type: typ, Code: code}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// upstreamMessage is the client's short account of a failed attempt: no
// host, address or URL, which only the report (redacted) carries.
func upstreamMessage(h *Hedger, a *attempt) string {
	name := h.publicNames[a.upstream]
	switch a.code {
	case codeUpstreamUnreachable:
		return name + " could not be reached"
	case codeUpstreamTimeout:
		return name + " did not answer in time"
	case codeUpstreamBadResponse:
		return name + " failed before its first output"
	}
	return name + " answered " + strconv.Itoa(a.status)
}

// writeStreamErrorEvent ends an SSE answer that failed after commit.
func writeStreamErrorEvent(w http.ResponseWriter, message string) {
	body, _ := json.Marshal(errorBody{Error: errorDetail{Message: message, Type: "llmhedge_error", Code: "stream_failed"}})
	w.Write([]byte("event: error\ndata: " + string(body) + "\n\n"))
}

func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		dst[k] = append([]string(nil), vv...)
	}
}

// Under Yaegi v0.16.1 a type assertion sees a writer's Flush only through
// an interface of the writer's own kind: http.Flusher (compiled) for
// Traefik's compiled writers, flusher (declared here, interpreted) for our
// own wrappers, which lose Flush when handed to compiled code such as
// http.NewResponseController. Compiled, the first match wins.
type flusher interface{ Flush() }

type flushErrorer interface{ FlushError() error }

func flush(w http.ResponseWriter) { flusherFor(w)() }

// flusherFor returns the function that flushes w.
func flusherFor(w http.ResponseWriter) func() {
	if f, ok := w.(http.Flusher); ok {
		return func() { f.Flush() }
	}
	if f, ok := w.(flushErrorer); ok {
		return func() { _ = f.FlushError() } // a client gone shows in the next write
	}
	if f, ok := w.(flusher); ok {
		return f.Flush
	}
	if fw, ok := w.(*flightWriter); ok {
		// Under Yaegi the assertion to flusher fails on the idempotency
		// leader's writer once it has been passed as an
		// http.ResponseWriter; its concrete type is still seen.
		return func() { fw.Flush() }
	}
	rc := http.NewResponseController(w)
	return func() { rc.Flush() }
}

// Read buffers are pooled: each attempt reads its undecided bytes (its
// prefix) into one and the winner is delivered through another, and
// garbage is a large share of the cost under Yaegi.
var buffers = sync.Pool{New: func() interface{} { return make([]byte, bufferSize) }}

const bufferSize = 32 << 10

// putBuffer returns b to the pool if it is one of the pool's buffers (a
// prefix that outgrew its buffer is not).
func putBuffer(b []byte) {
	if cap(b) == bufferSize {
		buffers.Put(b[:bufferSize]) //nolint:staticcheck // a slice header is small
	}
}

// tailSize is how much of the end of a streamed answer is kept to recognise
// its end marker.
const tailSize = 256

// tailCompactAt is how long the delivered tail may grow before it is cut
// back to tailSize: cutting after every read costs a call each under Yaegi.
const tailCompactAt = 8 << 10

// keepTail appends p to tail and keeps the last tailSize bytes.
func keepTail(tail, p []byte) []byte {
	if len(p) >= tailSize {
		return append(tail[:0], p[len(p)-tailSize:]...)
	}
	tail = append(tail, p...)
	if len(tail) > tailSize {
		tail = append(tail[:0], tail[len(tail)-tailSize:]...)
	}
	return tail
}
