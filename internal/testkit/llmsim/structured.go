package llmsim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmhedge/llmhedge/internal/stats"
)

// This file is a behaviour of its own for the validity checks' acceptance
// tests: an upstream whose Chat Completions answers are structured output,
// either valid against StructuredSchema or not, after a delay. One fast
// upstream that answers invalid JSON and one slower one that answers valid
// JSON make the case where the first answer is not the right one.

// StructuredSchema is the schema StructuredRequest asks for and a valid
// Structured answer follows: {"city": string, "from": string}.
const StructuredSchema = `{"type":"object","required":["city","from"],"additionalProperties":false,` +
	`"properties":{"city":{"type":"string"},"from":{"type":"string"}}}`

// Structured answers every Chat Completions request with structured output.
type Structured struct {
	// Name goes into every answer's "from".
	Name string
	// Valid answers follow StructuredSchema; invalid ones have a number
	// for "city".
	Valid bool
	// Delay comes before the first token (streaming) or the answer.
	Delay time.Duration
	// Gap separates streamed chunks.
	Gap      time.Duration
	requests int64
}

// StructuredContent is the message content a Structured upstream sends.
func StructuredContent(name string, valid bool) string {
	if valid {
		return `{"city":"Paris","from":"` + name + `"}`
	}
	return `{"city":42,"from":"` + name + `"}`
}

// Requests returns how many requests s has received.
func (s *Structured) Requests() int64 { return atomic.LoadInt64(&s.requests) }

// StartStructured serves s on 127.0.0.1 until the returned server is closed.
func StartStructured(s *Structured) *httptest.Server {
	return httptest.NewServer(s)
}

// ServeHTTP answers one request, streamed when its body asks for it.
func (s *Structured) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	atomic.AddInt64(&s.requests, 1)
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Stream bool `json:"stream"`
	}
	json.Unmarshal(body, &req)
	content := StructuredContent(s.Name, s.Valid)
	if !wait(r.Context(), s.Delay) {
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-%s","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":%s},"finish_reason":"stop"}]}`,
			s.Name, jsonString(content))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	send := func(chunk string) {
		io.WriteString(w, chunk)
		if fl != nil {
			fl.Flush()
		}
	}
	send(`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n")
	// Four pieces, so that the JSON is complete only at the end.
	step := (len(content) + 3) / 4
	for i := 0; i < len(content); i += step {
		end := i + step
		if end > len(content) {
			end = len(content)
		}
		if i > 0 && !wait(r.Context(), s.Gap) {
			return
		}
		send(`data: {"choices":[{"index":0,"delta":{"content":` + jsonString(content[i:end]) + `}}]}` + "\n\n")
	}
	send(`data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n")
}

// wait waits d, or until ctx ends (false).
func wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// StructuredRequest is a Chat Completions request to base (a proxy's URL)
// that asks for StructuredSchema.
func StructuredRequest(ctx context.Context, base string, stream bool) *http.Request {
	body := `{"model":"m","stream":` + fmt.Sprint(stream) + `,"messages":[{"role":"user","content":"a city"}],` +
		`"response_format":{"type":"json_schema","json_schema":{"name":"city","strict":true,"schema":` + StructuredSchema + `}}}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	return req
}

// StructuredResult counts what StructuredLoad's clients received.
type StructuredResult struct {
	Requests int
	Valid    int            // answers that follow StructuredSchema
	Invalid  int            // answers that do not
	Failed   int            // no answer (an error, a broken stream)
	Marked   int            // answers that came with X-LLM-Hedge-Validation
	From     map[string]int // answers by their "from"
	// TTFT is the time to the first body byte, Total to the answer's end.
	TTFT, Total []time.Duration
	Errors      []string // the first few failures
}

// Summary is one line: counts and TTFT/total p50 and p99 in milliseconds.
func (r *StructuredResult) Summary() string {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return fmt.Sprintf("%d requests: %d valid, %d invalid (%d marked), %d failed, from %v; TTFT p50 %.1f ms p99 %.1f ms; total p50 %.1f ms p99 %.1f ms",
		r.Requests, r.Valid, r.Invalid, r.Marked, r.Failed, r.From,
		ms(stats.Quantile(r.TTFT, 0.5)), ms(stats.Quantile(r.TTFT, 0.99)), ms(stats.Quantile(r.Total, 0.5)), ms(stats.Quantile(r.Total, 0.99)))
}

// StructuredLoad sends n StructuredRequests to base from `clients`
// concurrent clients, every other one streamed, and checks each answer.
func StructuredLoad(ctx context.Context, client *http.Client, base string, n, clients int) *StructuredResult {
	res := &StructuredResult{From: map[string]int{}}
	var mu sync.Mutex
	var next int64
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := atomic.AddInt64(&next, 1) - 1
				if i >= int64(n) {
					return
				}
				one := structuredOne(ctx, client, base, i%2 == 0)
				mu.Lock()
				res.add(one)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return res
}

// structuredAnswer is one request's outcome.
type structuredAnswer struct {
	content     string
	marked      bool
	err         string
	ttft, total time.Duration
}

func (r *StructuredResult) add(a structuredAnswer) {
	r.Requests++
	if a.err != "" {
		r.Failed++
		if len(r.Errors) < 5 {
			r.Errors = append(r.Errors, a.err)
		}
		return
	}
	if a.marked {
		r.Marked++
	}
	r.TTFT = append(r.TTFT, a.ttft)
	r.Total = append(r.Total, a.total)
	var v struct {
		City interface{} `json:"city"`
		From string      `json:"from"`
	}
	if json.Unmarshal([]byte(a.content), &v) != nil {
		r.Invalid++
		return
	}
	r.From[v.From]++
	if _, ok := v.City.(string); ok {
		r.Valid++
	} else {
		r.Invalid++
	}
}

// structuredOne sends one request and reads its answer's content.
func structuredOne(ctx context.Context, client *http.Client, base string, stream bool) structuredAnswer {
	start := time.Now()
	resp, err := client.Do(StructuredRequest(ctx, base, stream))
	if err != nil {
		return structuredAnswer{err: err.Error()}
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.Peek(1); err != nil {
		return structuredAnswer{err: fmt.Sprintf("status %d, no body: %v", resp.StatusCode, err)}
	}
	a := structuredAnswer{ttft: time.Since(start), marked: resp.Header.Get("X-LLM-Hedge-Validation") != ""}
	body, err := io.ReadAll(br)
	a.total = time.Since(start)
	if err != nil {
		a.err = "reading the answer: " + err.Error()
		return a
	}
	if resp.StatusCode != http.StatusOK {
		a.err = fmt.Sprintf("status %d: %.200s", resp.StatusCode, body)
		return a
	}
	if !stream {
		var doc struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if json.Unmarshal(body, &doc) != nil || len(doc.Choices) == 0 {
			a.err = fmt.Sprintf("not a Chat answer: %.200s", body)
			return a
		}
		a.content = doc.Choices[0].Message.Content
		return a
	}
	var content strings.Builder
	for _, line := range bytes.Split(body, []byte("\n")) {
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok || string(data) == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal(data, &chunk) == nil && len(chunk.Choices) > 0 {
			content.WriteString(chunk.Choices[0].Delta.Content)
		}
	}
	if !bytes.Contains(body, []byte("data: [DONE]")) {
		a.err = "the stream did not end with [DONE]"
		return a
	}
	a.content = content.String()
	return a
}
