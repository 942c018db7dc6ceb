// Package lightload is a load client for overhead benchmarks that costs
// the machine as little as possible, so that a benchmark on a small shared
// machine measures the proxy rather than the client.
//
// Each of N connections writes one fixed, pre-built HTTP/1.1 request at a
// time over a kept-alive TCP connection and reads the answer with a minimal
// reader (status line, headers, a Content-Length or chunked body), without
// net/http, header maps, or per-request allocations beyond the first
// answer's buffers. It checks only the status and, optionally, how the body
// ends: the benchmarks that check answers byte for byte use refload.
//
// ProcessCPU reads a process's CPU time from /proc, so that a benchmark can
// report the proxy's own CPU per request next to the requests per second.
package lightload

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options configures a Run.
type Options struct {
	// Addr is the host:port to connect to.
	Addr string
	// Request is the whole request as written on the wire, sent again and
	// again on each connection. Build it with NewRequest.
	Request []byte
	// Conns is the number of concurrent connections (default 1).
	Conns int
	// N is the number of requests over all connections.
	N int
	// WantStatus is the status every answer must have (default 200).
	WantStatus int
	// WantSuffix, if not empty, is how every answer's body must end (an SSE
	// stream's "data: [DONE]\n\n"): a stream cut short counts as failed.
	WantSuffix []byte
	// Timeout bounds each request's read and write (default 10s).
	Timeout time.Duration
}

// Result is what a Run measured.
type Result struct {
	// Requests is the number of answers read whole, with the wanted
	// status and suffix.
	Requests int
	// Failed is the number of requests that failed (connection errors,
	// a wrong status or body); a failed connection is dialled again.
	Failed int
	// Errors holds the first few failures.
	Errors []error
	// Wall is the time from the first request to the last answer.
	Wall time.Duration
	// BodyBytes is the sum of the bodies' sizes.
	BodyBytes int64
}

// RPS is the requests per second of the answers read whole.
func (r Result) RPS() float64 {
	if r.Wall <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Wall.Seconds()
}

// NewRequest builds a keep-alive HTTP/1.1 request with a body, for
// Options.Request. header lines are "Name: value".
func NewRequest(method, host, path, body string, header ...string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, path, host)
	for _, h := range header {
		b.WriteString(h)
		b.WriteString("\r\n")
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(body), body)
	return b.Bytes()
}

// maxErrors is how many failures a Result keeps.
const maxErrors = 5

// Run sends o.N requests over o.Conns connections and returns what it
// measured. It returns early, counting the rest as not sent, when ctx ends.
func Run(ctx context.Context, o Options) Result {
	if o.Conns <= 0 {
		o.Conns = 1
	}
	if o.WantStatus == 0 {
		o.WantStatus = 200
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	var (
		next    atomic.Int64 // requests handed out
		mu      sync.Mutex
		res     Result
		workers sync.WaitGroup
	)
	start := time.Now()
	for c := 0; c < o.Conns; c++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			w := worker{o: &o}
			defer w.close()
			var ok, failed int
			var bodyBytes int64
			var errs []error
			for next.Add(1) <= int64(o.N) && ctx.Err() == nil {
				n, err := w.do()
				if err != nil {
					failed++
					if len(errs) < maxErrors {
						errs = append(errs, err)
					}
					w.close()
					continue
				}
				ok++
				bodyBytes += int64(n)
			}
			mu.Lock()
			res.Requests += ok
			res.Failed += failed
			res.BodyBytes += bodyBytes
			for _, err := range errs {
				if len(res.Errors) < maxErrors {
					res.Errors = append(res.Errors, err)
				}
			}
			mu.Unlock()
		}()
	}
	workers.Wait()
	res.Wall = time.Since(start)
	return res
}

// worker is one connection and its reusable buffers.
type worker struct {
	o    *Options
	conn net.Conn
	r    *bufio.Reader
	body []byte
}

func (w *worker) close() {
	if w.conn != nil {
		w.conn.Close()
		w.conn = nil
	}
}

// do sends the request once and reads the answer; it returns the body's
// size.
func (w *worker) do() (int, error) {
	if w.conn == nil {
		conn, err := net.DialTimeout("tcp", w.o.Addr, w.o.Timeout)
		if err != nil {
			return 0, err
		}
		w.conn = conn
		if w.r == nil {
			w.r = bufio.NewReaderSize(conn, 16<<10)
		} else {
			w.r.Reset(conn)
		}
	}
	if err := w.conn.SetDeadline(time.Now().Add(w.o.Timeout)); err != nil {
		return 0, err
	}
	if _, err := w.conn.Write(w.o.Request); err != nil {
		return 0, err
	}
	status, length, chunked, closing, err := readHead(w.r)
	if err != nil {
		return 0, err
	}
	w.body = w.body[:0]
	switch {
	case chunked:
		w.body, err = readChunked(w.r, w.body)
	case length >= 0:
		w.body, err = readN(w.r, w.body, length)
	default:
		// No length: the body runs to the end of the connection.
		var rest []byte
		rest, err = io.ReadAll(w.r)
		w.body = append(w.body, rest...)
		closing = true
	}
	if err != nil {
		return 0, err
	}
	if closing {
		w.close()
	}
	if status != w.o.WantStatus {
		return 0, fmt.Errorf("status %d, want %d: %.200q", status, w.o.WantStatus, w.body)
	}
	if len(w.o.WantSuffix) > 0 && !bytes.HasSuffix(w.body, w.o.WantSuffix) {
		return 0, fmt.Errorf("body of %d bytes does not end with %q: ...%q", len(w.body), w.o.WantSuffix, tail(w.body, 80))
	}
	return len(w.body), nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// readHead reads a status line and headers. length is -1 when there is no
// Content-Length.
func readHead(r *bufio.Reader) (status, length int, chunked, closing bool, err error) {
	line, err := readLine(r)
	if err != nil {
		return 0, 0, false, false, err
	}
	// "HTTP/1.1 200 OK"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, 0, false, false, fmt.Errorf("bad status line %.100q", line)
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, 0, false, false, fmt.Errorf("bad status line %.100q", line)
	}
	closing = line[7] == '0' // HTTP/1.0 closes unless told otherwise
	length = -1
	for {
		line, err = readLine(r)
		if err != nil {
			return 0, 0, false, false, err
		}
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon < 0 {
			continue
		}
		name, value := line[:colon], bytes.TrimSpace(line[colon+1:])
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			length, err = strconv.Atoi(string(value))
			if err != nil || length < 0 {
				return 0, 0, false, false, fmt.Errorf("bad Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			closing = bytes.EqualFold(value, []byte("close"))
		}
	}
	// 1xx, 204 and 304 answers have no body.
	if status < 200 || status == 204 || status == 304 {
		length = 0
		chunked = false
	}
	return status, length, chunked, closing, nil
}

// readLine reads a line without its CRLF. The slice is valid until the
// next read.
func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errors.New("header line too long")
		}
		return nil, err
	}
	return bytes.TrimRight(line, "\r\n"), nil
}

// readN appends n bytes of r to body.
func readN(r *bufio.Reader, body []byte, n int) ([]byte, error) {
	start := len(body)
	for cap(body) < start+n {
		body = append(body[:cap(body)], 0)
	}
	body = body[:start+n]
	_, err := io.ReadFull(r, body[start:])
	return body, err
}

// readChunked appends a chunked body to body, and skips its trailers.
func readChunked(r *bufio.Reader, body []byte) ([]byte, error) {
	for {
		line, err := readLine(r)
		if err != nil {
			return body, err
		}
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i]
		}
		size, err := strconv.ParseInt(strings.TrimSpace(string(line)), 16, 32)
		if err != nil || size < 0 {
			return body, fmt.Errorf("bad chunk size %.40q", line)
		}
		if size == 0 {
			for {
				trailer, err := readLine(r)
				if err != nil || len(trailer) == 0 {
					return body, err
				}
			}
		}
		if body, err = readN(r, body, int(size)); err != nil {
			return body, err
		}
		if crlf, err := readLine(r); err != nil || len(crlf) != 0 {
			return body, fmt.Errorf("chunk not followed by CRLF (%v)", err)
		}
	}
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go runs on.
const clockTicks = 100

// ProcessCPU returns the CPU time (user + system) process pid has used so
// far, from /proc/<pid>/stat, in steps of 10ms.
func ProcessCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseStatCPU(data)
}

// parseStatCPU reads utime and stime from a /proc/<pid>/stat line. The
// command name, in parentheses, may hold spaces and parentheses: the fields
// are counted from the last ')'. State is field 3 of the line, utime 14,
// stime 15.
func parseStatCPU(data []byte) (time.Duration, error) {
	paren := bytes.LastIndexByte(data, ')')
	if paren < 0 {
		return 0, fmt.Errorf("no command name in %.80q", data)
	}
	fields := strings.Fields(string(data[paren+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13", len(fields))
	}
	utime, err := strconv.ParseInt(fields[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("utime: %v", err)
	}
	stime, err := strconv.ParseInt(fields[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stime: %v", err)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// Target is one setup of a Compare: a proxy and the request to send it.
type Target struct {
	Name    string
	Options Options
	// CPU, if not nil, returns the CPU time the proxy has used so far
	// (ProcessCPU of its pid).
	CPU func() (time.Duration, error)
}

// Comparison is what Compare measured, per target in the order given.
type Comparison struct {
	Names    []string
	Requests []int
	Failed   []int
	Errors   [][]error
	Wall     []time.Duration
	CPU      []time.Duration
	// RoundRPS[i][r] is target i's requests per second in round r.
	RoundRPS [][]float64
}

// RPS is target i's requests per second over all rounds.
func (c *Comparison) RPS(i int) float64 {
	if c.Wall[i] <= 0 {
		return 0
	}
	return float64(c.Requests[i]) / c.Wall[i].Seconds()
}

// CPUPerRequest is target i's proxy CPU time per request whole.
func (c *Comparison) CPUPerRequest(i int) time.Duration {
	if c.Requests[i] == 0 {
		return 0
	}
	return c.CPU[i] / time.Duration(c.Requests[i])
}

// Failures describes each target whose requests failed, one line each: a
// benchmark reports them as errors.
func (c *Comparison) Failures() []string {
	var out []string
	for i, name := range c.Names {
		if c.Failed[i] != 0 {
			out = append(out, fmt.Sprintf("%s: %d of %d requests failed: %v", name, c.Failed[i], c.Failed[i]+c.Requests[i], c.Errors[i]))
		}
	}
	return out
}

// RoundRatios are the rounds' requests/s of target i over target j's, in
// round order.
func (c *Comparison) RoundRatios(i, j int) []float64 {
	ratios := make([]float64, len(c.RoundRPS[i]))
	for r := range ratios {
		ratios[r] = c.RoundRPS[i][r] / c.RoundRPS[j][r]
	}
	return ratios
}

// Compare runs the targets in turns, rounds times (each round starts with
// a different target, so that none always goes first), so that bursts of
// load from other processes on a shared machine hit all alike. Each run is
// one Run of the target's Options.
func Compare(ctx context.Context, rounds int, targets []Target) (*Comparison, error) {
	n := len(targets)
	c := &Comparison{Names: make([]string, n), Requests: make([]int, n), Failed: make([]int, n), Errors: make([][]error, n),
		Wall: make([]time.Duration, n), CPU: make([]time.Duration, n), RoundRPS: make([][]float64, n)}
	for i, t := range targets {
		c.Names[i] = t.Name
		c.RoundRPS[i] = make([]float64, rounds)
	}
	for r := 0; r < rounds; r++ {
		for k := 0; k < n; k++ {
			i := (r + k) % n
			t := targets[i]
			var cpu0 time.Duration
			if t.CPU != nil {
				var err error
				if cpu0, err = t.CPU(); err != nil {
					return c, fmt.Errorf("%s: CPU time: %v", t.Name, err)
				}
			}
			res := Run(ctx, t.Options)
			if t.CPU != nil {
				cpu1, err := t.CPU()
				if err != nil {
					return c, fmt.Errorf("%s: CPU time: %v", t.Name, err)
				}
				c.CPU[i] += cpu1 - cpu0
			}
			c.Requests[i] += res.Requests
			c.Failed[i] += res.Failed
			c.Wall[i] += res.Wall
			c.RoundRPS[i][r] = res.RPS()
			for _, err := range res.Errors {
				if len(c.Errors[i]) < maxErrors {
					c.Errors[i] = append(c.Errors[i], err)
				}
			}
		}
	}
	return c, ctx.Err()
}
