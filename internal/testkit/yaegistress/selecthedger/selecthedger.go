// Package selecthedger is the naive first-token hedger of the Yaegi-safety
// issue: one goroutine per attempt, results over a channel, a select over a
// timer and the results, the winner streamed to the client. It is correct
// compiled and wrong under concurrent interpretation by Yaegi v0.16.1 (see
// probe.SelectTimerAndResult for why). The yaegistress tests run it through
// the same load as core to show that the harness catches that bug; nothing
// else may copy its shape.
package selecthedger

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"time"
)

// firstToken marks an OpenAI chat chunk that carries model output (the
// role-only preamble starts its delta with "role").
var firstToken = []byte(`"delta":{"content":"`)

// result is one attempt's outcome: a response whose first token has
// arrived (prefix holds every byte read so far), or an error.
type result struct {
	resp   *http.Response
	prefix []byte
	err    error
}

type hedger struct {
	upstreams [2]string
	delay     time.Duration
	transport http.RoundTripper
}

// New returns the hedger for upstreams a and b with a fixed delay.
func New(a, b string, delay time.Duration, transport http.RoundTripper) http.Handler {
	return &hedger{upstreams: [2]string{a, b}, delay: delay, transport: transport}
}

func (h *hedger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	results := make(chan result, 2)
	go h.attempt(ctx, 0, r, body, results)
	timer := time.NewTimer(h.delay)
	defer timer.Stop()
	started, pending := 1, 1
	for {
		select {
		case <-timer.C:
			if started == 1 {
				go h.attempt(ctx, 1, r, body, results)
				started++
				pending++
			}
		case res := <-results:
			pending--
			if res.err == nil {
				deliver(w, res)
				return
			}
			if pending == 0 {
				http.Error(w, res.err.Error(), http.StatusBadGateway)
				return
			}
		}
	}
}

// attempt sends the request to upstream up and reads until the first token.
func (h *hedger) attempt(ctx context.Context, up int, r *http.Request, body []byte, results chan<- result) {
	req, err := http.NewRequestWithContext(ctx, r.Method, h.upstreams[up]+r.URL.Path, bytes.NewReader(body))
	if err != nil {
		results <- result{err: err}
		return
	}
	req.Header = r.Header.Clone()
	resp, err := h.transport.RoundTrip(req)
	if err != nil {
		results <- result{err: err}
		return
	}
	buf := make([]byte, 4096)
	var prefix []byte
	for !bytes.Contains(prefix, firstToken) {
		n, err := resp.Body.Read(buf)
		prefix = append(prefix, buf[:n]...)
		if err != nil {
			resp.Body.Close()
			results <- result{err: err}
			return
		}
	}
	results <- result{resp: resp, prefix: prefix}
}

// deliver streams the winner: its headers, the prefix, then the rest.
func deliver(w http.ResponseWriter, res result) {
	defer res.resp.Body.Close()
	for k, v := range res.resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.resp.StatusCode)
	w.Write(res.prefix)
	rc := http.NewResponseController(w)
	rc.Flush()
	buf := make([]byte, 4096)
	for {
		n, err := res.resp.Body.Read(buf)
		if n > 0 {
			w.Write(buf[:n])
			rc.Flush()
		}
		if err != nil {
			return
		}
	}
}
