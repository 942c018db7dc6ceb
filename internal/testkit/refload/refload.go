// Package refload drives the reference workload through a proxy and
// measures what a client sees: time to first token, total time, and whether
// every answer is exactly its own request's answer from one upstream. The
// core's benchmark, the adapters' benchmarks and the demo share it.
package refload

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// Options describe one run.
type Options struct {
	// URL is the full endpoint, e.g. http://127.0.0.1:8080/v1/chat/completions.
	URL string
	// N requests, Concurrency at a time. Defaults 2000 and 50.
	N           int
	Concurrency int
	// IDPrefix names the requests (IDPrefix + index): the same ids give the
	// same draws, so variants of one run are comparable. Default "req-".
	IDPrefix string
	// Model in each request body. Default "gpt-sim".
	Model string
	// Upstreams whose exact answer a response may be (llmsim server names).
	Upstreams []string
	// Tokens per answer (the workload's). Default 20.
	Tokens int
	// Header is added to every request (e.g. X-Sim-Behavior).
	Header http.Header
	// Client sends the requests. Default: a client with enough idle
	// connections for Concurrency.
	Client *http.Client
	// Timeout per request. Default 60s.
	Timeout time.Duration
	// Progress, if set, is called after each request with the count done.
	Progress func(done int)
}

// Result is what the client saw, indexed like the request ids.
type Result struct {
	IDs    []string
	TTFT   []time.Duration // 0 where the request failed
	Total  []time.Duration
	Winner []string // the upstream whose answer arrived; "" on failure
	// Wrong counts answers that were not exactly one upstream's answer to
	// their own request (another request's, spliced, cut or altered).
	Wrong int
	// Failed counts requests that got no answer (error status, transport error).
	Failed int
	// Errors holds the first few failure descriptions.
	Errors []string
	Wall   time.Duration
}

// Run sends opts.N streaming chat requests and checks every answer.
func Run(ctx context.Context, opts Options) *Result {
	if opts.N == 0 {
		opts.N = 2000
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = 50
	}
	if opts.IDPrefix == "" {
		opts.IDPrefix = "req-"
	}
	if opts.Model == "" {
		opts.Model = "gpt-sim"
	}
	if opts.Tokens == 0 {
		opts.Tokens = 20
	}
	if opts.Timeout == 0 {
		opts.Timeout = time.Minute
	}
	if opts.Client == nil {
		opts.Client = &http.Client{Transport: &http.Transport{
			MaxIdleConns: opts.Concurrency * 2, MaxIdleConnsPerHost: opts.Concurrency * 2, IdleConnTimeout: time.Minute,
		}}
	}
	res := &Result{
		IDs: make([]string, opts.N), TTFT: make([]time.Duration, opts.N),
		Total: make([]time.Duration, opts.N), Winner: make([]string, opts.N),
	}
	var mu sync.Mutex
	next := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	done := 0
	for w := 0; w < opts.Concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				id := fmt.Sprintf("%s%d", opts.IDPrefix, i)
				ttft, total, body, err := one(ctx, &opts, id)
				mu.Lock()
				res.IDs[i] = id
				switch {
				case err != nil:
					res.Failed++
					if len(res.Errors) < 10 {
						res.Errors = append(res.Errors, id+": "+err.Error())
					}
				default:
					winner := ""
					clean := llmsim.StripPings(llmsim.StripKeepAlives(body))
					for _, up := range opts.Upstreams {
						if bytes.Equal(clean, llmsim.ExpectedStream(up, opts.Model, id, opts.Tokens)) {
							winner = up
						}
					}
					if winner == "" {
						res.Wrong++
						if len(res.Errors) < 10 {
							res.Errors = append(res.Errors, fmt.Sprintf("%s: wrong answer (%d bytes): %.200q", id, len(body), clean))
						}
					}
					res.Winner[i] = winner
					res.TTFT[i] = ttft
					res.Total[i] = total
				}
				done++
				if opts.Progress != nil {
					opts.Progress(done)
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < opts.N && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	res.Wall = time.Since(start)
	return res
}

// one sends one request; ttft is when the first content token's text
// arrived, total when the body ended.
func one(ctx context.Context, opts *Options, id string) (ttft, total time.Duration, body []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	payload := fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":"hello %s"}]}`, opts.Model, id)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, opts.URL, strings.NewReader(payload))
	if err != nil {
		return 0, 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(llmsim.HeaderRequest, id)
	for k, vv := range opts.Header {
		req.Header[k] = vv
	}
	first := []byte(llmsim.TokenText(id, 0))
	start := time.Now()
	resp, err := opts.Client.Do(req)
	if err != nil {
		return 0, 0, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, 0, nil, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	buf := make([]byte, 16<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			body = append(body, buf[:n]...)
			if ttft == 0 && bytes.Contains(body, first) {
				ttft = time.Since(start)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return 0, 0, nil, fmt.Errorf("reading the stream: %w", rerr)
		}
	}
	if ttft == 0 {
		return 0, 0, body, fmt.Errorf("no first token in %d bytes", len(body))
	}
	return ttft, time.Since(start), body, nil
}

// Peers are the comparisons computed from the same draws.
type Peers struct {
	NoHedge, Ideal, Sequential, RaceAll []time.Duration
	// IdealExtra is the share of requests the ideal hedge sends twice.
	IdealExtra float64
}

// ComputePeers computes the peers at delay d for upstreams a (primary) and b.
func ComputePeers(w llmsim.Workload, a, b string, ids []string, d time.Duration) Peers {
	var p Peers
	extra := 0
	for _, id := range ids {
		ta, tb := w.TTFT(a, id), w.TTFT(b, id)
		p.NoHedge = append(p.NoHedge, llmsim.NoHedge(ta))
		p.Ideal = append(p.Ideal, llmsim.IdealHedge(ta, tb, d))
		p.Sequential = append(p.Sequential, llmsim.Sequential(ta, tb, d))
		p.RaceAll = append(p.RaceAll, llmsim.RaceAll(ta, tb))
		if ta > d {
			extra++
		}
	}
	if len(ids) > 0 {
		p.IdealExtra = float64(extra) / float64(len(ids))
	}
	return p
}

// Median returns the median of ds (0 for none).
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
