package lighttrace

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults of Options.
const (
	DefaultMaxQueue  = 2048             // spans waiting for export
	DefaultBatchSize = 512              // spans per post
	DefaultInterval  = time.Second      // longest a span waits for its post
	DefaultTimeout   = 10 * time.Second // bound of one post, as OpenTelemetry's exporters
)

// TracesPath is where an OTLP/HTTP collector takes traces.
const TracesPath = "/v1/traces"

// Options configure an Exporter.
type Options struct {
	// Endpoint is the collector's URL, http or https. Without a path (or
	// with "/") spans are posted to Endpoint+TracesPath; a path is used
	// as it is (Traefik's tracing.otlp.http.endpoint reads the same way).
	Endpoint string
	// ServiceName is the resource's service.name.
	ServiceName string
	// Headers are sent with every post (an API key, a tenant). Their
	// values are never logged nor put in an error.
	Headers map[string]string
	// MaxQueue bounds the spans waiting for export; a request's spans
	// that do not fit are dropped together and counted. Default 2048.
	MaxQueue int
	// BatchSize is the most spans one post carries; a full batch is sent
	// at once. Default 512.
	BatchSize int
	// Interval is how long the first span of a batch waits for more
	// before the batch is sent. Default 1s.
	Interval time.Duration
	// Timeout bounds one post. Default 10s.
	Timeout time.Duration
	// Transport posts the spans; nil: a transport of the exporter's own,
	// with the proxy of the environment.
	Transport http.RoundTripper
}

// Stats counts what became of an exporter's spans.
type Stats struct {
	Exported    uint64 // spans in posts the collector accepted (2xx)
	Dropped     uint64 // spans dropped because the queue was full (or the exporter closed)
	FailedPosts uint64 // posts that got no 2xx answer
	FailedSpans uint64 // spans in those posts, lost (posts are not retried)
	// LastError describes the latest failed post: its status, or the
	// transport's error without the URL. Never a header value.
	LastError string
}

// Exporter posts spans to an OTLP/HTTP collector in OTLP's JSON encoding.
// It starts nothing when made: the goroutine that posts starts with the
// first span and ends when the queue is empty. Safe for concurrent use.
type Exporter struct {
	url       string
	service   string
	headers   http.Header
	client    *http.Client
	maxQueue  int
	batchSize int
	interval  time.Duration

	mu      sync.Mutex
	cond    *sync.Cond // broadcast on every change run or Close waits for
	queue   []span
	running bool // the posting goroutine is running
	due     bool // a batch is due: full, or its interval passed
	armed   bool // the interval timer is set for the queue's first span
	closed  bool
	timer   *time.Timer
	fire    func() // the timer's function, made once
	stats   Stats
}

// NewExporter checks opts and returns an exporter. It starts no goroutine,
// opens no connection and sends nothing.
func NewExporter(opts Options) (*Exporter, error) {
	u, err := TracesURL(opts.Endpoint)
	if err != nil {
		return nil, err
	}
	if err := CheckHeaders(opts.Headers); err != nil {
		return nil, err
	}
	e := &Exporter{url: u, service: opts.ServiceName, headers: make(http.Header, len(opts.Headers)),
		maxQueue: opts.MaxQueue, batchSize: opts.BatchSize, interval: opts.Interval}
	for k, v := range opts.Headers {
		e.headers.Set(k, v)
	}
	if e.maxQueue <= 0 {
		e.maxQueue = DefaultMaxQueue
	}
	if e.batchSize <= 0 {
		e.batchSize = DefaultBatchSize
	}
	if e.interval <= 0 {
		e.interval = DefaultInterval
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	transport := opts.Transport
	if transport == nil {
		transport = newTransport()
	}
	// No redirects: a redirect to another host would carry the headers
	// (an API key) there.
	e.client = &http.Client{Transport: transport, Timeout: timeout, CheckRedirect: refuseRedirect}
	e.cond = sync.NewCond(&e.mu)
	e.fire = func() { timerFired(e) }
	return e, nil
}

// refuseRedirect answers a post with the redirect itself (a failed post).
func refuseRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// newTransport is an exporter's own transport: a connection or two to
// the collector, closed after 90 s unused.
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		MaxIdleConns:        2,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true,
	}
}

// URL is where the exporter posts.
func (e *Exporter) URL() string { return e.url }

// Stats returns the exporter's counts.
func (e *Exporter) Stats() Stats {
	e.mu.Lock()
	s := e.stats
	e.mu.Unlock()
	return s
}

// Close posts the spans queued, waits for the posting goroutine to end
// and drops every span queued after it. For tests and embedders that own
// the exporter; the Traefik plugin, which is never told it is gone, never
// closes its exporters (their goroutine ends with the queue anyway).
func (e *Exporter) Close() {
	e.mu.Lock()
	e.closed = true
	e.cond.Broadcast()
	for e.running {
		e.cond.Wait()
	}
	if e.timer != nil {
		e.timer.Stop()
	}
	e.armed = false
	e.mu.Unlock()
}

// enqueue queues a request's spans, all or none (a tree without its root
// would be orphans), and starts the posting goroutine if it is not
// running.
func enqueue(e *Exporter, spans []span) {
	e.mu.Lock()
	if e.closed || len(e.queue)+len(spans) > e.maxQueue {
		e.stats.Dropped += uint64(len(spans))
		e.mu.Unlock()
		return
	}
	e.queue = append(e.queue, spans...)
	if len(e.queue) >= e.batchSize {
		e.due = true
	} else if !e.armed {
		armLocked(e)
	}
	if !e.running {
		e.running = true
		go run(e)
	} else if e.due {
		e.cond.Broadcast()
	}
	e.mu.Unlock()
}

// armLocked sets the interval timer; e.mu is held.
func armLocked(e *Exporter) {
	e.armed = true
	if e.timer == nil {
		e.timer = time.AfterFunc(e.interval, e.fire)
		return
	}
	e.timer.Reset(e.interval)
}

// timerFired makes the queued batch due. A timer stopped too late to
// keep it from firing finds armed false, or at worst sends a batch early.
func timerFired(e *Exporter) {
	e.mu.Lock()
	if e.armed {
		e.due = true
		e.cond.Broadcast()
	}
	e.mu.Unlock()
}

// run is the posting goroutine: it waits for a due batch, posts it, and
// ends when the queue is empty. Waits are on a sync.Cond, not a select
// (unsafe under Yaegi).
func run(e *Exporter) {
	e.mu.Lock()
	for {
		for !e.due && !e.closed {
			e.cond.Wait()
		}
		batch := takeLocked(e)
		e.mu.Unlock()
		if len(batch) > 0 {
			post(e, batch)
		}
		e.mu.Lock()
		if len(e.queue) == 0 {
			e.running = false
			e.cond.Broadcast()
			e.mu.Unlock()
			return
		}
	}
}

// takeLocked takes the next batch off the queue and sets what is due
// next; e.mu is held.
func takeLocked(e *Exporter) []span {
	n := len(e.queue)
	if n > e.batchSize {
		n = e.batchSize
	}
	batch := e.queue[:n:n]
	if n == len(e.queue) {
		e.queue = nil
	} else {
		e.queue = append([]span(nil), e.queue[n:]...)
	}
	if len(e.queue) >= e.batchSize {
		e.due = true
		return batch
	}
	e.due = false
	if e.armed {
		e.timer.Stop()
		e.armed = false
	}
	if len(e.queue) > 0 {
		armLocked(e)
	}
	return batch
}

// post sends one batch and counts the result.
func post(e *Exporter, batch []span) {
	failure := send(e, encodeBatch(e.service, batch))
	n := uint64(len(batch))
	e.mu.Lock()
	if failure == "" {
		e.stats.Exported += n
	} else {
		e.stats.FailedPosts++
		e.stats.FailedSpans += n
		e.stats.LastError = failure
	}
	e.mu.Unlock()
}

// send posts body; it returns "" when the collector accepted it, else
// why not. The reason never holds a header value, nor the URL (the
// client's error is unwrapped from its *url.Error).
func send(e *Exporter, body string) string {
	req, err := http.NewRequest(http.MethodPost, e.url, strings.NewReader(body))
	if err != nil {
		return "request: " + innerError(err)
	}
	for k, v := range e.headers {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		return "post: " + innerError(err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return "status " + strconv.Itoa(resp.StatusCode)
	}
	return ""
}

// innerError is err without the URL a *url.Error adds.
func innerError(err error) string {
	if ue, ok := err.(*url.Error); ok {
		return ue.Op + ": " + ue.Err.Error()
	}
	return err.Error()
}

// TracesURL is the URL spans are posted to for endpoint, an http or https
// URL: endpoint+TracesPath when it has no path (or "/"), else endpoint as
// it is. Errors do not repeat a password or query the URL may hold.
func TracesURL(endpoint string) (string, error) {
	endpoint = strings.TrimSpace(endpoint)
	if endpoint == "" {
		return "", errors.New("endpoint is empty: want the collector's URL, e.g. http://collector:4318")
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", errors.New("endpoint is not a URL (want e.g. http://collector:4318)")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("endpoint scheme %q: want http or https (e.g. http://collector:4318)", u.Scheme)
	}
	if u.Host == "" {
		return "", errors.New("endpoint has no host (want e.g. http://collector:4318)")
	}
	if u.User != nil {
		// A credential belongs in the headers, which no error or log
		// line repeats.
		return "", errors.New("endpoint carries credentials (user:password@): put them in the headers")
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = TracesPath
		u.RawPath = ""
	}
	u.Fragment = ""
	return u.String(), nil
}

// CheckHeaders reports a header that cannot be sent: a name that is not an
// HTTP token, a value with a line break or NUL. The error names the
// header, never its value.
func CheckHeaders(h map[string]string) error {
	for name, value := range h {
		if !isToken(name) {
			return fmt.Errorf("header name %q is not a valid HTTP header name", name)
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return fmt.Errorf("header %s: its value holds a line break or NUL", name)
		}
	}
	return nil
}

// isToken reports whether s is an RFC 9110 token (a header name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		// Plain ifs: Yaegi v0.16.1 misreads a tagless switch whose case
		// lists several conditions and has an empty body.
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && strings.IndexByte("!#$%&'*+-.^_`|~", c) < 0 {
			return false
		}
	}
	return true
}
