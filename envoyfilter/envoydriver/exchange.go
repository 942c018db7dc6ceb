package envoydriver

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// phase is where the emulated filter is with one request.
type phase int

const (
	awaitingHeaders phase = iota // headers sent, their reply is due (HeadersCallback)
	awaitingBody                 // Buffered: headers continued, the body reply is due
	localStarted                 // a StreamedImmediateResponse started the client's response
	continued                    // the request went upstream
	finished                     // the client's response is complete (or abandoned)
)

// bodyRoute says where the client's body chunks go.
type bodyRoute int32

const (
	toServer   bodyRoute = iota // request_body messages
	toUpstream                  // straight to the upstream (processing complete)
	dropped                     // nowhere (the request is over)
)

type eventKind int

const (
	evRecv         eventKind = iota // a message or the end of the server's side
	evBodyDone                      // the client's body was read completely (or failed)
	evUpstreamDone                  // the continued request's response was copied
	evTimer                         // message_timeout expired
)

type event struct {
	kind     eventKind
	msg      *extprocv3.ProcessingResponse
	err      error
	body     []byte      // Buffered mode: the whole body
	trailers http.Header // the request's trailers, if any
	abort    bool        // evUpstreamDone: the copy broke after headers
	seq      int         // evTimer: which arming
}

// exchange is one request through the driver. Its run goroutine (the
// ServeHTTP goroutine) owns every field without a lock, except the body
// routing (shared with the pump) and w once the upstream goroutine owns it.
type exchange struct {
	d      *Driver
	w      http.ResponseWriter
	r      *http.Request
	ctx    context.Context // the gRPC stream's
	cancel context.CancelFunc
	stream extprocv3.ExternalProcessor_ProcessClient
	q      *sendQueue
	events chan event

	phase       phase
	abort       bool // reset the client's response
	recvEnded   bool // the server's side ended (status received)
	streamReset bool // the driver cancelled the stream
	complete    bool // processing complete: later replies are ignored
	hasBody     bool
	bodyDone    bool
	upstreamOn  bool
	// dirty: the client's response has unflushed bytes. Like Envoy, which
	// writes a connection's buffer once per event-loop iteration, the
	// driver flushes when no further event is already waiting.
	dirty bool

	// Request as sent to the server.
	header    http.Header
	authority string
	path      string

	// Body routing, shared with the pump.
	mu           sync.Mutex
	route        bodyRoute
	upstreamBody *chunkReader
	sentBytes    int64 // body bytes handed to the server (FullDuplex)
	localStarted atomic.Bool

	// Buffered mode.
	bufBody        []byte
	bufTrailers    http.Header
	bodyReady      bool
	bufferedDirect bool // the collected body goes straight upstream

	// message_timeout (Buffered mode).
	timer      *time.Timer
	timerSeq   int
	overridden bool

	upCancel context.CancelFunc
}

func newExchange(d *Driver, w http.ResponseWriter, r *http.Request) *exchange {
	return &exchange{d: d, w: w, r: r, events: make(chan event, 16)}
}

// run drives the request to its end. It reports whether the client's
// response must be reset.
func (x *exchange) run() bool {
	x.ctx, x.cancel = streamContext()
	stream, err := x.d.client.Process(x.ctx)
	if err != nil {
		x.cancel()
		x.d.grpcErrors.Add(1)
		x.errorReply()
		return false
	}
	x.stream = stream
	x.q = newSendQueue(stream)
	go x.receive()
	x.hasBody = x.r.Body != nil && x.r.Body != http.NoBody && x.r.ContentLength != 0
	x.q.push(x.headersMessage())
	x.armTimer()
	pumping := false
	if x.hasBody {
		pumping = true
		go x.pump()
	}
	clientGone := x.r.Context().Done()
	for x.phase != finished || x.upstreamOn {
		select {
		case ev := <-x.events:
			switch ev.kind {
			case evRecv:
				x.onRecv(ev)
			case evBodyDone:
				pumping = false
				x.onBodyDone(ev)
			case evUpstreamDone:
				x.upstreamOn = false
				x.abort = x.abort || ev.abort
				x.phase = finished
			case evTimer:
				if ev.seq == x.timerSeq && x.timer != nil {
					x.onMessageTimeout()
				}
			}
		case <-clientGone:
			clientGone = nil
			x.onClientGone()
		}
		if x.dirty && len(x.events) == 0 && x.phase == localStarted {
			flush(x.w)
			x.dirty = false
		}
	}
	if x.dirty {
		// Bytes already written go out before an abort (HTTP/2 sends DATA
		// frames queued before RST_STREAM in order).
		flush(x.w)
	}
	x.stopTimer()
	x.setRoute(dropped)
	for pumping {
		if ev := <-x.events; ev.kind == evBodyDone {
			pumping = false
		} else if ev.kind == evRecv && ev.err != nil {
			x.recvEnded = true
		}
	}
	x.closeStream()
	return x.abort
}

// receive forwards the server's messages, and the end of its side.
func (x *exchange) receive() {
	for {
		m, err := x.stream.Recv()
		x.events <- event{kind: evRecv, msg: m, err: err}
		if err != nil {
			return
		}
	}
}

// closeStream ends the gRPC stream the way Envoy does once processing is
// complete: half-close, then reset if the server has not closed it within
// RemoteCloseTimeout. It continues in the background.
func (x *exchange) closeStream() {
	if x.recvEnded {
		x.cancel()
		x.q.stop()
		return
	}
	if x.streamReset {
		x.cancel()
	} else {
		x.q.closeSend()
	}
	x.d.bg.Add(1)
	go func() {
		defer x.d.bg.Done()
		timer := time.NewTimer(x.d.cfg.RemoteCloseTimeout)
		defer timer.Stop()
		for ended := false; !ended; {
			select {
			case ev := <-x.events:
				// Replies after processing completed are ignored.
				ended = ev.kind == evRecv && ev.err != nil
			case <-timer.C:
				if !x.streamReset {
					x.d.serverCloseTimeouts.Add(1)
				}
				x.cancel()
				timer.Reset(time.Hour)
			}
		}
		x.cancel()
		x.q.stop()
	}()
}

// onClientGone: Envoy destroys the filter; the stream is closed (half-close
// and wait, or reset) and nothing more is written.
func (x *exchange) onClientGone() {
	if x.upCancel != nil {
		x.upCancel()
	}
	if x.phase == finished {
		return
	}
	x.phase = finished
	x.stopTimer()
	if x.d.cfg.ResetOnClientGone {
		x.reset()
	}
}

// ---- requests to the server ----

// headersMessage is request_headers as Envoy builds it: lower-case names,
// raw_value, pseudo-headers, connection-manager headers, protocol_config.
func (x *exchange) headersMessage() *extprocv3.ProcessingRequest {
	r := x.r
	x.header = r.Header.Clone()
	if x.header.Get("X-Forwarded-Proto") == "" {
		x.header.Set("X-Forwarded-Proto", "http")
	}
	if x.header.Get("X-Request-Id") == "" {
		x.header.Set("X-Request-Id", newRequestID())
	}
	x.authority, x.path = r.Host, r.URL.RequestURI()
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	msg := &extprocv3.HttpHeaders{Headers: toHeaderMap(
		[][2]string{{":authority", x.authority}, {":path", x.path}, {":method", r.Method}, {":scheme", scheme}}, x.header),
		EndOfStream: !x.hasBody}
	req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: msg}}
	if !x.d.cfg.OmitProtocolConfig {
		mode := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		if x.d.cfg.Mode == Buffered {
			mode = filterv3.ProcessingMode_BUFFERED
		}
		req.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: filterv3.ProcessingMode_NONE}
	}
	return req
}

func bodyMessage(chunk []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: eos}}}
}

func trailersMessage(t http.Header) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{Trailers: toHeaderMap(nil, t)}}}
}

// pump reads the client's body. In FullDuplex mode each chunk goes out at
// once (no waiting for the headers reply); in Buffered mode the body is
// collected and handed to the run loop.
func (x *exchange) pump() {
	size := x.d.cfg.ChunkSize
	if cl := x.r.ContentLength; cl > 0 && cl < int64(size) {
		size = int(cl) + 1 // +1: the read that reports EOF needs no second buffer
	}
	buf := make([]byte, size)
	var collected []byte
	remaining := x.r.ContentLength
	eosSent := false
	for {
		n, err := x.r.Body.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			if x.d.cfg.Mode == Buffered {
				collected = append(collected, chunk...)
			} else {
				if remaining > 0 {
					remaining -= int64(n)
				}
				// With a known length the last chunk carries end_of_stream,
				// as Envoy's codec delivers it.
				eos := remaining == 0 && x.r.ContentLength > 0
				x.deliver(chunk, eos)
				eosSent = eos
			}
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, io.EOF) {
			x.events <- event{kind: evBodyDone, err: err}
			return
		}
		trailers := trailersOf(x.r)
		if x.d.cfg.Mode == Buffered {
			x.events <- event{kind: evBodyDone, body: collected, trailers: trailers}
			return
		}
		switch {
		case len(trailers) > 0:
			x.deliverTrailers(trailers)
		case !eosSent:
			x.deliver(nil, true)
		}
		x.events <- event{kind: evBodyDone}
		return
	}
}

func trailersOf(r *http.Request) http.Header {
	t := http.Header{}
	for k, v := range r.Trailer {
		if len(v) > 0 {
			t[k] = v
		}
	}
	return t
}

// deliver routes one FullDuplex body chunk.
func (x *exchange) deliver(chunk []byte, eos bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch x.route {
	case toServer:
		if x.q.push(bodyMessage(chunk, eos)) {
			x.sentBytes += int64(len(chunk))
			if x.localStarted.Load() {
				x.d.bodyChunksAfterStart.Add(1)
			}
		}
	case toUpstream:
		x.upstreamBody.push(chunk)
		if eos {
			x.upstreamBody.end(nil)
		}
	}
}

func (x *exchange) deliverTrailers(t http.Header) {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch x.route {
	case toServer:
		x.q.push(trailersMessage(t))
	case toUpstream:
		x.upstreamBody.end(nil)
	}
}

func (x *exchange) setRoute(r bodyRoute) {
	x.mu.Lock()
	x.route = r
	if r == dropped && x.upstreamBody != nil {
		x.upstreamBody.end(nil)
	}
	x.mu.Unlock()
}

func (x *exchange) onBodyDone(ev event) {
	x.mu.Lock()
	x.bodyDone = true
	if x.route == toUpstream && x.upstreamBody != nil {
		x.upstreamBody.end(ev.err)
	}
	x.mu.Unlock()
	if ev.err != nil || x.d.cfg.Mode != Buffered {
		return // on an error the client is going away; onClientGone follows
	}
	x.bufBody, x.bufTrailers, x.bodyReady = ev.body, ev.trailers, true
	switch {
	case x.bufferedDirect:
		x.upstreamBody.push(ev.body)
		x.upstreamBody.end(nil)
	case x.phase == awaitingBody && !x.complete:
		x.sendBufferedBody()
	}
}

// sendBufferedBody sends the whole body in one message. With trailers the
// body goes out with end_of_stream false and no trailers message follows
// (request_trailer_mode SKIP): ext_proc.cc onTrailers.
func (x *exchange) sendBufferedBody() {
	x.q.push(bodyMessage(x.bufBody, len(x.bufTrailers) == 0))
	x.armTimer()
}

// ---- message_timeout ----

func (x *exchange) armTimer() {
	if x.d.cfg.Mode != Buffered {
		return // FULL_DUPLEX_STREAMED runs no timer (processor_state.cc onStartProcessorCall)
	}
	x.stopTimer()
	x.startTimer(x.d.cfg.MessageTimeout)
	x.overridden = false
}

func (x *exchange) startTimer(d time.Duration) {
	x.timerSeq++
	seq := x.timerSeq
	events := x.events
	x.timer = time.AfterFunc(d, func() {
		select {
		case events <- event{kind: evTimer, seq: seq}:
		default: // the exchange is over
		}
	})
}

func (x *exchange) stopTimer() {
	if x.timer != nil {
		x.timer.Stop()
		x.timer = nil
	}
}

func (x *exchange) onMessageTimeout() {
	x.timer = nil
	x.d.messageTimeouts.Add(1)
	x.localReply(http.StatusGatewayTimeout, nil, []byte("ext_proc_error_per-message_timeout_exceeded"))
	x.reset()
}

// reset cancels the gRPC stream (Envoy's closeStream on errors).
func (x *exchange) reset() {
	x.streamReset = true
	x.cancel()
}

// onOverride handles override_message_timeout: honoured once per message,
// when within [1ms, max_message_timeout] and a timer runs
// (ext_proc.cc onNewTimeout, processor_state.cc restartMessageTimer).
func (x *exchange) onOverride(d time.Duration) {
	if x.timer == nil || x.overridden || d < time.Millisecond || d > x.d.cfg.MaxMessageTimeout {
		x.d.overridesIgnored.Add(1)
		return
	}
	x.stopTimer()
	x.startTimer(d)
	x.overridden = true
	x.d.timeoutOverrides.Add(1)
}

// ---- replies from the server ----

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

// ---- the continue path ----

// startUpstream sends the request to the configured upstream; the upstream
// goroutine owns w from now on.
func (x *exchange) startUpstream(body io.Reader) {
	x.phase, x.upstreamOn = continued, true
	x.d.continued.Add(1)
	ctx, cancel := context.WithCancel(x.r.Context())
	x.upCancel = cancel
	header := x.header.Clone()
	method, url, host := x.r.Method, strings.TrimSuffix(x.d.cfg.Upstream, "/")+x.path, x.authority
	events := x.events
	go func() {
		defer cancel()
		if body == nil {
			body = http.NoBody
		}
		req, err := http.NewRequestWithContext(ctx, method, url, body)
		if err != nil {
			x.upstreamFailed(events, http.StatusBadGateway)
			return
		}
		req.Host, req.Header = host, header
		if body == http.NoBody {
			req.ContentLength = 0
		} else {
			req.ContentLength = -1
			req.Header.Del("Content-Length")
		}
		resp, err := x.d.cfg.Transport.RoundTrip(req)
		if err != nil {
			x.upstreamFailed(events, http.StatusServiceUnavailable)
			return
		}
		defer resp.Body.Close()
		copyHeader(x.w.Header(), resp.Header)
		x.w.WriteHeader(resp.StatusCode)
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				if _, werr := x.w.Write(buf[:n]); werr != nil {
					events <- event{kind: evUpstreamDone}
					return
				}
				flush(x.w)
			}
			if err != nil {
				events <- event{kind: evUpstreamDone, abort: !errors.Is(err, io.EOF)}
				return
			}
		}
	}()
}

// upstreamFailed answers like Envoy's router when the upstream cannot be
// reached.
func (x *exchange) upstreamFailed(events chan<- event, status int) {
	x.w.Header().Set("Content-Type", "text/plain")
	x.w.WriteHeader(status)
	x.w.Write([]byte("upstream connect error or disconnect/reset before headers"))
	events <- event{kind: evUpstreamDone}
}

func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		dst[k] = append(dst[k][:0:0], vv...)
	}
}

func flush(w http.ResponseWriter) { _ = http.NewResponseController(w).Flush() }
