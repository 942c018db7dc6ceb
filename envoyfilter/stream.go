package envoyfilter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/llmhedge/llmhedge/core"
)

// streamState is where an ext_proc stream is in its life.
type streamState int

const (
	// awaitingHeaders: nothing received yet.
	awaitingHeaders streamState = iota
	// hedging: a handler runs core for this request. Request body chunks
	// feed its body and are never answered.
	hedging
	// awaitingBufferedBody: buffered mode; the headers were continued and
	// the one request_body message with the whole body is due.
	awaitingBufferedBody
	// passingThrough: the request is not ours; every message is answered
	// with "continue, unchanged".
	passingThrough
)

// Stream kinds, the label of llm_hedge_extproc_streams_total.
const (
	kindHedged      = "hedged"
	kindPassthrough = "passthrough"
	kindError       = "error"
	kindEmpty       = "empty" // ended before request_headers
	kindObserve     = "observability"
)

// processStream is the state machine of one ext_proc stream (one HTTP
// request). Its run goroutine owns every field; a receive goroutine feeds
// it messages, a sender goroutine owns stream.Send, and a handler goroutine
// runs core when the request is hedged.
type processStream struct {
	s      *Server
	stream extprocv3.ExternalProcessor_ProcessServer
	ctx    context.Context
	out    *sender
	cfg    *settings
	state  streamState
	kind   string

	// Body modes of the filter: from protocol_config on the first message,
	// else the configured fallback.
	requestMode, responseMode filterv3.ProcessingMode_BodySendMode

	// While hedging.
	body        *bodyPipe          // the streamed request body, nil without one
	cancel      context.CancelFunc // cancels the handler's request
	handlerDone chan error         // receives the handler's result; nil once read

	// Buffered mode: the request waiting for its body.
	pendingRoute *route
	pendingHead  *requestHead
}

func newProcessStream(s *Server, stream extprocv3.ExternalProcessor_ProcessServer) *processStream {
	return &processStream{s: s, stream: stream, ctx: stream.Context(), kind: kindEmpty}
}

// errCloseStream ends a stream cleanly (status OK) from the state machine.
var errCloseStream = errors.New("close stream")

// run serves the stream until it ends and returns its gRPC status.
func (p *processStream) run() error {
	msgs := make(chan *extprocv3.ProcessingRequest)
	// handled returns each message's verdict to the receive goroutine: the
	// body pipe that must have room before the next Recv (nil: none). Not
	// calling Recv is the back-pressure: gRPC flow control then stops
	// Envoy, and a stream holds at most one message beyond the pipe.
	handled := make(chan *bodyPipe, 1)
	recvErr := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			m, err := p.stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-stop:
				return
			}
			var pipe *bodyPipe
			select {
			case pipe = <-handled:
			case <-stop:
				return
			}
			if pipe != nil {
				pipe.waitRoom(stop)
			}
		}
	}()
	p.out = newSender(p.stream)
	err := p.safeLoop(msgs, handled, recvErr)
	// The handler goes first: it may still queue its last messages.
	p.stopHandler()
	if serr := p.out.close(); serr != nil {
		p.s.log.Debug("ext_proc stream closed while sending", zap.Error(serr))
	}
	if errors.Is(err, errCloseStream) {
		return nil
	}
	return err
}

// safeLoop runs the loop; a bug that panics fails this stream with
// Internal instead of taking the whole server (and every other request)
// down: gRPC does not recover handler panics.
func (p *processStream) safeLoop(msgs <-chan *extprocv3.ProcessingRequest, handled chan<- *bodyPipe,
	recvErr <-chan error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			p.s.log.Error("panic in an ext_proc stream", zap.Any("panic", v), zap.ByteString("stack", debug.Stack()))
			p.kind = kindError
			err = status.Errorf(codes.Internal, "internal error: %v", v)
		}
	}()
	return p.loop(msgs, handled, recvErr)
}

func (p *processStream) loop(msgs <-chan *extprocv3.ProcessingRequest, handled chan<- *bodyPipe,
	recvErr <-chan error) error {
	for {
		select {
		case m := <-msgs:
			if err := p.handle(m); err != nil {
				return err
			}
			handled <- p.body // never blocks: one message is out at a time
		case err := <-recvErr:
			return p.recvEnded(err)
		case err := <-p.handlerDone:
			p.handlerDone = nil
			return p.handlerEnded(err)
		}
	}
}

// recvEnded: Envoy half-closed or reset the stream. Envoy announces
// nothing else when the client goes away (it half-closes, then resets after
// its remote close timeout), so a request still being hedged is cancelled:
// core then cancels every attempt.
func (p *processStream) recvEnded(err error) error {
	// Cancel before the body ends: core must see a client that left, not a
	// truncated body it would answer with 400.
	if p.cancel != nil {
		p.cancel()
	}
	if p.body != nil {
		p.body.finish(io.ErrUnexpectedEOF)
	}
	if p.handlerDone != nil {
		p.s.log.Debug("ext_proc stream ended before the answer; cancelling the request", zap.Error(err))
	}
	return errCloseStream
}

// handlerEnded: the hedged answer is complete (or failed).
func (p *processStream) handlerEnded(err error) error {
	switch {
	case err == nil:
		return errCloseStream
	case errors.Is(err, errUpstreamAborted):
		// A gRPC error after the local response started makes Envoy reset
		// the client's stream: the answer ends abruptly, never spliced.
		return status.Error(codes.Unavailable, err.Error())
	default:
		p.kind = kindError
		return status.Error(codes.Internal, err.Error())
	}
}

// stopHandler cancels a handler still running and waits for it.
func (p *processStream) stopHandler() {
	if p.body != nil {
		p.body.finish(context.Canceled)
	}
	if p.cancel != nil {
		p.cancel()
	}
	if p.handlerDone != nil {
		<-p.handlerDone //nolint:errcheck // only waiting for the handler to end: its result is not needed here
		p.handlerDone = nil
	}
}

// protocolError fails the stream because Envoy (or whatever speaks to us)
// broke the ext_proc protocol. Envoy answers the client status_on_error
// (500) before the response started, resets it after.
func (p *processStream) protocolError(code codes.Code, format string, args ...interface{}) error {
	p.kind = kindError
	err := status.Errorf(code, format, args...)
	p.s.log.Warn("ext_proc protocol error", zap.Error(err))
	return err
}

// handle processes one message from Envoy.
func (p *processStream) handle(m *extprocv3.ProcessingRequest) error {
	if m.GetObservabilityMode() {
		// The filter ignores every reply in observability mode: hedging is
		// impossible. Closing tells Envoy no more messages are needed.
		p.kind = kindObserve
		return errCloseStream
	}
	switch req := m.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if p.state != awaitingHeaders {
			return p.protocolError(codes.FailedPrecondition, "request_headers received twice")
		}
		return p.onRequestHeaders(m, req.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return p.onRequestBody(req.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return p.onRequestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders, *extprocv3.ProcessingRequest_ResponseBody,
		*extprocv3.ProcessingRequest_ResponseTrailers:
		if p.state == awaitingHeaders {
			// The filter skips request headers for this request: it is
			// not ours.
			p.readProtocolConfig(m)
			p.state, p.kind = passingThrough, kindPassthrough
		}
		if p.state != passingThrough {
			return p.protocolError(codes.FailedPrecondition, "%s received while the request is being answered here", messageName(m))
		}
		return p.continueResponsePath(m)
	case nil:
		return p.protocolError(codes.InvalidArgument, "ProcessingRequest carries no request")
	default:
		return p.protocolError(codes.InvalidArgument, "unknown ProcessingRequest %T", req)
	}
}

// readProtocolConfig takes the body modes from the first message, else
// from the configuration. Envoy sends protocol_config only on the first
// message of a stream (ext_proc.cc encodeProtocolConfig).
func (p *processStream) readProtocolConfig(m *extprocv3.ProcessingRequest) {
	if p.cfg == nil {
		p.cfg = p.s.current.Load()
	}
	if pc := m.GetProtocolConfig(); pc != nil {
		p.requestMode, p.responseMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		return
	}
	p.requestMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if p.cfg.envoy.RequestBodyMode == BodyModeBuffered {
		p.requestMode = filterv3.ProcessingMode_BUFFERED
	}
	p.responseMode = filterv3.ProcessingMode_NONE
}

// drainsBody reports whether the filter hands the request body to us and
// forgets it (FULL_DUPLEX_STREAMED and GRPC modes drain the data,
// ext_proc.cc handleDataStreamedModeBase): then only our replies can carry
// it on, and a clean close would lose the chunks already sent.
func drainsBody(mode filterv3.ProcessingMode_BodySendMode) bool {
	return mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED || mode == filterv3.ProcessingMode_GRPC
}

func (p *processStream) onRequestHeaders(m *extprocv3.ProcessingRequest, msg *extprocv3.HttpHeaders) error {
	head, err := parseRequestHead(msg)
	if err != nil {
		return p.protocolError(codes.InvalidArgument, "request_headers: %v", err)
	}
	p.readProtocolConfig(m)
	hasBody := !head.noBody
	if !head.originForm() {
		return p.passThrough(hasBody)
	}
	r := p.cfg.table.match(head)
	if r == nil {
		return p.passThrough(hasBody)
	}
	switch {
	case !hasBody:
		return p.startHandler(r, head, nil)
	case p.requestMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		p.body = newBodyPipe()
		return p.startHandler(r, head, p.body)
	case p.requestMode == filterv3.ProcessingMode_BUFFERED:
		// Envoy buffers the body until the headers are answered, then sends
		// it whole in one request_body (processor_state.cc
		// handleHeaderContinue). The race starts when it arrives.
		p.state, p.kind = awaitingBufferedBody, kindHedged
		p.pendingRoute, p.pendingHead = r, head
		return p.send(continueHeaders(true))
	default:
		p.s.log.Warn("route matched, but the filter's request_body_mode does not give this server the request body; continuing untouched",
			zap.String("route", r.name), zap.String("request_body_mode", p.requestMode.String()))
		return p.passThrough(true)
	}
}

// passThrough lets Envoy continue a request this server does not hedge.
// When the body mode sends the body here, every message of it is answered
// "continue"; otherwise nothing but the headers has reached us and Envoy
// holds the rest: a clean close lets Envoy continue the request untouched
// (ext_proc.cc onGrpcCloseWithStatus → clearAsyncState), and ends our part
// at the cost of one message each way.
func (p *processStream) passThrough(hasBody bool) error {
	p.kind = kindPassthrough
	if hasBody && drainsBody(p.requestMode) {
		p.state = passingThrough
		return p.send(continueHeaders(true))
	}
	return errCloseStream
}

// extendMessageTimer asks Envoy for more time before the reply it waits
// for: outside FULL_DUPLEX_STREAMED every message re-arms message_timeout
// (processor_state.cc onStartProcessorCall), 200ms by default, far shorter
// than a race. Envoy honours one override per message and caps it at the
// filter's max_message_timeout (ext_proc.cc onNewTimeout).
func (p *processStream) extendMessageTimer() error {
	d := time.Duration(*p.cfg.envoy.OverrideMessageTimeout)
	if d <= 0 {
		return nil
	}
	return p.send(&extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(d)})
}

func (p *processStream) onRequestBody(b *extprocv3.HttpBody) error {
	switch p.state {
	case awaitingHeaders:
		return p.protocolError(codes.FailedPrecondition, "request_body before request_headers")
	case passingThrough:
		return p.continueBody(true, b, p.requestMode)
	case awaitingBufferedBody:
		return p.startHandler(p.pendingRoute, p.pendingHead, io.NopCloser(bytes.NewReader(b.GetBody())))
	default: // hedging
		// Never answered: the reply owed to request_headers is the local
		// response, and once it started Envoy counts a body reply as
		// spurious (processor_state.cc isValidBodyCallbackState). Envoy
		// keeps sending the rest of the body after the answer started;
		// the pipe drops what nobody reads any more.
		if p.body != nil {
			p.body.write(b.GetBody())
			if b.GetEndOfStream() {
				p.body.finish(nil)
			}
		}
		return nil
	}
}

func (p *processStream) onRequestTrailers() error {
	switch p.state {
	case awaitingHeaders:
		return p.protocolError(codes.FailedPrecondition, "request_trailers before request_headers")
	case passingThrough:
		return p.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}})
	case awaitingBufferedBody:
		// Trailers without a body message: the body is empty.
		return p.startHandler(p.pendingRoute, p.pendingHead, nil)
	default: // hedging: the trailers end the body (request_trailer_mode SEND).
		if p.body != nil {
			p.body.finish(nil)
		}
		return nil
	}
}

// continueResponsePath answers response-path messages of a request that is
// not ours: unchanged.
func (p *processStream) continueResponsePath(m *extprocv3.ProcessingRequest) error {
	switch req := m.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return p.send(continueHeaders(false))
	case *extprocv3.ProcessingRequest_ResponseBody:
		return p.continueBody(false, req.ResponseBody, p.responseMode)
	default:
		return p.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
}

// startHandler runs core for the request in its own goroutine, first
// asking Envoy for time where its message timer runs (every mode that
// does not stream the body to us).
func (p *processStream) startHandler(r *route, head *requestHead, body io.ReadCloser) error {
	if !drainsBody(p.requestMode) {
		if err := p.extendMessageTimer(); err != nil {
			return err
		}
	}
	req, err := head.newRequest(body)
	if err != nil {
		return p.protocolError(codes.InvalidArgument, "request_headers: %v", err)
	}
	ctx, cancel := context.WithCancel(p.ctx)
	req = req.WithContext(ctx)
	env := p.cfg.envoy
	// StreamedImmediateResponse is accepted only in NONE or
	// FULL_DUPLEX_STREAMED body mode (processor_state.cc startLocalResponse).
	canStream := *env.StreamedImmediateResponse && (p.requestMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED ||
		p.requestMode == filterv3.ProcessingMode_NONE)
	w := newReplyWriter(ctx, p.out, canStream, int(env.MaxImmediateResponse), int(env.BodyChunk))
	if !canStream {
		// A buffered answer goes out whole, when the handler returns: early
		// headers would only turn a failure's status into a 200.
		req = core.WithoutEarlyHeaders(req)
	}
	done := make(chan error, 1)
	p.state, p.kind, p.cancel, p.handlerDone = hedging, kindHedged, cancel, done
	log := p.s.log
	go func() {
		var err error
		defer func() {
			if v := recover(); v != nil {
				log.Error("panic while hedging a request", zap.Any("panic", v), zap.ByteString("stack", debug.Stack()))
				err = fmt.Errorf("internal error: %v", v)
			}
			if body != nil {
				body.Close()
			}
			done <- err
		}()
		herr := r.hedger.Handle(w, req)
		if errors.Is(w.err, errAnswerTooLarge) {
			log.Warn("answer larger than envoy.max_immediate_response; answered 502", zap.String("route", r.name))
		}
		err = w.finish(errors.Is(herr, core.ErrStreamAborted))
	}()
	return nil
}

// send queues a reply from the receive loop.
func (p *processStream) send(msg *extprocv3.ProcessingResponse) error {
	if err := p.out.send(p.ctx, msg); err != nil {
		return errCloseStream // the stream is gone
	}
	return nil
}

// continueHeaders answers request or response headers: continue unchanged.
func continueHeaders(request bool) *extprocv3.ProcessingResponse {
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{}}}
}

// echoChunk is the largest piece of a body chunk echoed back in one
// streamed_response: a chunk as large as grpc.max_recv_msg_size goes back
// in pieces, so that the reply queue's byte bound holds (FULL_DUPLEX_STREAMED
// lets the server answer with any number of body messages).
const echoChunk = DefaultBodyChunk

// continueBody answers a body chunk unchanged. In the draining modes the
// chunk itself must come back as streamed_response, or it is lost
// (processor_state.cc handleDuplexStreamedBodyResponse), in pieces of at
// most echoChunk; otherwise an empty reply keeps the chunk Envoy holds.
func (p *processStream) continueBody(request bool, b *extprocv3.HttpBody, mode filterv3.ProcessingMode_BodySendMode) error {
	if !drainsBody(mode) {
		return p.send(bodyReply(request, &extprocv3.BodyResponse{}))
	}
	body := b.GetBody()
	for {
		piece := body
		if len(piece) > echoChunk {
			piece = body[:echoChunk:echoChunk]
		}
		body = body[len(piece):]
		last := len(body) == 0
		err := p.send(bodyReply(request, &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
			BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: piece, EndOfStream: last && b.GetEndOfStream()}}}}}))
		if err != nil || last {
			return err
		}
	}
}

func bodyReply(request bool, resp *extprocv3.BodyResponse) *extprocv3.ProcessingResponse {
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: resp}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: resp}}
}

// messageName names the request case of m for errors and logs.
func messageName(m *extprocv3.ProcessingRequest) string {
	switch m.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return "request_headers"
	case *extprocv3.ProcessingRequest_RequestBody:
		return "request_body"
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return "request_trailers"
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return "response_headers"
	case *extprocv3.ProcessingRequest_ResponseBody:
		return "response_body"
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return "response_trailers"
	}
	return "empty message"
}
