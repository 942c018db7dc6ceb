package envoyfilter

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// errAnswerTooLarge is a write failure: a buffered answer outgrew
// envoy.max_immediate_response and cannot be streamed.
var errAnswerTooLarge = errors.New("llmhedge: answer larger than envoy.max_immediate_response")

// replyWriter is the http.ResponseWriter core writes the winner to; it
// turns the answer into ext_proc replies.
//
// A streaming answer (SSE, NDJSON) becomes a StreamedImmediateResponse: a
// headers_response with :status as soon as core commits (that is the reply
// owed to request_headers, which Envoy lets us hold in
// FULL_DUPLEX_STREAMED mode because that mode runs no message timer:
// processor_state.cc onStartProcessorCall), then body_response chunks on
// every Flush, and end_of_stream when the handler returns. Anything else is
// collected and sent as one ImmediateResponse, which Envoy accepts in any
// state; when it outgrows maxImmediate it is streamed after all (if
// streaming is allowed).
//
// Only the handler goroutine uses a replyWriter.
type replyWriter struct {
	ctx          context.Context
	out          *sender
	header       http.Header
	canStream    bool // StreamedImmediateResponse is possible on this stream
	maxImmediate int
	chunk        int

	status   int
	started  bool // headers_response sent: the local response has started
	pending  []byte
	finished bool
	err      error // sticky: writes fail once a send failed
}

func newReplyWriter(ctx context.Context, out *sender, canStream bool, maxImmediate, chunk int) *replyWriter {
	return &replyWriter{ctx: ctx, out: out, header: make(http.Header), canStream: canStream,
		maxImmediate: maxImmediate, chunk: chunk}
}

// Header implements http.ResponseWriter.
func (w *replyWriter) Header() http.Header { return w.header }

// WriteHeader implements http.ResponseWriter. A streaming answer starts
// the local response at once: the client learns the winner's real status.
func (w *replyWriter) WriteHeader(status int) {
	if w.status != 0 || w.finished {
		return
	}
	if status < 200 {
		// Informational answers are not forwarded; the final one follows.
		return
	}
	w.status = status
	if w.canStream && isStreamingType(w.header.Get("Content-Type")) {
		w.start()
	}
}

// Write implements http.ResponseWriter.
func (w *replyWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	w.pending = append(w.pending, p...)
	switch {
	case w.started:
		if len(w.pending) >= w.chunk {
			w.sendBody(false)
		}
	case len(w.pending) > w.maxImmediate:
		if !w.canStream {
			w.err = errAnswerTooLarge
			return 0, w.err
		}
		w.start()
	}
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

// Flush sends what was written since the last flush (streamed answers
// only; an ImmediateResponse goes out whole).
func (w *replyWriter) Flush() { _ = w.FlushError() }

// FlushError is Flush reporting a failed send, for
// http.ResponseController.
func (w *replyWriter) FlushError() error {
	if w.err != nil {
		return w.err
	}
	if w.started && len(w.pending) > 0 {
		w.sendBody(false)
	}
	return w.err
}

// start sends the headers_response, then what is pending.
func (w *replyWriter) start() {
	w.started = true
	w.emit(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_StreamedImmediateResponse{
		StreamedImmediateResponse: &extprocv3.StreamedImmediateResponse{
			Response: &extprocv3.StreamedImmediateResponse_HeadersResponse{
				HeadersResponse: &extprocv3.HttpHeaders{Headers: streamedHeaders(w.status, w.header)},
			},
		},
	}})
	if len(w.pending) > 0 {
		w.sendBody(false)
	}
}

// sendBody sends pending as body_response chunks of at most w.chunk bytes;
// end marks the last one end_of_stream (an empty chunk if nothing is
// pending).
func (w *replyWriter) sendBody(end bool) {
	for {
		n := len(w.pending)
		if n > w.chunk {
			n = w.chunk
		}
		last := end && n == len(w.pending)
		if n == 0 && !last {
			return
		}
		var body []byte
		if n == len(w.pending) {
			// The message takes the buffer; the next Write starts a new one.
			body, w.pending = w.pending, nil
		} else {
			// No copy: Write only appends, past the end of what is sent.
			body = w.pending[:n:n]
			w.pending = w.pending[n:]
		}
		w.emit(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_StreamedImmediateResponse{
			StreamedImmediateResponse: &extprocv3.StreamedImmediateResponse{
				Response: &extprocv3.StreamedImmediateResponse_BodyResponse{
					BodyResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: last},
				},
			},
		}})
		if last || w.err != nil {
			return
		}
	}
}

func (w *replyWriter) emit(msg *extprocv3.ProcessingResponse) {
	if w.err != nil {
		return
	}
	if err := w.out.send(w.ctx, msg); err != nil {
		w.err = err
	}
}

// finish ends the answer when the handler returns. aborted means core
// reported a failure after the answer started: the client's response must
// end abruptly, which the caller does by failing the gRPC stream (Envoy
// then resets a started local response: ext_proc.cc onGrpcError and
// sendLocalReply after the response started). It returns that error, or
// nil.
func (w *replyWriter) finish(aborted bool) error {
	if w.finished {
		return nil
	}
	w.finished = true
	switch {
	case w.err != nil && !errors.Is(w.err, errAnswerTooLarge):
		return nil // the stream is gone; nobody to answer
	case w.started && aborted:
		return errUpstreamAborted
	case w.started:
		w.sendBody(true)
	case aborted && w.err == nil:
		// The upstream broke mid-body before anything was sent (a buffered
		// non-streaming answer): never send what arrived as a complete
		// answer.
		if w.canStream {
			// Start the answer, then fail the stream: Envoy resets the
			// client's response, which ends as abruptly as the upstream's.
			w.start()
			if w.err != nil {
				return nil
			}
			return errUpstreamAborted
		}
		w.sendError(http.StatusBadGateway, "upstream_aborted", "the upstream answer broke off before it was complete")
	case errors.Is(w.err, errAnswerTooLarge):
		w.err = nil
		w.sendError(http.StatusBadGateway, "answer_too_large", "the upstream answer is larger than envoy.max_immediate_response")
	case w.status == 0:
		// The handler wrote nothing: core only does that when the client
		// went away, and then there is nobody to answer.
	default:
		w.sendImmediate()
	}
	return nil
}

// sendError replaces the answer by an llmhedge error, as one
// ImmediateResponse.
func (w *replyWriter) sendError(status int, code, message string) {
	w.status = status
	w.header = http.Header{"Content-Type": {"application/json"}}
	w.pending = []byte(`{"error":{"message":"` + message + `","type":"llmhedge_error","code":"` + code + `"}}` + "\n")
	w.sendImmediate()
}

// sendImmediate sends the whole answer as one ImmediateResponse.
func (w *replyWriter) sendImmediate() {
	w.emit(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: immediateResponse(w.status, w.header, w.pending),
	}})
}

// immediateResponse builds an ImmediateResponse. Envoy turns a status below
// 200 into 200 (ext_proc.cc sendImmediateResponse), so callers pass a final
// status.
func immediateResponse(status int, h http.Header, body []byte) *extprocv3.ImmediateResponse {
	return &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
		Headers: immediateHeaders(h),
		Body:    body,
		Details: fmt.Sprintf("llmhedge_%d", status),
	}
}

// errUpstreamAborted fails the gRPC stream when the winner broke after its
// answer started.
var errUpstreamAborted = errors.New("upstream stream failed after the answer started")

// isStreamingType reports whether a Content-Type is a stream that must be
// forwarded as it comes: SSE and the line-delimited JSON family.
func isStreamingType(ct string) bool {
	ct = strings.ToLower(ct)
	return strings.HasPrefix(ct, "text/event-stream") || strings.Contains(ct, "ndjson") ||
		strings.Contains(ct, "jsonl") || strings.Contains(ct, "stream+json")
}
