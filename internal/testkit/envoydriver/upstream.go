package envoydriver

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
)

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
