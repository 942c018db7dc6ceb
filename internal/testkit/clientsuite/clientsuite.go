// Package clientsuite is what real clients see through each adapter's real
// proxy, written once: the official JavaScript SDKs (openai,
// @anthropic-ai/sdk, run with Node, see nodesdk) and the official Go SDK
// (openai-go) with their own timeouts and retries, against two simulated
// upstreams. It checks that a client's time-to-headers timeout does not
// become a time-to-first-token timeout (early headers), that a stalled
// attempt whose hedge is denied ends at the route's own timeout, that the
// SDKs' retries do not multiply a failure the gateway already retried
// (x-should-retry), that the raw stream shows its status line and
// keep-alives within the grace time, and that default Responses API calls
// are hedged on a route with hedge_stored_responses.
//
// The adapter gives a Start function that serves every Route, with
// upstream A first and B second, and returns each route's root URL (the
// suite appends "/v1/chat/completions" and the like).
//
// It is test support: nothing outside this module's tests imports it.
package clientsuite

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/nodesdk"
)

// Env is the suite's two upstreams.
type Env struct {
	A, B *llmsim.Running
}

// Route is one route an adapter must serve: upstreams A then B, named A
// and B, a fixed hedge delay, and these options in the adapter's spelling
// (zero values: the adapter's defaults).
type Route struct {
	Name         string
	Delay        time.Duration
	Timeout      time.Duration // the route's deadline
	MaxAttempts  int
	EarlyHeaders string // "" the default (1s), or a duration, or "off"
	// HedgeStoredResponses: hedge_stored_responses on.
	HedgeStoredResponses bool
}

// Start serves every route and returns each route's root URL by name (no
// trailing slash). The proxy stops at the end of the test.
type Start func(t *testing.T, env *Env, routes []Route) map[string]string

// The routes of the suite.
var routes = []Route{
	{Name: "slowboth", Delay: 100 * time.Millisecond},
	{Name: "stalled", Delay: 100 * time.Millisecond, Timeout: 3 * time.Second},
	{Name: "allfail", Delay: 100 * time.Millisecond},
	{Name: "allfailbefore", Delay: 100 * time.Millisecond},
	{Name: "ratelimited", Delay: 100 * time.Millisecond},
	{Name: "rawstream", Delay: 100 * time.Millisecond, EarlyHeaders: "300ms"},
	// Races of two: the stored-responses check counts each upstream's
	// requests, and a hedge slower than the delay would get a rescue.
	{Name: "responseson", Delay: 100 * time.Millisecond, HedgeStoredResponses: true, MaxAttempts: 2},
	{Name: "responsesoff", Delay: 100 * time.Millisecond, MaxAttempts: 2},
	{Name: "slowbothoff", Delay: 100 * time.Millisecond, EarlyHeaders: "off"},
}

// full: LLMHEDGE_CLIENTS=full runs the long forms (more calls, and the
// slow-both case against a route with early headers off, for the numbers
// before them).
func full() bool { return os.Getenv("LLMHEDGE_CLIENTS") == "full" }

// Run starts the upstreams, has start serve the routes and runs each check
// as a subtest.
func Run(t *testing.T, start Start) {
	wl := llmsim.Reference(11, 0.05) // TTFT median 30ms, 2% stalls of 0.5–1s
	holdA, holdB := &llmsim.Holder{}, &llmsim.Holder{}
	env := &Env{
		A: (&llmsim.Server{Name: "A", Workload: wl, Behave: holdA.Behave}).Start(),
		B: (&llmsim.Server{Name: "B", Workload: wl, Behave: holdB.Behave}).Start(),
	}
	t.Cleanup(env.A.Close)
	t.Cleanup(env.B.Close)
	urls := start(t, env, routes)
	for _, r := range routes {
		if urls[r.Name] == "" {
			t.Fatalf("start served no route %q", r.Name)
		}
	}
	drv := nodesdk.Install(t)
	s := &suite{env: env, urls: urls, driver: drv, holdA: holdA, holdB: holdB}
	t.Run("slow-both", s.slowBoth)
	if full() {
		t.Run("slow-both-early-headers-off", s.slowBothOff)
	}
	t.Run("stalled-primary-hedge-denied", s.stalledPrimary)
	t.Run("all-failing", s.allFailing)
	t.Run("raw-stream", s.rawStream)
	t.Run("responses-hedged", s.responsesHedged)
	if full() {
		t.Run("responses-measured", s.responsesMeasured)
	}
}

type suite struct {
	env          *Env
	urls         map[string]string
	driver       string
	holdA, holdB *llmsim.Holder // hold a request id on A or B until released
	seq          atomic.Int64
}

// hold holds id on both upstreams; the returned func releases it (once).
// The test's end releases it too.
func (s *suite) hold(t *testing.T, id string) (release func()) {
	a, b := s.holdA.Hold(id), s.holdB.Hold(id)
	var once sync.Once
	release = func() { once.Do(func() { close(a); close(b) }) }
	t.Cleanup(release)
	return release
}

// waitFor polls cond (upstream counters: no event to wait on) until it
// holds; the deadline only bounds a failure.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after 60s waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // polling, bounded by deadline
	}
}

// runAsync runs calls with the Node driver in a goroutine of its own.
func (s *suite) runAsync(calls []nodesdk.Call) <-chan asyncResult {
	done := make(chan asyncResult, 1)
	go func() {
		res, err := nodesdk.Exec(s.driver, len(calls), calls)
		done <- asyncResult{res, err}
	}()
	return done
}

type asyncResult struct {
	res []nodesdk.Result
	err error
}

// id is a fresh simulation request id.
func (s *suite) id(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), s.seq.Add(1))
}

// upstreamAttempts is how many requests A and B saw for id.
func (s *suite) upstreamAttempts(id string) int {
	return s.env.A.Attempts(id) + s.env.B.Attempts(id)
}

func headers(id, behavior string) map[string]string {
	h := map[string]string{llmsim.HeaderRequest: id}
	if behavior != "" {
		h[llmsim.HeaderBehavior] = behavior
	}
	return h
}

// openAIBase and anthropicBase are the SDKs' base URLs for a route.
func (s *suite) openAIBase(route string) string    { return s.urls[route] + "/v1" }
func (s *suite) anthropicBase(route string) string { return s.urls[route] }

// slowBoth: both upstreams take 3s to the first token and the SDK's
// timeout is 2s. A real provider sends its headers at once; through the
// gateway the early headers do, so the call succeeds in one request.
func (s *suite) slowBoth(t *testing.T) {
	const behavior = "*=ttft:3s"
	type node struct {
		call nodesdk.Call
		id   string
	}
	var calls []node
	for _, api := range []string{"chat", "chat", "messages"} {
		id := s.id("slow")
		base := s.openAIBase("slowboth")
		if api == "messages" {
			base = s.anthropicBase("slowboth")
		}
		calls = append(calls, node{nodesdk.Call{API: api, BaseURL: base, TimeoutMs: 2000, Headers: headers(id, behavior)}, id})
	}
	var wg sync.WaitGroup
	var goRes goResult
	goID := s.id("slow-go")
	wg.Add(1)
	go func() {
		defer wg.Done()
		goRes = s.goChat(s.openAIBase("slowboth"), goID, behavior, 2*time.Second)
	}()
	list := make([]nodesdk.Call, len(calls))
	for i, c := range calls {
		list[i] = c.call
	}
	res := nodesdk.Run(t, s.driver, len(list), list)
	wg.Wait()
	for i, r := range res {
		c := calls[i]
		t.Logf("node %s: %d SDK request(s), %d upstream request(s), %.0f ms, first text at %s, error %v",
			c.call.API, r.Requests, s.upstreamAttempts(c.id), r.Ms, ms(r.FirstMs), r.Error)
		if r.Error != nil || r.Text == "" {
			t.Errorf("node %s: error %+v, text %q; want a whole answer", c.call.API, r.Error, r.Text)
		}
		if r.Requests != 1 {
			t.Errorf("node %s: %d SDK requests, want 1", c.call.API, r.Requests)
		}
		// wall clock: the upstreams' 3s against the SDK's 2s timeout is the
		// thing under test; a loaded machine only adds to it.
		if d := r.Duration(); d < 2900*time.Millisecond {
			t.Errorf("node %s: the call took %v, want at least the upstreams' 3s", c.call.API, d)
		}
	}
	t.Logf("go chat: %d SDK request(s), %d upstream request(s), %v, error %v", goRes.requests, s.upstreamAttempts(goID), goRes.took, goRes.err)
	if goRes.err != nil || goRes.text == "" || goRes.requests != 1 {
		t.Errorf("go chat: error %v, text %q, %d requests; want a whole answer in one request", goRes.err, goRes.text, goRes.requests)
	}
	if goRes.took < 2900*time.Millisecond {
		t.Errorf("go chat: took %v, want at least the upstreams' 3s", goRes.took)
	}
}

// slowBothOff is slowBoth on a route with early headers off: what the
// SDKs did before them (measured, not asserted: the SDK's timeout fires
// and it retries).
func (s *suite) slowBothOff(t *testing.T) {
	for _, api := range []string{"chat", "messages"} {
		id := s.id("slowoff")
		base := s.openAIBase("slowbothoff")
		if api == "messages" {
			base = s.anthropicBase("slowbothoff")
		}
		r := nodesdk.Run(t, s.driver, 1, []nodesdk.Call{{API: api, BaseURL: base, TimeoutMs: 2000, Headers: headers(id, "*=ttft:3s")}})[0]
		t.Logf("early headers off, node %s: %d SDK request(s), %d upstream request(s), %.0f ms, error %v",
			api, r.Requests, s.upstreamAttempts(id), r.Ms, r.Error)
	}
}

// stalledPrimary: a default Responses API call (it stores, so its hedge
// is denied without an idempotency key) whose primary stalls, with the
// SDK's own default timeout (10 minutes): it ends at the route's 3s
// timeout, in one SDK request.
func (s *suite) stalledPrimary(t *testing.T) {
	const behavior = "A=stall"
	id := s.id("stall")
	var wg sync.WaitGroup
	var goRes goResult
	goID := s.id("stall-go")
	wg.Add(1)
	go func() {
		defer wg.Done()
		goRes = s.goResponses(s.openAIBase("stalled"), goID, behavior)
	}()
	res := nodesdk.Run(t, s.driver, 1, []nodesdk.Call{{API: "responses", BaseURL: s.openAIBase("stalled"), Headers: headers(id, behavior)}})
	wg.Wait()
	r := res[0]
	t.Logf("node responses: %d SDK request(s), %d upstream request(s), %.0f ms, error %v", r.Requests, s.upstreamAttempts(id), r.Ms, r.Error)
	if r.Error == nil {
		t.Errorf("node responses: no error, text %q; want the deadline's error", r.Text)
	}
	if r.Requests != 1 || s.upstreamAttempts(id) != 1 {
		t.Errorf("node responses: %d SDK requests, %d upstream requests; want 1 and 1", r.Requests, s.upstreamAttempts(id))
	}
	if d := r.Duration(); d < 2900*time.Millisecond || d > notTheSDKsTimeout {
		t.Errorf("node responses: the call took %v, want the route's 3s timeout", d)
	}
	t.Logf("go responses: %d SDK request(s), %d upstream request(s), %v, error %v", goRes.requests, s.upstreamAttempts(goID), goRes.took, goRes.err)
	if goRes.err == nil || goRes.requests != 1 || goRes.took < 2900*time.Millisecond || goRes.took > notTheSDKsTimeout {
		t.Errorf("go responses: error %v, %d requests, took %v; want an error in one request at about 3s", goRes.err, goRes.requests, goRes.took)
	}
}

// allFailing: every upstream answers 500 (or 429). The gateway already
// made its three attempts (A, B, A again; after a 429 only B, an upstream
// not tried yet); its x-should-retry: false keeps the SDK from making two more
// calls, each a race of its own. allfailbefore is the same with the header
// removed before the SDK sees it: the client against a gateway without it.
func (s *suite) allFailing(t *testing.T) {
	type node struct {
		call      nodesdk.Call
		id        string
		requests  int // want
		upstreams int
	}
	calls := []node{}
	add := func(api, route, behavior string, strip bool, requests, upstreams int) {
		id := s.id("fail")
		base := s.openAIBase(route)
		if api == "messages" {
			base = s.anthropicBase(route)
		}
		calls = append(calls, node{nodesdk.Call{API: api, BaseURL: base, Headers: headers(id, behavior), StripShouldRetry: strip}, id, requests, upstreams})
	}
	add("chat", "allfail", "*=status:500", false, 1, 3)
	add("messages", "allfail", "*=status:500", false, 1, 3)
	add("chat", "allfailbefore", "*=status:500", true, 3, 9)
	add("chat", "ratelimited", "*=status:429,retry_after:1", false, 1, 2)
	var wg sync.WaitGroup
	var goRes goResult
	goID := s.id("fail-go")
	wg.Add(1)
	go func() {
		defer wg.Done()
		goRes = s.goChat(s.openAIBase("allfail"), goID, "*=status:500", 0)
	}()
	list := make([]nodesdk.Call, len(calls))
	for i, c := range calls {
		list[i] = c.call
	}
	res := nodesdk.Run(t, s.driver, 1, list)
	wg.Wait()
	for i, r := range res {
		c := calls[i]
		up := s.upstreamAttempts(c.id)
		t.Logf("node %s on %s: %d SDK request(s) %v, %d upstream request(s), %.0f ms, error %v",
			c.call.API, routeOf(c.call.BaseURL, s.urls), r.Requests, r.Statuses, up, r.Ms, r.Error)
		if r.Error == nil || r.Requests != c.requests || up != c.upstreams {
			t.Errorf("node %s on %s: error %v, %d SDK requests, %d upstream requests; want an error, %d and %d",
				c.call.API, routeOf(c.call.BaseURL, s.urls), r.Error, r.Requests, up, c.requests, c.upstreams)
		}
	}
	t.Logf("go chat: %d SDK request(s), %d upstream request(s), error %v", goRes.requests, s.upstreamAttempts(goID), goRes.err)
	if goRes.err == nil || goRes.requests != 1 || s.upstreamAttempts(goID) != 3 {
		t.Errorf("go chat: error %v, %d SDK requests, %d upstream requests; want an error, 1 and 3", goRes.err, goRes.requests, s.upstreamAttempts(goID))
	}
}

// notTheSDKsTimeout tells the route's 3s timeout from the SDKs' own
// (10 minutes; the Go client's context here: 30s). wall clock: the
// timeout's own duration is the thing under test, and this bound only has
// to tell 3s from 30s, whatever the machine's load.
const notTheSDKsTimeout = 25 * time.Second

func routeOf(base string, urls map[string]string) string {
	for name, u := range urls {
		if base == u || base == u+"/v1" {
			return name
		}
	}
	return base
}

// rawStream reads a slow race's answer off the socket, as `curl -N` does:
// both upstreams hold the request until the client has seen the status
// line and a keep-alive comment, which the gateway must send on its own
// once the grace time (300ms on this route) has passed; then the tokens
// follow, and the stream ends whole.
func (s *suite) rawStream(t *testing.T) {
	u, err := url.Parse(s.urls["rawstream"])
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	id := s.id("raw")
	release := s.hold(t, id)
	start := time.Now()
	fmt.Fprintf(conn, "POST %s/v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n%s: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		u.Path, u.Host, llmsim.HeaderRequest, id, len(body), body)
	conn.SetReadDeadline(time.Now().Add(60 * time.Second)) // bounds a failure only
	rd := bufio.NewReader(conn)
	var statusAt time.Duration
	var status string
	var keepAlive, token, done, tokenWhileHeld bool
	for {
		line, err := rd.ReadString('\n')
		if statusAt == 0 && strings.HasPrefix(line, "HTTP/1.1 ") {
			statusAt = time.Since(start)
			status = strings.TrimSpace(line)
		}
		if !keepAlive && strings.HasPrefix(line, ": keep-alive") {
			keepAlive = true
			release() // the upstreams answer only now
		}
		if !token && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			token, tokenWhileHeld = true, !keepAlive
		}
		if strings.Contains(line, "data: [DONE]") {
			done = true
		}
		if err != nil {
			break
		}
	}
	t.Logf("raw stream: %q at %v, keep-alive %v, token %v, [DONE] %v", status, statusAt, keepAlive, token, done)
	// wall clock: the grace time is the thing under test; a loaded machine
	// can only make the status line later, so only the lower bound is checked.
	if status != "HTTP/1.1 200 OK" || statusAt < 250*time.Millisecond {
		t.Errorf("status line %q at %v, want 200 no sooner than the 300ms grace time", status, statusAt)
	}
	if !keepAlive || !token || tokenWhileHeld || !done {
		t.Errorf("keep-alive %v, token %v (while the upstreams held: %v), [DONE] %v; want a keep-alive while the upstreams hold, then a whole stream",
			keepAlive, token, tokenWhileHeld, done)
	}
}

// responsesHedged: default responses.stream calls (no store field), whose
// primaries (upstream A) are held, on a route with hedge_stored_responses
// and on one without. The route without goes first: its calls' hedge
// timers started before those of the route with, so once every call with
// has reached B, a hedge of a call without would have been sent too. Then
// the calls without are released. Want: every call with answered by its
// hedge (one request to A, one to B), every call without by A alone.
func (s *suite) responsesHedged(t *testing.T) {
	const n = 4
	batch := func(route string) ([]nodesdk.Call, []string) {
		calls, ids := make([]nodesdk.Call, n), make([]string, n)
		for i := range calls {
			ids[i] = s.id(route)
			calls[i] = nodesdk.Call{API: "responses", BaseURL: s.openAIBase(route), Headers: headers(ids[i], "")}
		}
		return calls, ids
	}
	offCalls, offIDs := batch("responsesoff")
	onCalls, onIDs := batch("responseson")
	var offGates []func()
	for _, id := range offIDs {
		offGates = append(offGates, s.hold(t, id))
	}
	for _, id := range onIDs {
		gate := s.holdA.Hold(id) // until the gateway cancels the loser
		t.Cleanup(func() { close(gate) })
	}
	offDone := s.runAsync(offCalls)
	waitFor(t, "every call without hedge_stored_responses to reach A", func() bool { return allAttempted(s.env.A, offIDs) })
	onDone := s.runAsync(onCalls)
	waitFor(t, "every call with hedge_stored_responses to reach B", func() bool { return allAttempted(s.env.B, onIDs) })
	for _, release := range offGates {
		release()
	}
	on, off := <-onDone, <-offDone
	for _, r := range []struct {
		route  string
		got    asyncResult
		ids    []string
		a, b   int
		reason string
	}{
		{"responseson", on, onIDs, 1, 1, "its hedge answers"},
		{"responsesoff", off, offIDs, 1, 0, "no hedge: the call stores"},
	} {
		if r.got.err != nil {
			t.Fatalf("%s: %v", r.route, r.got.err)
		}
		for i, res := range r.got.res {
			a, b := s.env.A.Attempts(r.ids[i]), s.env.B.Attempts(r.ids[i])
			if res.Error != nil || res.Text == "" || a != r.a || b != r.b {
				t.Errorf("%s call %d: error %+v, %d bytes of text, %d request(s) to A, %d to B; want a whole answer, %d and %d (%s)",
					r.route, i, res.Error, len(res.Text), a, b, r.a, r.b, r.reason)
			}
		}
	}
}

func allAttempted(u *llmsim.Running, ids []string) bool {
	for _, id := range ids {
		if u.Attempts(id) == 0 {
			return false
		}
	}
	return true
}

// responsesMeasured (LLMHEDGE_CLIENTS=full): 400 default responses.stream
// calls per route on the reference workload, TTFT p50 and p99 with and
// without hedge_stored_responses. Measured, not asserted: speed belongs in
// benchmarks.
func (s *suite) responsesMeasured(t *testing.T) {
	const n = 400
	for _, route := range []string{"responseson", "responsesoff"} {
		calls := make([]nodesdk.Call, n)
		ids := make([]string, n)
		for i := range calls {
			ids[i] = s.id(route)
			calls[i] = nodesdk.Call{API: "responses", BaseURL: s.openAIBase(route), Headers: headers(ids[i], "")}
		}
		res := nodesdk.Run(t, s.driver, 4, calls)
		var ttft []float64
		hedged := 0
		for i, r := range res {
			if r.Error != nil || r.FirstMs == nil {
				t.Errorf("%s call %d: error %+v; want a whole answer", route, i, r.Error)
				continue
			}
			ttft = append(ttft, *r.FirstMs)
			if s.upstreamAttempts(ids[i]) > 1 {
				hedged++
			}
		}
		t.Logf("%s: %d default responses.stream calls, TTFT p50 %v, p99 %v, %d hedged", route, n, quantile(ttft, 0.50), quantile(ttft, 0.99), hedged)
	}
}

// quantile of values in milliseconds, as a duration (nearest rank).
func quantile(values []float64, q float64) time.Duration {
	if len(values) == 0 {
		return 0
	}
	v := append([]float64(nil), values...)
	sort.Float64s(v)
	i := int(math.Ceil(q*float64(len(v)))) - 1
	if i < 0 {
		i = 0
	}
	return time.Duration(v[i] * float64(time.Millisecond))
}

func ms(p *float64) string {
	if p == nil {
		return "never"
	}
	return fmt.Sprintf("%.0f ms", *p)
}

// goResult is what a Go SDK call got.
type goResult struct {
	requests int
	took     time.Duration
	text     string
	err      error
}

// countingTransport counts the Go SDK's requests; headerTimeout, when
// set, is its time-to-headers timeout (http.Transport's
// ResponseHeaderTimeout, the Go client's counterpart of the JavaScript
// SDKs' timeout). openai-go's own WithRequestTimeout bounds the whole
// attempt, the stream included, so no gateway can help a stream that
// outlasts it.
type countingTransport struct {
	base     http.RoundTripper
	requests atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.requests.Add(1)
	return c.base.RoundTrip(r)
}

func goClient(base string, headerTimeout time.Duration) (openai.Client, *countingTransport) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = headerTimeout
	ct := &countingTransport{base: tr}
	return openai.NewClient(option.WithBaseURL(base+"/"), option.WithAPIKey("sk-go-client"),
		option.WithHTTPClient(&http.Client{Transport: ct})), ct
}

// goChat streams a chat completion with the Go SDK and its default retries.
func (s *suite) goChat(base, id, behavior string, headerTimeout time.Duration) goResult {
	client, ct := goClient(base, headerTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:    "client-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something.")},
	}, option.WithHeader(llmsim.HeaderRequest, id), option.WithHeader(llmsim.HeaderBehavior, behavior))
	defer stream.Close()
	var text strings.Builder
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			text.WriteString(ch.Delta.Content)
		}
	}
	return goResult{requests: int(ct.requests.Load()), took: time.Since(start), text: text.String(), err: stream.Err()}
}

// goResponses streams a default Responses API call with the Go SDK.
func (s *suite) goResponses(base, id, behavior string) goResult {
	client, ct := goClient(base, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	stream := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model: "client-model",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Say something.")},
	}, option.WithHeader(llmsim.HeaderRequest, id), option.WithHeader(llmsim.HeaderBehavior, behavior))
	defer stream.Close()
	var text strings.Builder
	for stream.Next() {
		ev := stream.Current()
		if ev.Type == "response.output_text.delta" {
			text.WriteString(ev.Delta)
		}
	}
	err := stream.Err()
	if err == nil && text.Len() == 0 {
		err = errors.New("the stream ended without text")
	}
	return goResult{requests: int(ct.requests.Load()), took: time.Since(start), text: text.String(), err: err}
}
