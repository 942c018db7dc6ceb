package envoydriver

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

func (x *exchange) onRecv(ev event) {
	if ev.err != nil {
		x.recvEnded = true
		if errors.Is(ev.err, io.EOF) {
			x.onServerClose()
		} else {
			x.onGRPCError()
		}
		return
	}
	if x.phase == finished || x.complete || x.streamReset {
		return // processing complete: ignored (ext_proc.cc onReceiveMessage)
	}
	m := ev.msg
	if m.GetOverrideMessageTimeout() != nil {
		x.onOverride(m.GetOverrideMessageTimeout().AsDuration())
		return // the rest of the message is ignored
	}
	switch resp := m.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		x.onHeadersReply(resp.RequestHeaders)
	case *extprocv3.ProcessingResponse_RequestBody:
		x.onBodyReply(resp.RequestBody)
	case *extprocv3.ProcessingResponse_RequestTrailers:
		if x.phase != continued || x.d.cfg.Mode != FullDuplex {
			x.spurious()
			return
		}
		x.upstreamBody.end(nil)
		x.processingComplete()
	case *extprocv3.ProcessingResponse_StreamedImmediateResponse:
		x.onStreamed(resp.StreamedImmediateResponse)
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		x.onImmediate(resp.ImmediateResponse)
	default:
		x.spurious() // includes response-path replies: those modes are SKIP/NONE
	}
}

// onHeadersReply continues the request (CONTINUE, with header mutations).
func (x *exchange) onHeadersReply(h *extprocv3.HeadersResponse) {
	if x.phase != awaitingHeaders {
		x.spurious()
		return
	}
	common := h.GetResponse()
	if common.GetStatus() == extprocv3.CommonResponse_CONTINUE_AND_REPLACE {
		x.spurious() // not reproduced
		return
	}
	if mut := common.GetHeaderMutation(); mut != nil {
		applyMutation(x.header, &x.path, mut)
	}
	x.stopTimer()
	if x.d.cfg.Mode == Buffered && x.hasBody {
		x.phase = awaitingBody
		if x.bodyReady {
			x.sendBufferedBody()
		}
		return
	}
	if !x.hasBody {
		x.startUpstream(nil)
		x.processingComplete()
		return
	}
	body := newChunkReader()
	x.mu.Lock()
	x.upstreamBody = body
	x.mu.Unlock()
	x.startUpstream(body)
}

// onBodyReply handles a request body reply.
func (x *exchange) onBodyReply(b *extprocv3.BodyResponse) {
	mut := b.GetResponse().GetBodyMutation()
	switch {
	case x.d.cfg.Mode == Buffered && x.phase == awaitingBody:
		x.stopTimer()
		body := x.bufBody
		switch m := mut.GetMutation().(type) {
		case *extprocv3.BodyMutation_Body:
			body = m.Body
		case *extprocv3.BodyMutation_ClearBody:
			if m.ClearBody {
				body = nil
			}
		}
		if hm := b.GetResponse().GetHeaderMutation(); hm != nil {
			applyMutation(x.header, &x.path, hm)
		}
		x.header.Del("Content-Length")
		r := newChunkReader()
		r.push(body)
		r.end(nil)
		x.startUpstream(r)
		x.processingComplete()
	case x.d.cfg.Mode == FullDuplex && x.phase == continued && mut.GetStreamedResponse() != nil:
		sr := mut.GetStreamedResponse()
		x.upstreamBody.push(sr.GetBody())
		if sr.GetEndOfStream() {
			x.upstreamBody.end(nil)
			x.processingComplete()
		}
	default:
		// Before the headers reply, after a local response started, or a
		// plain body mutation in FULL_DUPLEX_STREAMED mode: spurious
		// (processor_state.cc handleBodyResponse, isValidBodyCallbackState).
		x.spurious()
	}
}

// onStreamed handles a StreamedImmediateResponse message.
func (x *exchange) onStreamed(s *extprocv3.StreamedImmediateResponse) {
	switch part := s.GetResponse().(type) {
	case *extprocv3.StreamedImmediateResponse_HeadersResponse:
		if x.phase != awaitingHeaders {
			x.spurious()
			return
		}
		eos := part.HeadersResponse.GetEndOfStream()
		if !eos && x.d.cfg.Mode == Buffered {
			// "streaming local response body is only supported in NONE or
			// FULL_DUPLEX_STREAMED modes" (processor_state.cc).
			x.spurious()
			return
		}
		status, header, ok := localHeaders(part.HeadersResponse.GetHeaders())
		if !ok {
			x.errorAfterMutation()
			return
		}
		x.stopTimer()
		x.phase = localStarted
		x.localStarted.Store(true)
		x.d.streamedImmediate.Add(1)
		copyHeader(x.w.Header(), header)
		x.w.WriteHeader(status)
		x.dirty = true
		if eos {
			x.finish()
		}
	case *extprocv3.StreamedImmediateResponse_BodyResponse:
		if x.phase != localStarted {
			x.spurious() // "local response body received before headers"
			return
		}
		body := part.BodyResponse
		if len(body.GetBody()) > 0 {
			if _, err := x.w.Write(body.GetBody()); err != nil {
				x.phase = finished
				return
			}
			x.dirty = true
		}
		if body.GetEndOfStream() {
			x.finish()
		}
	case *extprocv3.StreamedImmediateResponse_TrailersResponse:
		if x.phase != localStarted {
			x.spurious()
			return
		}
		for _, h := range part.TrailersResponse.GetHeaders() {
			x.w.Header().Add(http.TrailerPrefix+h.GetKey(), headerValue(h))
		}
		x.finish()
	default:
		// "Invalid local response headers continue": an InvalidArgument
		// status, answered like any processing error.
		x.errorAfterMutation()
	}
}

// onImmediate answers the client with a local reply.
func (x *exchange) onImmediate(ir *extprocv3.ImmediateResponse) {
	if x.phase == localStarted {
		// sendLocalReply after the response started resets the stream.
		x.abort = true
		x.d.immediate.Add(1)
		x.finish()
		return
	}
	if x.phase == continued {
		// Not reproduced: the request is already upstream.
		x.spurious()
		return
	}
	x.d.immediate.Add(1)
	status := int(ir.GetStatus().GetCode())
	if ir.GetStatus() == nil || status < 200 {
		status = http.StatusOK // DefaultImmediateStatus, isValidHttpStatus
	}
	x.localReply(status, ir.GetHeaders(), ir.GetBody())
}

// localReply writes a complete local response, as sendLocalReply does.
func (x *exchange) localReply(status int, mut *extprocv3.HeaderMutation, body []byte) {
	x.stopTimer()
	h := x.w.Header()
	if len(body) > 0 {
		h.Set("Content-Type", "text/plain")
	}
	if mut != nil {
		path := ""
		applyMutation(h, &path, mut)
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	x.w.WriteHeader(status)
	x.w.Write(body)
	x.finish()
}

// spurious: a reply out of order. Envoy answers status_on_error before the
// response started and resets it after (failure_mode_allow is false).
func (x *exchange) spurious() {
	x.d.spurious.Add(1)
	x.errorAfterMutation()
}

// errorAfterMutation is handleErrorResponse: an error reply (or a reset
// once the response started), and the stream is closed.
func (x *exchange) errorAfterMutation() {
	x.fail()
	x.reset()
}

// onGRPCError: the server failed the stream.
func (x *exchange) onGRPCError() {
	if x.phase == finished || x.complete || x.streamReset {
		return
	}
	x.d.grpcErrors.Add(1)
	x.fail()
}

// fail answers status_on_error, or resets a started response.
func (x *exchange) fail() {
	switch x.phase {
	case localStarted:
		x.abort = true
		x.finish()
	case continued:
		if x.upCancel != nil {
			x.upCancel()
		}
		if x.upstreamBody != nil {
			x.upstreamBody.end(errors.New("ext_proc stream failed"))
		}
	case finished:
	default:
		x.errorReply()
	}
}

func (x *exchange) errorReply() {
	x.d.errorReplies.Add(1)
	x.w.Header().Set("Content-Type", "text/plain")
	x.w.WriteHeader(x.d.cfg.StatusOnError)
	x.w.Write([]byte("ext_proc_error"))
	x.phase = finished
}

// onServerClose: the server ended the stream with status OK.
func (x *exchange) onServerClose() {
	switch {
	case x.complete:
	case x.phase == awaitingHeaders || x.phase == awaitingBody:
		// Processing is complete and the request continues untouched
		// (ext_proc.cc onGrpcCloseWithStatus, clearAsyncState). In
		// FULL_DUPLEX_STREAMED mode the chunks already sent were drained
		// from the proxy: they are lost.
		x.d.closedBeforeHeaders.Add(1)
		x.processingComplete()
		x.continueDirect()
	case x.phase == continued:
		// Later chunks flow straight upstream; those the server did not
		// give back are lost.
		x.processingComplete()
		x.mu.Lock()
		if x.upstreamBody != nil {
			x.route = toUpstream
			if x.bodyDone {
				x.upstreamBody.end(nil)
			}
		}
		x.mu.Unlock()
	case x.phase == localStarted:
		// Envoy would leave the started response open; see the package doc.
		x.d.spurious.Add(1)
		x.abort = true
		x.finish()
	}
}

// continueDirect sends the request upstream with the body the server did
// not receive.
func (x *exchange) continueDirect() {
	if !x.hasBody {
		x.startUpstream(nil)
		return
	}
	body := newChunkReader()
	x.mu.Lock()
	x.upstreamBody = body
	if x.d.cfg.Mode == Buffered {
		// Envoy held the whole body: nothing is lost.
		if x.bodyReady {
			body.push(x.bufBody)
			body.end(nil)
		} else {
			x.bufferedDirect = true
		}
	} else {
		if x.sentBytes > 0 {
			x.d.lostBodyBytes.Add(x.sentBytes)
		}
		x.route = toUpstream
		if x.bodyDone {
			body.end(nil)
		}
	}
	x.mu.Unlock()
	x.startUpstream(body)
}

// processingComplete: nothing more goes to the server on this request.
func (x *exchange) processingComplete() {
	x.complete = true
	x.stopTimer()
}

// finish ends the client's response (local paths).
func (x *exchange) finish() {
	x.phase = finished
	x.stopTimer()
}
