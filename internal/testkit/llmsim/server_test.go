package llmsim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const ms = time.Millisecond

// fast is a deterministic workload that runs in milliseconds: TTFT 5ms,
// 5 tokens 1ms apart, no stalls, no pings.
func fast() Workload {
	return Workload{Seed: 1, MedianTTFT: 5 * ms, Sigma: -1, StallProb: -1, Tokens: 5, TokenGap: ms, PingEvery: -1}
}

var paths = map[Format]string{
	Chat:      "/v1/chat/completions",
	Responses: "/v1/responses",
	Messages:  "/v1/messages",
	Ollama:    "/api/chat",
}

// post sends a JSON request; hdr holds header name/value pairs.
func post(t *testing.T, ctx context.Context, url, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func streamBody(model string, stream bool) string {
	return `{"model":"` + model + `","stream":` + strconv.FormatBool(stream) + `,"messages":[{"role":"user","content":"hi"}]}`
}

// eventReader splits a stream into SSE events (blocks ending with a blank
// line) or NDJSON lines.
type eventReader struct {
	r      *bufio.Reader
	ndjson bool
}

func (e *eventReader) next() (string, error) {
	if e.ndjson {
		return e.r.ReadString('\n')
	}
	var b strings.Builder
	for {
		line, err := e.r.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return b.String(), err
		}
		if line == "\n" {
			return b.String(), nil
		}
	}
}

func waitFor(t *testing.T, s *Server, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// Every format, streaming or not, answers exactly Call.Body, and the answer
// is valid for its format.
func TestFormatsByteExact(t *testing.T) {
	run := Start("A", fast())
	defer run.Close()
	for _, f := range []Format{Chat, Responses, Messages, Ollama} {
		for _, stream := range []bool{true, false} {
			t.Run(f.String()+"/stream="+strconv.FormatBool(stream), func(t *testing.T) {
				id := "r-" + f.String() + strconv.FormatBool(stream)
				resp := post(t, context.Background(), run.URL+paths[f], streamBody("m1", stream), HeaderRequest, id)
				defer resp.Body.Close()
				got, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				call := Call{Format: f, Stream: stream, Upstream: "A", Model: "m1", RequestID: id, Tokens: 5}
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, got)
				}
				if !bytes.Equal(got, call.Body()) {
					t.Fatalf("body differs\n got: %s\nwant: %s", got, call.Body())
				}
				wantCT := call.ContentType()
				if !stream {
					wantCT = "application/json"
				}
				if ct := resp.Header.Get("Content-Type"); ct != wantCT {
					t.Fatalf("Content-Type %q, want %q", ct, wantCT)
				}
				if stream && f != Ollama && resp.Header.Get("Cache-Control") != "no-cache" {
					t.Fatalf("Cache-Control %q", resp.Header.Get("Cache-Control"))
				}
				if resp.Header.Get(HeaderUpstream) != "A" {
					t.Fatalf("%s = %q", HeaderUpstream, resp.Header.Get(HeaderUpstream))
				}
				if text := parseText(t, f, stream, got); text != ExpectedChatText(id, 5) {
					t.Fatalf("text %q, want %q", text, ExpectedChatText(id, 5))
				}
			})
		}
	}
	waitFor(t, run.Server, "8 completed", func() bool { return run.Completed() == 8 })
}

// A prefix before the API path is accepted (suffix match).
func TestPathPrefix(t *testing.T) {
	run := Start("A", fast())
	defer run.Close()
	resp := post(t, context.Background(), run.URL+"/openai/v1/chat/completions", streamBody("m", false), HeaderRequest, "p")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(body, (Call{Format: Chat, Upstream: "A", Model: "m", RequestID: "p", Tokens: 5}).Body()) {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
}

// parseText checks that body is valid for its format with the standard
// library and returns the answer's text.
func parseText(t *testing.T, f Format, stream bool, body []byte) string {
	t.Helper()
	if !stream {
		var v struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
			Output []struct {
				Content []struct{ Text string } `json:"content"`
			} `json:"output"`
			Content []struct{ Text string }  `json:"content"`
			Message struct{ Content string } `json:"message"`
		}
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatalf("non-streaming body is not JSON: %v", err)
		}
		switch f {
		case Chat:
			return v.Choices[0].Message.Content
		case Responses:
			return v.Output[0].Content[0].Text
		case Messages:
			return v.Content[0].Text
		}
		return v.Message.Content
	}
	er := &eventReader{r: bufio.NewReader(bytes.NewReader(body)), ndjson: f == Ollama}
	var text strings.Builder
	var types []string
	var last map[string]any
	for {
		ev, err := er.next()
		if ev == "" && err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		if f == Ollama {
			var line struct {
				Model   string
				Message struct{ Role, Content string }
				Done    bool
			}
			if err := json.Unmarshal([]byte(ev), &line); err != nil {
				t.Fatalf("ndjson line %q: %v", ev, err)
			}
			text.WriteString(line.Message.Content)
			types = append(types, strconv.FormatBool(line.Done))
			continue
		}
		evType, data := "", ""
		for _, line := range strings.Split(strings.TrimSuffix(ev, "\n\n"), "\n") {
			k, v, _ := strings.Cut(line, ": ")
			switch k {
			case "event":
				evType = v
			case "data":
				data = v
			default:
				t.Fatalf("unexpected line %q", line)
			}
		}
		if data == "[DONE]" {
			types = append(types, "[DONE]")
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("data %q: %v", data, err)
		}
		last = m
		switch f {
		case Chat:
			if m["object"] != "chat.completion.chunk" || m["id"] != "chatcmpl-A-"+strings.TrimPrefix(m["id"].(string), "chatcmpl-A-") ||
				m["system_fingerprint"] != "A" || m["model"] != "m1" || m["created"] == nil {
				t.Fatalf("bad chunk %s", data)
			}
			choice := m["choices"].([]any)[0].(map[string]any)
			if choice["index"] != 0.0 {
				t.Fatalf("bad choice %s", data)
			}
			delta := choice["delta"].(map[string]any)
			if c, ok := delta["content"].(string); ok {
				text.WriteString(c)
			}
			types = append(types, "chunk")
		case Responses, Messages:
			if m["type"] != evType {
				t.Fatalf("event %q carries type %v", evType, m["type"])
			}
			if evType == "response.output_text.delta" {
				text.WriteString(m["delta"].(string))
			}
			if evType == "content_block_delta" {
				text.WriteString(m["delta"].(map[string]any)["text"].(string))
			}
			types = append(types, evType)
		}
	}
	switch f {
	case Chat:
		if types[len(types)-1] != "[DONE]" {
			t.Fatalf("chat stream does not end with [DONE]: %v", types)
		}
		if fr := last["choices"].([]any)[0].(map[string]any)["finish_reason"]; fr != "stop" {
			t.Fatalf("last chunk finish_reason %v", fr)
		}
	case Responses:
		want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
		if !equalStrings(types[:4], want) || types[len(types)-1] != "response.completed" {
			t.Fatalf("responses events %v", types)
		}
	case Messages:
		want := []string{"message_start", "content_block_start", "ping"}
		tail := []string{"content_block_stop", "message_delta", "message_stop"}
		if !equalStrings(types[:3], want) || !equalStrings(types[len(types)-3:], tail) {
			t.Fatalf("messages events %v", types)
		}
	case Ollama:
		if types[len(types)-1] != "true" {
			t.Fatalf("ollama stream does not end with done: %v", types)
		}
	}
	return text.String()
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The hard case: 200, headers and the output-free preamble arrive at once,
// then pings while the server waits, then the tokens. The first token
// comes 80 pings' time after the request: a server goroutine the loaded
// machine holds back past the first token sends none (as a real server
// would), so the margin is wide (CI once saw 0 pings with 12).
func TestPreambleAndPingsBeforeTokens(t *testing.T) {
	w := fast()
	w.PingEvery = 5 * ms
	s := &Server{Name: "A", Workload: w, Behave: func(*http.Request) Behavior { return Behavior{TTFT: 400 * ms} }}
	run := s.Start()
	defer run.Close()
	for _, f := range []Format{Chat, Responses, Messages} {
		t.Run(f.String(), func(t *testing.T) {
			resp := post(t, context.Background(), run.URL+paths[f], streamBody("m1", true), HeaderRequest, "ping")
			defer resp.Body.Close()
			call := Call{Format: f, Stream: true, Upstream: "A", Model: "m1", RequestID: "ping", Tokens: 5}
			sc := call.script()
			er := &eventReader{r: bufio.NewReader(resp.Body)}
			var preamble, all bytes.Buffer
			for preamble.Len() < len(sc.preamble) {
				ev, err := er.next()
				if err != nil {
					t.Fatal(err)
				}
				if ev == Ping {
					t.Fatalf("ping before the preamble ended: %q", preamble.String())
				}
				preamble.WriteString(ev)
			}
			if !bytes.Equal(preamble.Bytes(), sc.preamble) {
				t.Fatalf("preamble %q, want %q", preamble.Bytes(), sc.preamble)
			}
			all.Write(preamble.Bytes())
			pings := 0
			for {
				ev, err := er.next()
				if err != nil {
					t.Fatal(err)
				}
				all.WriteString(ev)
				if ev != Ping {
					if ev != string(sc.token(0)) {
						t.Fatalf("first event after pings %q, want token 0", ev)
					}
					break
				}
				pings++
			}
			if pings < 2 {
				t.Fatalf("%d pings before the first token (400ms, a ping due every 5ms), want several", pings)
			}
			rest, err := io.ReadAll(er.r)
			if err != nil {
				t.Fatal(err)
			}
			all.Write(rest)
			if got := StripPings(all.Bytes()); !bytes.Equal(got, call.Body()) {
				t.Fatalf("stream without pings\n got %q\nwant %q", got, call.Body())
			}
			t.Logf("%d pings before the first token", pings)
		})
	}
}

// A reset closes the connection mid-stream: the client's read fails, it
// does not see a clean end.
func TestResetGivesClientReadError(t *testing.T) {
	run := Start("A", fast())
	defer run.Close()
	for _, n := range []int{0, 2, 5} {
		t.Run("after="+strconv.Itoa(n), func(t *testing.T) {
			id := "reset" + strconv.Itoa(n)
			resp := post(t, context.Background(), run.URL+paths[Chat], streamBody("m1", true),
				HeaderRequest, id, HeaderBehavior, "A=reset_after:"+strconv.Itoa(n))
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("read error %v, want unexpected EOF", err)
			}
			sc := Call{Format: Chat, Stream: true, Upstream: "A", Model: "m1", RequestID: id, Tokens: 5}.script()
			want := append([]byte{}, sc.preamble...)
			for i := 0; i < n; i++ {
				want = append(want, sc.token(i)...)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("received %q, want %q", got, want)
			}
		})
	}
	waitFor(t, run.Server, "3 failed", func() bool { return run.Failed() == 3 })
	if run.Completed() != 0 || run.Cancelled() != 0 {
		t.Fatalf("completed %d cancelled %d", run.Completed(), run.Cancelled())
	}

	// Non-streaming: the connection closes with no response at all.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, run.URL+paths[Chat], strings.NewReader(streamBody("m1", false)))
	req.Header.Set(HeaderBehavior, "A=reset_after:0")
	if resp, err := tr.RoundTrip(req); err == nil {
		resp.Body.Close()
		t.Fatalf("non-streaming reset answered %d", resp.StatusCode)
	}
}

func TestErrorStatuses(t *testing.T) {
	run := Start("A", fast())
	defer run.Close()
	cases := []struct {
		path, behavior, retryAfter string
		status                     int
		errType                    string
	}{
		{paths[Chat], "A=status:429,retry_after:2", "2", 429, "rate_limit_error"},
		{paths[Chat], "A=status:429", "1", 429, "rate_limit_error"},
		{paths[Chat], "A=status:429,retry_after:-1", "", 429, "rate_limit_error"},
		{paths[Responses], "A=status:503", "", 503, "overloaded_error"},
		{paths[Responses], "A=status:503,retry_after:7", "7", 503, "overloaded_error"},
		{paths[Messages], "A=status:500", "", 500, "server_error"},
		{paths[Ollama], "A=status:401", "", 401, "authentication_error"},
		{"/v1/embeddings", "", "", 404, "not_found_error"},
		{paths[Chat], "A=nonsense", "", 400, "invalid_request_error"},
	}
	for _, c := range cases {
		resp := post(t, context.Background(), run.URL+c.path, streamBody("m1", true), HeaderBehavior, c.behavior)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s %q: status %d, want %d", c.path, c.behavior, resp.StatusCode, c.status)
		}
		if got := resp.Header.Get("Retry-After"); got != c.retryAfter {
			t.Errorf("%s %q: Retry-After %q, want %q", c.path, c.behavior, got, c.retryAfter)
		}
		var e struct {
			Type  string
			Error struct{ Message, Type, Code string }
		}
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Type != c.errType || e.Error.Code == "" {
			t.Errorf("%s %q: error body %s (%v)", c.path, c.behavior, body, err)
		}
		if c.path == paths[Messages] && e.Type != "error" {
			t.Errorf("anthropic error without type:error: %s", body)
		}
	}
	// Methods other than POST, and bodies that are not JSON.
	resp, err := http.Get(run.URL + paths[Chat])
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: status %d", resp.StatusCode)
	}
	resp = post(t, context.Background(), run.URL+paths[Chat], "{not json")
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad JSON: status %d", resp.StatusCode)
	}
	waitFor(t, run.Server, "all failed", func() bool { return run.Failed() == int64(len(cases)+2) })
}

func TestErrorEventBeforeOutput(t *testing.T) {
	run := Start("A", fast())
	defer run.Close()
	for _, f := range []Format{Chat, Responses, Messages, Ollama} {
		resp := post(t, context.Background(), run.URL+paths[f], streamBody("m1", true), HeaderRequest, "e", HeaderBehavior, "A=error_event")
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%v: status %d err %v", f, resp.StatusCode, err)
		}
		sc := Call{Format: f, Stream: true, Upstream: "A", Model: "m1", RequestID: "e", Tokens: 5}.script()
		if !bytes.Equal(got, append(append([]byte{}, sc.preamble...), sc.errorEvent...)) {
			t.Fatalf("%v: body %q", f, got)
		}
		ev := string(sc.errorEvent)
		switch f {
		case Chat:
			if !strings.HasPrefix(ev, `data: {"error":{`) {
				t.Fatalf("chat error event %q", ev)
			}
		case Responses, Messages:
			if !strings.HasPrefix(ev, "event: error\ndata: {") {
				t.Fatalf("%v error event %q", f, ev)
			}
		case Ollama:
			if !strings.HasPrefix(ev, `{"error":`) {
				t.Fatalf("ollama error line %q", ev)
			}
		}
	}
	// Non-streaming: a 500 error.
	resp := post(t, context.Background(), run.URL+paths[Chat], streamBody("m1", false), HeaderBehavior, "A=error_event")
	resp.Body.Close()
	if resp.StatusCode != 500 {
		t.Fatalf("non-streaming error_event: status %d", resp.StatusCode)
	}
}

func TestDoneBeforeOutput(t *testing.T) {
	run := Start("A", fast())
	defer run.Close()
	resp := post(t, context.Background(), run.URL+paths[Chat], streamBody("m1", true), HeaderRequest, "d", HeaderBehavior, "A=done_early")
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	sc := Call{Format: Chat, Stream: true, Upstream: "A", Model: "m1", RequestID: "d", Tokens: 5}.script()
	if want := string(sc.preamble) + "data: [DONE]\n\n"; string(got) != want {
		t.Fatalf("body %q, want %q", got, want)
	}
	waitFor(t, run.Server, "failed", func() bool { return run.Failed() == 1 })
}

// A client that goes away is counted as a cancellation, with the time the
// server saw it, promptly.
func TestCancellationCounted(t *testing.T) {
	cancels := make(chan Cancellation, 4)
	w := fast()
	w.PingEvery = 5 * ms
	w.TokenGap = 100 * ms // the cancel lands between token 2 and 3
	s := &Server{Name: "A", Workload: w, OnCancel: func(id string, at time.Time) {
		cancels <- Cancellation{RequestID: id, At: at}
	}}
	run := s.Start()
	defer run.Close()

	for _, c := range []struct {
		name, behavior string
		readEvents     int // events other than pings to read before cancelling
		tokens         int
	}{
		{"stalled", "A=stall", 1, 0},
		{"mid-stream", "A=ttft:1ms", 3, 2}, // preamble, two tokens
	} {
		t.Run(c.name, func(t *testing.T) {
			before := run.Cancelled()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			hdr := []string{HeaderRequest, "c-" + c.name, HeaderAttempt, "1", HeaderBehavior, c.behavior}
			resp := post(t, ctx, run.URL+paths[Chat], streamBody("m1", true), hdr...)
			er := &eventReader{r: bufio.NewReader(resp.Body)}
			for i := 0; i < c.readEvents; {
				ev, err := er.next()
				if err != nil {
					t.Fatal(err)
				}
				if ev != Ping {
					i++
				}
			}
			cancelAt := time.Now()
			cancel()
			resp.Body.Close()
			got := <-cancels
			latency := got.At.Sub(cancelAt)
			t.Logf("cancel observed %v after the client cancelled", latency)
			if got.RequestID != "c-"+c.name || latency < 0 || latency > 250*ms {
				t.Fatalf("cancellation %+v, latency %v", got, latency)
			}
			waitFor(t, run.Server, "in flight 0", func() bool { return run.InFlight() == 0 })
			if run.Cancelled() != before+1 {
				t.Fatalf("Cancelled() = %d, want %d", run.Cancelled(), before+1)
			}
			all := run.Cancellations()
			last := all[len(all)-1]
			if last.RequestID != "c-"+c.name || last.Attempt != "1" || !last.At.Equal(got.At) || last.TokensSent != c.tokens {
				t.Fatalf("recorded %+v, want %d tokens sent", last, c.tokens)
			}
		})
	}
	if run.Completed() != 0 {
		t.Fatalf("completed %d", run.Completed())
	}
}

func TestSlowHeaders(t *testing.T) {
	run := Start("A", fast())
	defer run.Close()
	start := time.Now()
	resp := post(t, context.Background(), run.URL+paths[Chat], streamBody("m1", true), HeaderBehavior, "A=slow_headers:40ms")
	headersAfter := time.Since(start)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if headersAfter < 40*ms {
		t.Fatalf("headers after %v, want >= 40ms", headersAfter)
	}
}

// Requests are recorded with the headers a gateway sets; the request id
// falls back to the idempotency key, then to a counter.
func TestRecordsRequests(t *testing.T) {
	run := Start("A", fast())
	defer run.Close()
	for attempt := 0; attempt < 2; attempt++ {
		resp := post(t, context.Background(), run.URL+paths[Chat], streamBody("gpt-x", false),
			"Authorization", "Bearer key-A", HeaderIdempotencyKey, "idem-1", HeaderAttempt, strconv.Itoa(attempt))
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.Contains(body, []byte(`"id":"chatcmpl-A-idem-1"`)) {
			t.Fatalf("request id is not the idempotency key: %s", body)
		}
	}
	resp := post(t, context.Background(), run.URL+paths[Chat], streamBody("m", false))
	resp.Body.Close()
	reqs := run.Requests()
	if len(reqs) != 3 {
		t.Fatalf("%d requests recorded", len(reqs))
	}
	r := reqs[1]
	if r.RequestID != "idem-1" || r.IdempotencyKey != "idem-1" || r.Attempt != "1" || r.Authorization != "Bearer key-A" ||
		r.Model != "gpt-x" || r.Format != Chat || r.Stream || r.Path != paths[Chat] || r.Method != "POST" ||
		!bytes.Contains(r.Body, []byte("gpt-x")) || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("recorded %+v", r)
	}
	if reqs[2].RequestID != "sim-1" {
		t.Fatalf("counter id %q", reqs[2].RequestID)
	}
	if run.Attempts("idem-1") != 2 || run.Served() != 3 {
		t.Fatalf("attempts %d served %d", run.Attempts("idem-1"), run.Served())
	}
	waitFor(t, run.Server, "3 completed", func() bool { return run.Completed() == 3 })
	run.ResetCounters()
	if run.Served() != 0 || len(run.Requests()) != 0 || run.Attempts("idem-1") != 0 {
		t.Fatal("ResetCounters left state")
	}
}

// The X-Sim-Behavior entry for this upstream (or "*") overrides Behave.
func TestBehaviorPrecedence(t *testing.T) {
	s := &Server{Name: "B", Workload: fast(), Behave: func(*http.Request) Behavior { return Behavior{Status: 500} }}
	run := s.Start()
	defer run.Close()
	for _, c := range []struct {
		header string
		status int
	}{
		{"", 500},
		{"A=status:429", 500},
		{"A=status:429;B=status:401", 401},
		{"*=status:503", 503},
		{"B=ttft:1ms;*=status:503", 200},
	} {
		resp := post(t, context.Background(), run.URL+paths[Chat], streamBody("m", false), HeaderBehavior, c.header)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("header %q: status %d, want %d", c.header, resp.StatusCode, c.status)
		}
	}
}

// Close cancels the requests in flight and returns once their handlers end.
func TestCloseCancelsInFlight(t *testing.T) {
	run := Start("A", fast())
	resp := post(t, context.Background(), run.URL+paths[Chat], streamBody("m", true), HeaderBehavior, "A=stall")
	er := &eventReader{r: bufio.NewReader(resp.Body)}
	if _, err := er.next(); err != nil {
		t.Fatal(err)
	}
	run.Close()
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("stream ended cleanly after Close")
	}
	resp.Body.Close()
	if run.InFlight() != 0 || run.Cancelled() != 1 {
		t.Fatalf("in flight %d cancelled %d", run.InFlight(), run.Cancelled())
	}
	// No handler goroutine outlives Close.
	buf := make([]byte, 1<<20)
	if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "llmsim.(*exchange)") ||
		strings.Contains(stacks, "llmsim.(*Server).ServeHTTP") {
		t.Fatalf("handler still running after Close:\n%s", stacks)
	}
}

// Many concurrent streams on two upstreams each get their own whole answer
// from their own upstream.
func TestConcurrentStreams(t *testing.T) {
	w := Reference(3, 0.01) // TTFT ~6ms, stalls 100–200ms, pings every 2.5ms
	a, b := Start("A", w), Start("B", w)
	defer a.Close()
	defer b.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 80)
	for i := 0; i < 40; i++ {
		for _, run := range []*Running{a, b} {
			wg.Add(1)
			go func(run *Running, id string) {
				defer wg.Done()
				req, _ := http.NewRequest(http.MethodPost, run.URL+paths[Chat], strings.NewReader(streamBody("m", true)))
				req.Header.Set(HeaderRequest, id)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errs <- err
					return
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				want := ExpectedStream(run.Name, "m", id, 20)
				if err != nil || !bytes.Equal(StripPings(got), want) {
					errs <- errors.New(run.Name + "/" + id + ": wrong answer")
				}
			}(run, "c"+strconv.Itoa(i))
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, run := range []*Running{a, b} {
		waitFor(t, run.Server, "40 completed", func() bool { return run.Completed() == 40 })
		if run.Served() != 40 || run.InFlight() != 0 {
			t.Fatalf("%s: served %d in flight %d", run.Name, run.Served(), run.InFlight())
		}
	}
}

// The time to first token follows the workload's draw.
func TestServedTTFTFollowsDraw(t *testing.T) {
	w := Workload{Seed: 4, MedianTTFT: 40 * ms, Sigma: 0.5, StallProb: -1, Tokens: 2, TokenGap: ms, PingEvery: -1}
	run := Start("A", w)
	defer run.Close()
	for i := 0; i < 5; i++ {
		id := "t" + strconv.Itoa(i)
		start := time.Now()
		resp := post(t, context.Background(), run.URL+paths[Chat], streamBody("m", true), HeaderRequest, id)
		er := &eventReader{r: bufio.NewReader(resp.Body)}
		er.next() // preamble
		if _, err := er.next(); err != nil {
			t.Fatal(err)
		}
		got := time.Since(start)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if want := w.TTFT("A", id); got < want {
			t.Fatalf("%s: first token after %v, drawn TTFT %v", id, got, want)
		}
	}
}
