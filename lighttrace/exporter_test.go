package lighttrace

import (
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
)

// testSpans is one request's spans: the request and n-1 attempts.
func testSpans(n int) []span {
	out := make([]span, n)
	for i := range out {
		out[i].traceID = clientTrace
		out[i].spanID = newSpanID()
		out[i].start = time.Now()
		out[i].data = core.SpanData{Name: core.SpanAttempt, Kind: core.SpanKindClient, End: time.Now()}
	}
	return out
}

// isRunning reports whether e's posting goroutine runs.
func isRunning(e *Exporter) bool {
	e.mu.Lock()
	r := e.running
	e.mu.Unlock()
	return r
}

// waitIdle waits until e's posting goroutine has ended (it broadcasts on
// e.cond when it does).
func waitIdle(e *Exporter) {
	e.mu.Lock()
	for e.running {
		e.cond.Wait()
	}
	e.mu.Unlock()
}

// Making exporters starts nothing; the first span starts the one
// goroutine, which ends once the queue is empty.
func TestNoGoroutineBeforeTheFirstSpan(t *testing.T) {
	c := startCollector(t, http.StatusOK, false)
	before := goroutinesOfOurs()
	var made []*Exporter
	for i := 0; i < 50; i++ {
		made = append(made, newTestExporter(t, Options{Endpoint: c.srv.URL}))
	}
	if after := goroutinesOfOurs(); after > before {
		t.Fatalf("50 NewExporter calls started goroutines: %d before, %d after", before, after)
	}
	e := made[0]
	if isRunning(e) {
		t.Fatal("an exporter with no span runs its goroutine")
	}
	enqueue(e, testSpans(2))
	if !isRunning(e) {
		t.Fatal("the first span did not start the posting goroutine")
	}
	enqueue(e, testSpans(2)) // the same goroutine takes it
	post := c.next(t)        // after the interval (1 s), both requests in one post
	spans, _, _ := otlpSpans(t, decoded(t, post.body))
	if len(spans) != 4 {
		t.Errorf("first post has %d spans, want the 4 queued within the interval", len(spans))
	}
	waitIdle(e) // ends by itself: the queue is empty
	if s := e.Stats(); s.Exported != 4 {
		t.Errorf("exported %d spans, want 4", s.Exported)
	}
	for _, other := range made[1:] {
		if isRunning(other) {
			t.Fatal("an exporter that never had a span runs its goroutine")
		}
	}
}

// A full queue drops a request's spans whole and counts them; what was
// queued is still sent.
func TestQueueBoundAndDrops(t *testing.T) {
	c := startCollector(t, http.StatusOK, true)
	e := newTestExporter(t, Options{Endpoint: c.srv.URL, MaxQueue: 6, BatchSize: 3, Interval: time.Hour})
	enqueue(e, testSpans(3)) // a full batch: posted at once, and held
	c.next(t)
	enqueue(e, testSpans(3))
	enqueue(e, testSpans(2))
	enqueue(e, testSpans(2)) // 7 queued would pass the bound of 6: dropped whole
	enqueue(e, testSpans(1)) // fits
	if s := e.Stats(); s.Dropped != 2 {
		t.Fatalf("dropped %d spans, want 2 (one request's, whole)", s.Dropped)
	}
	c.release()
	got := 0
	for got < 6 {
		spans, _, _ := otlpSpans(t, decoded(t, c.next(t).body))
		got += len(spans)
	}
	e.Close()
	if s := e.Stats(); s.Exported != 9 || s.Dropped != 2 || s.FailedPosts != 0 {
		t.Errorf("stats %+v, want 9 exported, 2 dropped, no failure", s)
	}
	enqueue(e, testSpans(2))
	if s := e.Stats(); s.Dropped != 4 {
		t.Errorf("after Close: dropped %d, want 4 (spans after Close are dropped)", s.Dropped)
	}
}

// A batch waits at most the interval for more spans.
func TestIntervalSendsAPartialBatch(t *testing.T) {
	c := startCollector(t, http.StatusOK, false)
	e := newTestExporter(t, Options{Endpoint: c.srv.URL, Interval: 20 * time.Millisecond})
	for round := 0; round < 3; round++ {
		enqueue(e, testSpans(2))
		spans, _, _ := otlpSpans(t, decoded(t, c.next(t).body))
		if len(spans) != 2 {
			t.Fatalf("round %d: %d spans posted, want 2", round, len(spans))
		}
		waitIdle(e)
	}
}

// Failed posts are counted, their spans lost, and the reason holds no
// header value and no URL.
func TestFailuresAreCountedWithoutSecrets(t *testing.T) {
	c := startCollector(t, http.StatusServiceUnavailable, false)
	headers := map[string]string{"Authorization": "Bearer sekrit-token"}
	e := newTestExporter(t, Options{Endpoint: c.srv.URL + "/otlp/v1/traces", Headers: headers, BatchSize: 2})
	enqueue(e, testSpans(2))
	if p := c.next(t); p.path != "/otlp/v1/traces" {
		t.Errorf("posted to %s, want the endpoint's own path /otlp/v1/traces", p.path)
	}
	waitIdle(e)
	s := e.Stats()
	if s.FailedPosts != 1 || s.FailedSpans != 2 || s.Exported != 0 || s.LastError != "status 503" {
		t.Errorf("stats %+v, want 1 failed post of 2 spans, last error \"status 503\"", s)
	}

	// An endpoint that refuses connections (a key in its query).
	down := startCollector(t, http.StatusOK, false)
	url := down.srv.URL + "/v1/traces?api_key=sekrit"
	down.srv.Close()
	e2 := newTestExporter(t, Options{Endpoint: url, Headers: headers, BatchSize: 1})
	enqueue(e2, testSpans(1))
	e2.Close()
	s = e2.Stats()
	if s.FailedPosts != 1 || s.LastError == "" {
		t.Fatalf("stats %+v, want one failed post with a reason", s)
	}
	for _, secret := range []string{"sekrit", "api_key"} {
		if strings.Contains(s.LastError, secret) {
			t.Errorf("last error %q holds %q", s.LastError, secret)
		}
	}
}

func TestTracesURL(t *testing.T) {
	for _, c := range []struct{ in, want, err string }{
		{"http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces", ""},
		{" https://collector:4318/ ", "https://collector:4318/v1/traces", ""},
		{"http://collector:4318/v1/traces", "http://collector:4318/v1/traces", ""},
		{"https://otlp.vendor.example/api/v2/otlp/v1/traces?tenant=a", "https://otlp.vendor.example/api/v2/otlp/v1/traces?tenant=a", ""},
		{"", "", "endpoint is empty"},
		{"collector:4318", "", "scheme"},
		{"grpc://collector:4317", "", `scheme "grpc"`},
		{"http://", "", "no host"},
		{"http://user:s3cr3t@collector:4318", "", "carries credentials"},
		{"http://a b:1/\x7f", "", "not a URL"},
	} {
		got, err := TracesURL(c.in)
		switch {
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("TracesURL(%q) = %q, %v; want %q", c.in, got, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("TracesURL(%q) error %v, want one mentioning %q", c.in, err, c.err)
		}
	}
}

func TestCheckHeaders(t *testing.T) {
	if err := CheckHeaders(map[string]string{"Authorization": "Bearer x", "x-tenant_id": "a"}); err != nil {
		t.Errorf("valid headers: %v", err)
	}
	err := CheckHeaders(map[string]string{"Bad Name": "v"})
	if err == nil || !strings.Contains(err.Error(), `"Bad Name"`) {
		t.Errorf("a name with a space: %v, want an error naming it", err)
	}
	err = CheckHeaders(map[string]string{"Authorization": "Bearer sekrit\r\nX-Evil: 1"})
	if err == nil || !strings.Contains(err.Error(), "Authorization") || strings.Contains(err.Error(), "sekrit") {
		t.Errorf("a value with a line break: %v, want an error naming the header, not its value", err)
	}
	if _, err := NewExporter(Options{Endpoint: "http://c:4318", Headers: map[string]string{"A:B": "x"}}); err == nil {
		t.Error("NewExporter accepted an invalid header name")
	}
}

// goroutinesOfOurs counts the goroutines started neither by net/http (the
// connections of other tests' clients and servers come and go on their
// own) nor by a timer firing (another test's): what is left says whether
// the code under test started one.
func goroutinesOfOurs() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\ngoroutine ") {
		if !strings.Contains(g, "\ncreated by net/http.") && !strings.Contains(g, "\ncreated by time.goFunc") {
			count++
		}
	}
	return count
}
