package traefikplugin

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
)

// answer is what a client got from one streamed request.
type answer struct {
	status   int
	header   http.Header
	ids      map[string]bool // every chunk id seen
	content  string
	done     bool  // "data: [DONE]" arrived
	readErr  error // the body ended with an error (a broken stream)
	rawError string
}

// frontFor serves handler on a loopback server.
func frontFor(t *testing.T, handler http.Handler) *httptest.Server {
	front := httptest.NewServer(handler)
	t.Cleanup(func() { front.Close() })
	return front
}

func post(t *testing.T, url, id string, stream bool, header http.Header) *http.Response {
	t.Helper()
	body := `{"model":"m","stream":` + strconv.FormatBool(stream) + `,"messages":[{"role":"user","content":"hi"}]}`
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Test-Request", id)
	for k, vv := range header {
		req.Header[k] = vv
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// readAnswer reads an SSE answer to the end.
func readAnswer(resp *http.Response) answer {
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, header: resp.Header, ids: map[string]bool{}}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, err := io.ReadAll(resp.Body)
		a.rawError, a.readErr = string(b), err
		return a
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			a.done = true
			continue
		}
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			a.readErr = err
			return a
		}
		a.ids[c.ID] = true
		for _, ch := range c.Choices {
			a.content += ch.Delta.Content
		}
	}
	a.readErr = sc.Err()
	return a
}

// checkWhole fails unless a is the complete answer to request id from
// upstream alone.
func checkWhole(t *testing.T, a answer, upstream, id string, tokens int) {
	t.Helper()
	if a.status != 200 || a.readErr != nil || !a.done {
		t.Fatalf("answer to %s: status %d, err %v, done %v, body %q", id, a.status, a.readErr, a.done, a.rawError)
	}
	want := "chatcmpl-" + upstream + "-" + id
	if len(a.ids) != 1 {
		t.Fatalf("len(a.ids) = %v, want 1", len(a.ids))
	} else if !a.ids[want] {
		t.Fatalf("answer to %s mixes or misses chunks: ids %v, want only %s", id, a.ids, want)
	}
	if a.content != expectedText(id, tokens) {
		t.Fatalf("answer to %s: content %q, want %q", id, a.content, expectedText(id, tokens))
	}
}

// lineBuffer collects log lines, safe for concurrent writers.
type lineBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *lineBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, string(p))
	return len(p), nil
}

func (b *lineBuffer) all() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.lines...)
}

// newHedge builds the middleware from cfg like Traefik does and sends its
// log lines to logs (when not nil). It returns New's handler as is: under
// Yaegi v0.16.1 a *Hedge re-converted to http.Handler is not assignable.
func newHedge(t *testing.T, cfg *Config, name string, next http.Handler, logs io.Writer) http.Handler {
	t.Helper()
	if next == nil {
		next = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t.Errorf("next called for %s %s", r.Method, r.URL.Path)
			http.Error(w, "next", http.StatusTeapot)
		})
	}
	h, err := New(context.Background(), next, cfg, name)
	if err != nil {
		t.Fatal(err)
	}
	if logs != nil {
		h.(*Hedge).logOut = logs
	}
	return h
}

// requestLine decodes the plugin's log line (the keys of
// core.ReportLogFields).
type requestLine struct {
	Msg                string        `json:"msg"`
	Middleware         string        `json:"middleware"`
	Route              string        `json:"route"`
	Outcome            string        `json:"outcome"`
	Status             int           `json:"status"`
	Hedged             bool          `json:"hedged"`
	Attempts           int           `json:"attempts"`
	HedgesStarted      int           `json:"hedges_started"`
	WinnerAttempt      int           `json:"winner_attempt"`
	WinnerUpstream     string        `json:"winner_upstream"`
	WinnerRole         string        `json:"winner_role"`
	TTFTMillis         float64       `json:"ttft_ms"`
	TotalMillis        float64       `json:"total_ms"`
	DelayMillis        float64       `json:"delay_ms"`
	Denials            []string      `json:"denials"`
	WastedPromptTokens int64         `json:"wasted_prompt_tokens"`
	IdempotencyKeyHash string        `json:"idempotency_key_hash"`
	AttemptList        []attemptLine `json:"attempt_list"`
}

type attemptLine struct {
	Index         int     `json:"index"`
	Upstream      string  `json:"upstream"`
	Role          string  `json:"role"`
	Result        string  `json:"result"`
	Status        int     `json:"status"`
	StartedMillis float64 `json:"started_ms"`
	TTFTMillis    float64 `json:"ttft_ms"`
	CancelMillis  float64 `json:"cancel_ms"`
	Error         string  `json:"error"`
}

func twoUpstreams(a, b *testUpstream, delay string) *Config {
	cfg := CreateConfig()
	cfg.Upstreams = []Upstream{{Name: a.name, URL: a.srv.URL}, {Name: b.name, URL: b.srv.URL}}
	cfg.Delay = delay
	cfg.Log = logOff
	return cfg
}

func TestHedgeWinsOnFirstTokenBehindEarlyHeaders(t *testing.T) {
	// A sends 200, a role-only chunk and a ping at once, then nothing: a
	// header race would pick it. B is fast.
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{ttft: -1} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{ttft: 5 * time.Millisecond} })
	cfg := twoUpstreams(a, b, "50ms")
	cfg.ReportHeader = "Server-Timing"
	logs := &lineBuffer{}
	front := frontFor(t, newHedge(t, cfg, "hedge@test", nil, logs))

	ans := readAnswer(post(t, front.URL, "r1", true, nil))
	checkWhole(t, ans, "B", "r1", 3)
	st := ans.header.Get("Server-Timing")
	if !strings.Contains(st, "attempts=2") {
		t.Fatalf("st = %q, want it to contain \"attempts=2\"", st)
	} else if !strings.Contains(st, "winner=1") {
		t.Fatalf("st = %q, want it to contain \"winner=1\"", st)
	} else if !strings.Contains(st, "upstream=B") {
		t.Fatalf("st = %q, want it to contain \"upstream=B\"", st)
	} else if !strings.Contains(st, "dur=") {
		t.Fatalf("st = %q, want it to contain \"dur=\"", st)
	}
	// The loser was cancelled: A's handler saw its client go away.
	a.await(t, "A's attempt to be cancelled", func() bool { _, gone := a.counts(); return gone == 1 })

	l := oneLogLine(t, logs)
	// The line's fields, in its order; each names itself when wrong.
	for _, f := range []struct {
		key       string
		got, want any
	}{
		{"msg", l.Msg, "llmhedge request"}, {"middleware", l.Middleware, "hedge@test"}, {"route", l.Route, "hedge@test"},
		{"outcome", l.Outcome, "ok"}, {"status", l.Status, 200}, {"attempts", l.Attempts, 2}, {"hedges_started", l.HedgesStarted, 1},
		{"winner_attempt", l.WinnerAttempt, 1}, {"winner_upstream", l.WinnerUpstream, "B"}, {"winner_role", l.WinnerRole, "hedge"},
	} {
		if f.got != f.want {
			t.Fatalf("log line %s = %v, want %v", f.key, f.got, f.want)
		}
	}
	if l.TTFTMillis <= 0 {
		t.Fatalf("log line ttft_ms = %v, want > 0", l.TTFTMillis)
	} else if l.DelayMillis != 50 {
		t.Fatalf("log line delay_ms = %v, want 50", l.DelayMillis)
	} else if len(l.AttemptList) != 2 {
		t.Fatalf("log line has %d attempts in attempt_list, want 2", len(l.AttemptList))
	} else if l.AttemptList[0].Result != "lost" {
		t.Fatalf("log line attempt_list[0].result = %q, want \"lost\"", l.AttemptList[0].Result)
	} else if l.AttemptList[1].Role != "hedge" {
		t.Fatalf("log line attempt_list[1].role = %q, want \"hedge\"", l.AttemptList[1].Role)
	} else if l.AttemptList[1].Result != "won" {
		t.Fatalf("log line attempt_list[1].result = %q, want \"won\"", l.AttemptList[1].Result)
	}
	if line := logs.all()[0]; !strings.HasSuffix(line, "}\n") {
		t.Fatalf("log line does not end with a newline: %q", line)
	}
}

func TestEveryEventIsFlushed(t *testing.T) {
	// The upstream sends token i+1 only after the client has read token i:
	// if any event stayed in a buffer, the test would time out.
	gate := make(chan struct{})
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{tokens: 5, gate: gate} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{ttft: -1} })
	cfg := twoUpstreams(a, b, "10s")
	front := frontFor(t, newHedge(t, cfg, "flush", nil, nil))

	resp := post(t, front.URL, "f1", true, nil)
	defer resp.Body.Close()
	events := make(chan string, 16)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.Contains(sc.Text(), `"content":"f1:`) {
				events <- sc.Text()
			}
		}
	}()
	for i := 0; i < 5; i++ {
		got := receiveWithin(t, events, 10*time.Second)
		if !strings.Contains(got, tokenText("f1", i)) {
			t.Fatalf("event %d = %q", i, got)
		}
		if i < 4 {
			gate <- struct{}{}
		}
	}
}

// receiveWithin receives from ch, failing the test after d. It waits with
// one receive on a channel fed by the value and a timer (no select).
func receiveWithin(t *testing.T, ch chan string, d time.Duration) string {
	t.Helper()
	type result struct {
		s  string
		ok bool
	}
	out := make(chan result, 2)
	timer := time.AfterFunc(d, func() { out <- result{} })
	defer timer.Stop()
	go func() {
		s, ok := <-ch
		out <- result{s, ok}
	}()
	r := <-out
	if !r.ok {
		t.Fatalf("no event within %v", d)
	}
	return r.s
}

// oneLogLine returns the request's log line, the only one in logs.
func oneLogLine(t *testing.T, logs *lineBuffer) requestLine {
	t.Helper()
	lines := logs.all()
	if len(lines) != 1 {
		t.Fatalf("%d log lines, want 1: %q", len(lines), lines)
	}
	var l requestLine
	if err := json.Unmarshal([]byte(lines[0]), &l); err != nil {
		t.Fatalf("log line is not JSON: %v: %q", err, lines[0])
	}
	return l
}

func TestRetryableFailuresMoveToTheNextUpstream(t *testing.T) {
	for _, status := range []int{500, 503, 429} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			a := startUpstream(t, "A", func(_ *http.Request) script { return script{status: status} })
			b := startUpstream(t, "B", func(_ *http.Request) script { return script{} })
			logs := &lineBuffer{}
			front := frontFor(t, newHedge(t, twoUpstreams(a, b, "10s"), "retry", nil, logs))
			ans := readAnswer(post(t, front.URL, "x", true, nil))
			checkWhole(t, ans, "B", "x", 3)
			// B was started on A's failure, as a retry, not as the hedge
			// the 10s delay would have started: the log line says which.
			l := oneLogLine(t, logs)
			if len(l.AttemptList) != 2 {
				t.Fatalf("log line attempt_list = %+v, want A then B", l.AttemptList)
			} else if l.AttemptList[1].Role != "retry" {
				t.Fatalf("log line attempt_list[1].role = %q, want \"retry\" (started on A's %d, not by the delay)", l.AttemptList[1].Role, status)
			} else if l.WinnerRole != "retry" {
				t.Fatalf("log line winner_role = %q, want \"retry\"", l.WinnerRole)
			}
		})
	}
}

func TestFatalClientErrorIsPassedThroughUnhedged(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{status: 401} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{} })
	// A delay no answer takes: with a hedge already running when the 401
	// arrives, the hedge may still win (core/README.md, "fatal client error"), so
	// a short one made the outcome depend on the machine's speed. The
	// timer after a fatal answer is covered with a fake clock in core.
	front := frontFor(t, newHedge(t, twoUpstreams(a, b, "10s"), "fatal", nil, nil))
	ans := readAnswer(post(t, front.URL, "x", true, nil))
	if ans.status != 401 {
		t.Fatalf("ans.status = %v, want 401", ans.status)
	} else if !strings.Contains(ans.rawError, "A says 401") {
		t.Fatalf("ans.rawError = %q, want it to contain \"A says 401\"", ans.rawError)
	}
	if served, _ := b.counts(); served != 0 {
		t.Fatalf("B served %d requests", served)
	}
}

func TestNonStreamingAnswerWinsWhole(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{nonStream: true, ttft: -1} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{nonStream: true} })
	front := frontFor(t, newHedge(t, twoUpstreams(a, b, "20ms"), "json", nil, nil))
	resp := post(t, front.URL, "n1", false, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var got struct {
		ID      string `json:"id"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &got); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d body %q: %v", resp.StatusCode, body, err)
	}
	if got.ID != "chatcmpl-B-n1" {
		t.Fatalf("got.ID = %q, want \"chatcmpl-B-n1\"", got.ID)
	} else if len(got.Choices) != 1 {
		t.Fatalf("len(got.Choices) = %v, want 1", len(got.Choices))
	} else if got.Choices[0].Message.Content != expectedText("n1", 3) {
		t.Fatalf("got.Choices[0].Message.Content = %v, want %v", got.Choices[0].Message.Content, expectedText("n1", 3))
	}
}

func TestFailureAfterCommitBreaksTheStream(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{tokens: 5, abortAfter: 2} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{} })
	front := frontFor(t, newHedge(t, twoUpstreams(a, b, "10s"), "abort", nil, nil))
	ans := readAnswer(post(t, front.URL, "ab", true, nil))
	if ans.readErr == nil || ans.done {
		t.Fatalf("the client saw a clean end (err %v, done %v, content %q): a cut stream must look cut", ans.readErr, ans.done, ans.content)
	}
	if ans.content != expectedText("ab", 2) {
		t.Fatalf("ans.content = %v, want %v", ans.content, expectedText("ab", 2))
	} else if len(ans.ids) != 1 {
		t.Fatalf("len(ans.ids) = %v, want 1", len(ans.ids))
	} else if !ans.ids["chatcmpl-A-ab"] {
		t.Fatalf("before the break the client got %q from %v", ans.content, ans.ids)
	}
}

func TestStreamErrorEventInsteadOfCut(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{tokens: 5, abortAfter: 1} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{} })
	cfg := twoUpstreams(a, b, "10s")
	cfg.StreamErrorEvent = true
	front := frontFor(t, newHedge(t, cfg, "errevent", nil, nil))
	resp := post(t, front.URL, "ev", true, nil)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	} else if !bytes.Contains(body, []byte("event: error\ndata: {\"error\"")) {
		t.Fatalf("body = %q, want it to contain %q", body, []byte("event: error\ndata: {\"error\""))
	}
}

func TestClientDisconnectCancelsEveryAttempt(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{ttft: -1} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{ttft: -1} })
	front := frontFor(t, newHedge(t, twoUpstreams(a, b, "5ms"), "gone", nil, nil))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	a.await(t, "A's attempt to start", func() bool { sa, _ := a.counts(); return sa == 1 })
	b.await(t, "the hedge to B to start", func() bool { sb, _ := b.counts(); return sb == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error %v", err)
	}
	a.await(t, "A to see the cancellation", func() bool { _, ga := a.counts(); return ga == 1 })
	b.await(t, "B to see the cancellation", func() bool { _, gb := b.counts(); return gb == 1 })
}

func TestUpstreamHeadersAndModelRewrite(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{} })
	cfg := CreateConfig()
	cfg.Log = logOff
	cfg.Upstreams = []Upstream{{
		URL:           a.srv.URL + "/base",
		SetHeaders:    map[string]string{"Authorization": "Bearer upstream-secret"},
		DeleteHeaders: []string{"X-Drop-Me"},
		Model:         "gpt-cheap",
	}}
	logs := &lineBuffer{}
	front := frontFor(t, newHedge(t, cfg, "rewrite", nil, logs))
	hdr := http.Header{"Authorization": {"Bearer client"}, "X-Drop-Me": {"1"}, "Idempotency-Key": {"key-1"}}
	ans := readAnswer(post(t, front.URL, "h1", true, hdr))
	checkWhole(t, ans, "A", "h1", 3)
	got := a.lastHeader()
	if got.Get("Authorization") != "Bearer upstream-secret" {
		t.Fatalf("got.Get(\"Authorization\") = %q, want \"Bearer upstream-secret\"", got.Get("Authorization"))
	} else if got.Get("X-Drop-Me") != "" {
		t.Fatalf("got.Get(\"X-Drop-Me\") = %q, want \"\"", got.Get("X-Drop-Me"))
	} else if got.Get("Idempotency-Key") != "key-1" {
		t.Fatalf("got.Get(\"Idempotency-Key\") = %q, want \"key-1\"", got.Get("Idempotency-Key"))
	} else if got.Get("X-Llm-Hedge-Attempt") != "0" {
		t.Fatalf("got.Get(\"X-Llm-Hedge-Attempt\") = %q, want \"0\"", got.Get("X-Llm-Hedge-Attempt"))
	}
	if body := a.lastBody(); !strings.Contains(body, `"model":"gpt-cheap"`) {
		t.Fatalf("body = %q, want it to contain `\"model\":\"gpt-cheap\"`", body)
	} else if strings.Contains(body, `"model":"m"`) {
		t.Fatalf("body = %q, want it not to contain `\"model\":\"m\"`", body)
	}
	for _, l := range logs.all() {
		if strings.Contains(l, "secret") {
			t.Fatalf("a credential reached the log: %q", l)
		}
	}
}

func TestPassThroughCallsNextOnceForIneligibleRequests(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{} })
	var nextCalls int32
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		atomic.AddInt32(&nextCalls, 1)
		io.WriteString(w, "from next")
	})
	cfg := CreateConfig()
	cfg.Log = logOff
	cfg.Upstreams = []Upstream{{URL: a.srv.URL}}
	cfg.PathPrefixes = []string{"/v1/"}
	cfg.PassThrough = true
	front := frontFor(t, newHedge(t, cfg, "pass", next, nil))

	for _, c := range []struct {
		method, path, optOut string
		toNext               bool
	}{
		{"GET", "/v1/models", "", true},
		{"POST", "/other", "", true},
		{"POST", "/v1/chat/completions", "off", true},
		{"POST", "/v1/chat/completions", "", false},
	} {
		before := atomic.LoadInt32(&nextCalls)
		req, _ := http.NewRequest(c.method, front.URL+c.path, strings.NewReader(`{"stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		if c.optOut != "" {
			req.Header.Set("X-LLM-Hedge", c.optOut)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		calls := atomic.LoadInt32(&nextCalls) - before
		if c.toNext && (calls != 1 || string(body) != "from next") {
			t.Fatalf("%s %s (opt-out %q): next called %d times, body %q", c.method, c.path, c.optOut, calls, body)
		}
		if !c.toNext && calls != 0 {
			t.Fatalf("%s %s: next called for a hedged request", c.method, c.path)
		}
	}
}

// With passThrough and a model rewrite, a client's opt-out does not reach
// the router's service (it would get the client's own model): it takes the
// engine's single unhedged attempt, which rewrites the model. A request
// the route does not hedge by its path still goes to next.
func TestPassThroughOptOutKeepsTheModelRewrite(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{} })
	var nextCalls int32
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		atomic.AddInt32(&nextCalls, 1)
		io.WriteString(w, "from next")
	})
	cfg := CreateConfig()
	cfg.Log = logOff
	cfg.Upstreams = []Upstream{{URL: a.srv.URL, Model: "gpt-cheap"}}
	cfg.PathPrefixes = []string{"/v1/"}
	cfg.PassThrough = true
	front := frontFor(t, newHedge(t, cfg, "pass-rewrite", next, nil))

	ans := readAnswer(post(t, front.URL, "o1", true, http.Header{"X-Llm-Hedge": {"off"}}))
	if calls := atomic.LoadInt32(&nextCalls); calls != 0 {
		t.Fatalf("opted-out request: next called %d times, want 0", calls)
	}
	checkWhole(t, ans, "A", "o1", 3)
	if body := a.lastBody(); !strings.Contains(body, `"model":"gpt-cheap"`) {
		t.Fatalf("opted-out request: upstream saw body %q, want model gpt-cheap", body)
	}
	if got := a.lastHeader().Get("X-Llm-Hedge"); got != "" {
		t.Fatalf("opted-out request: upstream got X-LLM-Hedge %q, want none", got)
	}

	req, _ := http.NewRequest(http.MethodPost, front.URL+"/other", strings.NewReader(`{"model":"m"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if calls := atomic.LoadInt32(&nextCalls); calls != 1 {
		t.Fatalf("POST /other: calls = %v, want 1", calls)
	} else if string(body) != "from next" {
		t.Fatalf("POST /other: string(body) = %q, want \"from next\"", string(body))
	}
}

func TestWithoutPassThroughIneligibleRequestsGoToTheFirstUpstreamOnce(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{} })
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{} })
	front := frontFor(t, newHedge(t, twoUpstreams(a, b, "1ms"), "single", nil, nil))
	ans := readAnswer(post(t, front.URL, "s1", true, http.Header{"X-Llm-Hedge": {"off"}}))
	checkWhole(t, ans, "A", "s1", 3)
	if served, _ := b.counts(); served != 0 {
		t.Fatalf("an opted-out request reached B")
	}
}

func TestConcurrentAnswersBelongToTheirOwnRequest(t *testing.T) {
	// Under Yaegi a wrong shape (select) handed answers to the wrong
	// request under concurrency; every answer is checked against its id.
	// Half of A's answers are slow, so both upstreams win races.
	slow := func(r *http.Request) script {
		n, _ := strconv.Atoi(strings.TrimPrefix(r.Header.Get("X-Test-Request"), "c"))
		if n%2 == 0 {
			return script{ttft: 200 * time.Millisecond}
		}
		return script{}
	}
	a := startUpstream(t, "A", slow)
	b := startUpstream(t, "B", func(_ *http.Request) script { return script{ttft: time.Millisecond} })
	cfg := twoUpstreams(a, b, "20ms")
	cfg.Budget.Ratio = -1 // no budget: every slow request hedges
	front := frontFor(t, newHedge(t, cfg, "stress", nil, nil))

	const clients, perClient = 20, 10
	var wg sync.WaitGroup
	errs := make(chan string, clients*perClient)
	for c := 0; c < clients; c++ {
		c := c
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perClient; i++ {
				id := "c" + strconv.Itoa(c*perClient+i)
				ans := readAnswer(post(t, front.URL, id, true, nil))
				if ans.status != 200 || !ans.done || ans.readErr != nil || len(ans.ids) != 1 || ans.content != expectedText(id, 3) {
					errs <- id + ": " + ans.content
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	bad := 0
	for e := range errs {
		bad++
		t.Error(e)
	}
	if bad > 0 {
		t.Fatalf("%d of %d answers were wrong", bad, clients*perClient)
	}
}

func TestNewStartsNothingAndSharesStateAcrossReloads(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{} })
	cfg := CreateConfig()
	cfg.Log = logOff
	cfg.Upstreams = []Upstream{{URL: a.srv.URL}}
	cfg.Route = "shared-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	statesBefore := shared.size()
	goroutinesBefore := goroutinesOfOurs()
	var handlers []http.Handler
	for i := 0; i < 50; i++ {
		handlers = append(handlers, newHedge(t, cfg, "reload", nil, nil))
	}
	if after := goroutinesOfOurs(); len(after) > len(goroutinesBefore) {
		t.Fatalf("New started goroutines: %d before, %d after:\n%s\nbefore:\n%s", len(goroutinesBefore), len(after), strings.Join(after, "\n"), strings.Join(goroutinesBefore, "\n"))
	}
	if shared.size() != statesBefore {
		t.Fatalf("New created shared state before any request")
	}
	// A "reload": the same route with another delay keeps the state.
	reloaded := *cfg
	reloaded.Delay = "3s"
	handlers = append(handlers, newHedge(t, &reloaded, "reload", nil, nil))
	var first *core.State
	for _, h := range handlers {
		e, err := h.(*Hedge).engine()
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = e.State()
			continue
		}
		if e.State() != first {
			t.Fatalf("handlers of one route do not share state")
		}
	}
	// Another upstream list is another shape: new state.
	other := *cfg
	other.Upstreams = []Upstream{{URL: a.srv.URL}, {URL: a.srv.URL + "/2"}}
	e, _ := newHedge(t, &other, "reload", nil, nil).(*Hedge).engine()
	if e.State() == first {
		t.Fatalf("a different upstream list reused the state")
	}
}

func TestPassThroughNeverForwardsTheOptOutHeader(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{} })
	seen := make(chan string, 4)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- strings.Join(r.Header.Values("X-LLM-Hedge"), ",")
		io.WriteString(w, "from next")
	})
	cfg := CreateConfig()
	cfg.Log = logOff
	cfg.Upstreams = []Upstream{{URL: a.srv.URL}}
	cfg.PathPrefixes = []string{"/v1/"}
	cfg.PassThrough = true
	front := frontFor(t, newHedge(t, cfg, "pass-strip", next, nil))
	for _, path := range []string{"/v1/chat/completions", "/other"} {
		req, _ := http.NewRequest(http.MethodPost, front.URL+path, strings.NewReader(`{"stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-LLM-Hedge", "off")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := <-seen; got != "" {
			t.Fatalf("POST %s with X-LLM-Hedge: off: the router's service got X-LLM-Hedge %q, want none", path, got)
		}
	}
}

// The log line names the idempotency key by its hash, never by the key.
func TestLogLineCarriesKeyHashNotKey(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{} })
	cfg := CreateConfig()
	cfg.Upstreams = []Upstream{{Name: "A", URL: a.srv.URL}}
	logs := &lineBuffer{}
	front := frontFor(t, newHedge(t, cfg, "keyed", nil, logs))
	key := "client-key-7f3a9"
	checkWhole(t, readAnswer(post(t, front.URL, "k1", true, http.Header{"Idempotency-Key": {key}})), "A", "k1", 3)
	lines := logs.all()
	if len(lines) != 1 {
		t.Fatalf("%d log lines, want 1", len(lines))
	}
	if strings.Contains(lines[0], key) {
		t.Fatalf("the idempotency key reached the log: %q", lines[0])
	}
	var fields map[string]interface{}
	if err := json.Unmarshal([]byte(lines[0]), &fields); err != nil {
		t.Fatalf("log line is not JSON: %v", err)
	}
	if _, ok := fields["idempotency_key"]; ok {
		t.Errorf("log line has an idempotency_key field")
	}
	want := core.KeyHash(key)
	if got, _ := fields["idempotency_key_hash"].(string); got != want {
		t.Errorf("idempotency_key_hash = %q, want %q", got, want)
	}
}
