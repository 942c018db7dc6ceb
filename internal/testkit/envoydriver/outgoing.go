package envoydriver

import (
	"errors"
	"io"
	"net/http"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

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
