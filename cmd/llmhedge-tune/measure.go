package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/stream"

	"github.com/llmhedge/llmhedge/core"
)

// requestIDPrefix names request i "tune-<i>" in the samples CSV. The id is
// not sent: the providers have no use for it.
const requestIDPrefix = "tune-"

// tagRequest is nil in the command. The tests set it to name request i to
// the simulated upstreams, whose latency draws follow a request id, so the
// measurements can be checked against the simulator's truth. A hook with
// the index rather than an http.RoundTripper: a transport sees the request
// only, and carrying the index in its context for tests would be plumbing
// in the product.
var tagRequest func(req *http.Request, i int)

// sample is one request to one endpoint.
type sample struct {
	// Sent is false for a request never sent (the run was interrupted).
	Sent bool
	// Cancelled: the run was interrupted while it was in flight; it is
	// not a measurement.
	Cancelled bool
	// TTFT is the time to the first output event; 0 when there was none.
	TTFT time.Duration
	// Total is the time to the end of the answer; 0 unless it completed.
	Total time.Duration
	// Err describes a failure (Kind is its short class for counting).
	Err, Kind string
	// FailedAt is when a failure before the first output event was known:
	// a hedging proxy would start the hedge then (or at its delay).
	FailedAt time.Duration
	// InTokens and OutTokens are what the answer is billed for: from its
	// usage block when it has one, else the input estimated as body bytes
	// / 4 and the output counted as content events. 0 without a 2xx.
	InTokens, OutTokens int64
	// Usage: both counts came from the answer's usage block.
	Usage bool
	// Billed: the endpoint accepted the request (a 2xx status), so its
	// tokens are paid for even if the answer then failed.
	Billed bool
	// Fatal: the status is a client error that llmhedge passes to the
	// client at once, unhedged (400, 401, 403, 404, 413, 422; core/README.md, "How it behaves").
	Fatal bool
}

// completed reports whether s is a measurement (a success or a failure),
// as opposed to a request not sent or cut short by Ctrl-C.
func (s sample) completed() bool { return s.Sent && !s.Cancelled }

// ok reports whether s produced a first output event.
func (s sample) ok() bool { return s.completed() && s.TTFT > 0 }

// measurement is the outcome of a run: Samples[e][i] is request i on
// endpoint e.
type measurement struct {
	Samples     [][]sample
	Interrupted bool
	Wall        time.Duration
}

// measure sends every request of p to every endpoint, Concurrency at a
// time per endpoint, and calls done after each. When ctx ends it stops
// sending, cancels the requests in flight and returns what it has.
func measure(ctx context.Context, p *plan, done func()) *measurement {
	o := p.opts
	transport := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: o.Concurrency,
		IdleConnTimeout:     90 * time.Second,
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}

	m := &measurement{Samples: make([][]sample, len(o.Endpoints))}
	start := time.Now()
	var wg sync.WaitGroup
	for e := range o.Endpoints {
		m.Samples[e] = make([]sample, o.N)
		next := make(chan int)
		for w := 0; w < o.Concurrency; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if ctx.Err() != nil {
						continue // handed over as Ctrl-C came: never sent
					}
					m.Samples[e][i] = sendOne(ctx, client, p, e, i)
					done()
				}
			}()
		}
		// Each endpoint is fed on its own, so a slow one does not hold
		// back the others; index order keeps the pairs of an interrupted
		// run aligned.
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(next)
			for i := 0; i < o.N; i++ {
				select {
				case next <- i:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	wg.Wait()
	m.Wall = time.Since(start)
	m.Interrupted = ctx.Err() != nil
	return m
}

// sendOne sends request i to endpoint e and times it.
func sendOne(parent context.Context, client *http.Client, p *plan, e, i int) sample {
	ep := p.opts.Endpoints[e]
	ctx, cancel := context.WithTimeout(parent, p.opts.Timeout)
	defer cancel()
	s := sample{Sent: true}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL(), bytes.NewReader(p.body(e, i)))
	if err != nil {
		return s.fail(0, "request", err.Error(), p.keys[e])
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("User-Agent", "llmhedge-tune")
	if tagRequest != nil {
		tagRequest(req, i)
	}
	if key := p.keys[e]; key != "" {
		if ep.Format == formatAnthropic {
			req.Header.Set("x-api-key", key)
		} else {
			req.Header.Set("Authorization", "Bearer "+key)
		}
	}
	if ep.Format == formatAnthropic {
		req.Header.Set("anthropic-version", "2023-06-01")
	}

	start := time.Now()
	s = timeResponse(client, req, start, p.keys[e])
	if s.Billed && s.InTokens == 0 {
		s.InTokens = estimateTokens(p.body(e, i))
	}
	if parent.Err() != nil && s.Err != "" {
		// Ctrl-C, not the endpoint: this is no measurement.
		s.Cancelled = true
	} else if errors.Is(ctx.Err(), context.DeadlineExceeded) && s.Err != "" {
		s.Kind, s.Err = "timeout", fmt.Sprintf("no first output within -timeout %v", p.opts.Timeout)
		if s.TTFT > 0 {
			s.Err = fmt.Sprintf("answer not complete within -timeout %v", p.opts.Timeout)
		}
	}
	return s
}

// timeResponse sends req and reads the answer, noting when the first
// output event (core's rules, as the hedge races on it) and the end came.
func timeResponse(client *http.Client, req *http.Request, start time.Time, key string) (s sample) {
	s = sample{Sent: true}
	resp, err := client.Do(req)
	if err != nil {
		return s.fail(time.Since(start), "connection", err.Error(), key)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		s = s.fail(time.Since(start), "status "+strconv.Itoa(resp.StatusCode),
			fmt.Sprintf("status %d: %s", resp.StatusCode, oneLine(b)), key)
		s.Fatal = core.FatalStatus(resp.StatusCode)
		return s
	}
	s.Billed = true
	detector, streaming := stream.NewEventDetector(resp.Header.Get("Content-Type"), config.RuleAuto)
	tokens := &tokenCounter{stream: streaming, in: -1, out: -1}
	defer func() { tokens.into(&s) }()
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			tokens.feed(buf[:n])
		}
		if n > 0 && streaming && s.TTFT == 0 {
			output, ferr := detector.Feed(buf[:n])
			if ferr != nil {
				return s.fail(time.Since(start), "stream error", "stream failed before output: "+ferr.Error(), key)
			}
			if output {
				s.TTFT = time.Since(start)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if s.TTFT > 0 {
				// Output had started: the hedge would have committed to
				// this answer, so its TTFT counts; its total does not.
				s.Kind, s.Err = "cut after output", redact("stream cut after the first output: "+rerr.Error(), key)
				return s
			}
			return s.fail(time.Since(start), "connection", "reading the stream: "+rerr.Error(), key)
		}
	}
	end := time.Since(start)
	if !streaming {
		// Not a stream: the answer is complete (its first token) at its end.
		s.TTFT = end
	}
	if s.TTFT == 0 {
		output, ferr := detector.End()
		if !output {
			why := "stream ended before the first output event"
			if ferr != nil {
				why += ": " + ferr.Error()
			}
			return s.fail(end, "no output", why, key)
		}
		s.TTFT = end
	}
	s.Total = end
	return s
}

// fail records a failure before any output.
func (s sample) fail(at time.Duration, kind, msg, key string) sample {
	s.FailedAt, s.Kind, s.Err = at, kind, redact(msg, key)
	return s
}

// redact removes the key from a message: an upstream or a transport error
// may echo it, and the report must never show it.
func redact(msg, key string) string {
	if key == "" {
		return msg
	}
	return strings.ReplaceAll(msg, key, "[redacted]")
}

// oneLine squeezes an error body into one short line.
func oneLine(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
