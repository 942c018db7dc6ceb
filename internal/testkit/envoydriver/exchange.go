package envoydriver

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

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

// message_timeout (Buffered mode).

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
