package probe

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The probes in this file are the constructs core and the plugin rely on.
// Each must return its id in every call, compiled and interpreted. None
// uses select.

// Event kinds of EventChannel and DeferPost.
const (
	evResult    = 1
	evTimer     = 2
	evCancelled = 3
	evFailed    = 4
)

// probeEvent is what goroutines and callbacks post to a request's channel.
type probeEvent struct {
	kind  int
	value int
}

// GoroutinePlainReceive starts a goroutine that sends id and receives it
// into a variable (never `return <-ch`).
func GoroutinePlainReceive(id int) int {
	ch := make(chan int)
	go func() { ch <- id }()
	v := <-ch
	return v
}

// EventChannel is core's race shape: an attempt goroutine, time.AfterFunc
// and context.AfterFunc post to one buffered channel that a loop reads with
// plain receives and a switch, no select.
func EventChannel(id int) int {
	events := make(chan probeEvent, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := context.AfterFunc(ctx, func() { events <- probeEvent{kind: evCancelled, value: id} })
	defer stop()
	t := time.AfterFunc(time.Millisecond, func() { events <- probeEvent{kind: evTimer, value: id} })
	defer t.Stop()
	go func() { events <- probeEvent{kind: evResult, value: id} }()
	result, timer := -1, -1
	for result < 0 || timer < 0 {
		ev := <-events
		switch ev.kind {
		case evResult:
			result = ev.value
		case evTimer:
			timer = ev.value
		default:
			return -2
		}
	}
	cancel()
	ev := <-events
	if ev.kind != evCancelled || ev.value != id || timer != id {
		return -3
	}
	return result
}

// DeferPost is core's attempt goroutine: a deferred closure posts the one
// terminal event, whose fields were set after the defer was registered.
func DeferPost(id int) int {
	events := make(chan probeEvent, 1)
	go func() {
		ev := probeEvent{kind: evFailed}
		defer func() { events <- ev }()
		ev.kind = evResult
		ev.value = id
	}()
	ev := <-events
	if ev.kind != evResult {
		return -2
	}
	return ev.value
}

// clock mirrors core.Clock: an interface whose implementation is an
// interpreted type when interpreted.
type clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) stopper
}

type stopper interface{ Stop() bool }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// AfterFunc returns the compiled *time.Timer through a variable of the
// interpreted interface type: returned directly, it would panic when
// compared with nil (see InterfaceResultNilCompare).
func (systemClock) AfterFunc(d time.Duration, f func()) stopper {
	var t stopper = time.AfterFunc(d, f)
	return t
}

// attemptLike mirrors core's attempt: a goroutine fills it, then posts it.
type attemptLike struct {
	index   int
	resp    *int
	status  int
	prefix  []byte
	firstAt time.Time
	reason  string
}

// StructFieldsOnePerStatement fills an attempt-like struct in a goroutine,
// one field per assignment statement (the calls to the clock interface on
// their own lines), posts a pointer to it and reads it back.
func StructFieldsOnePerStatement(id int) int {
	var clk clock = systemClock{}
	done := make(chan *attemptLike, 1)
	go func() {
		a := &attemptLike{index: id}
		v := id
		a.resp = &v
		a.firstAt = clk.Now()
		a.status = 200
		a.prefix = append(a.prefix, strconv.Itoa(id)...)
		a.reason = "ok"
		done <- a
	}()
	a := <-done
	if a.firstAt.IsZero() || a.status != 200 || string(a.prefix) != strconv.Itoa(id) || a.index != id {
		return -2
	}
	return *a.resp
}

// InterfaceTimer arms a timer through the clock interface with a closure
// that captures the id and posts it.
func InterfaceTimer(id int) int {
	var clk clock = systemClock{}
	ch := make(chan int, 1)
	v := id
	t := clk.AfterFunc(0, func() { ch <- v })
	got := <-ch
	if t == nil {
		return -2
	}
	t.Stop()
	return got
}

// TimerChannelReceive waits for a time.Timer with a plain receive.
func TimerChannelReceive(id int) int {
	t := time.NewTimer(time.Millisecond)
	<-t.C
	return id
}

// registry mirrors the plugin's shared registry: a map behind a mutex that
// every invocation uses.
type registry struct {
	mu  sync.Mutex
	m   map[int]int
	sum int64
}

var shared = &registry{m: make(map[int]int)}

// MutexMap stores its id in a shared map under a mutex, reads it back and
// deletes it; it also adds id to a shared sum (see MutexSum).
func MutexMap(id int) int {
	shared.mu.Lock()
	shared.m[id] = id
	shared.sum += int64(id)
	shared.mu.Unlock()
	shared.mu.Lock()
	v, ok := shared.m[id]
	delete(shared.m, id)
	shared.mu.Unlock()
	if !ok {
		return -1
	}
	return v
}

// MutexSum returns the sum of every id MutexMap saw and the entries left.
func MutexSum() (sum int64, left int) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	// len() as a later value of a multi-value return is a Yaegi bug (see
	// ReturnLenSecond): take it into a variable first.
	left = len(shared.m)
	return shared.sum, left
}

// atomicState mirrors core's atomics: int32 flags and int64 counters in
// struct fields.
type atomicState struct {
	flag  int32
	count int64
}

var atomicSum int64

// Atomics has four goroutines add to a per-call counter and set a flag,
// and adds id to a shared counter (see AtomicSum). The goroutines run a
// named function: a func literal started in a loop is a Yaegi data race
// (see ClosuresInLoop).
func Atomics(id int) int {
	s := &atomicState{}
	done := make(chan struct{}, 4)
	for i := 0; i < 4; i++ {
		go addAtomically(s, done)
	}
	for i := 0; i < 4; i++ {
		<-done
	}
	atomic.AddInt64(&atomicSum, int64(id))
	if atomic.LoadInt64(&s.count) != 100 || atomic.LoadInt32(&s.flag) != 1 {
		return -2
	}
	return id
}

func addAtomically(s *atomicState, done chan<- struct{}) {
	for j := 0; j < 25; j++ {
		atomic.AddInt64(&s.count, 1)
	}
	atomic.StoreInt32(&s.flag, 1)
	done <- struct{}{}
}

// AtomicSum returns the sum of every id Atomics saw.
func AtomicSum() int64 { return atomic.LoadInt64(&atomicSum) }

// flightLike mirrors core's idempotency flight: a leader appends under a
// mutex and broadcasts, a follower waits on the sync.Cond.
type flightLike struct {
	mu   sync.Mutex
	cond *sync.Cond
	body []byte
	done bool
}

// CondFollow has a leader goroutine write three chunks and a follower wait
// for them on a sync.Cond; a context.AfterFunc broadcast wakes it as in
// core when the client leaves.
func CondFollow(id int) int {
	f := &flightLike{}
	f.cond = sync.NewCond(&f.mu)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		f.mu.Lock()
		f.cond.Broadcast()
		f.mu.Unlock()
	})
	defer stop()
	chunk := strconv.Itoa(id) + ";"
	go func() {
		for i := 0; i < 3; i++ {
			f.mu.Lock()
			f.body = append(f.body, chunk...)
			f.cond.Broadcast()
			f.mu.Unlock()
		}
		f.mu.Lock()
		f.done = true
		f.cond.Broadcast()
		f.mu.Unlock()
	}()
	f.mu.Lock()
	for ctx.Err() == nil && !f.done {
		f.cond.Wait()
	}
	body := string(f.body)
	f.mu.Unlock()
	if body != chunk+chunk+chunk {
		return -2
	}
	return id
}

// ctxKey is an interpreted type used as a context key.
type ctxKey struct{}

// ContextValues carries the id through context.WithValue (an interpreted
// key type), cancels a child context and checks Err and Deadline.
func ContextValues(id int) int {
	parent := context.WithValue(context.Background(), ctxKey{}, id)
	ctx, cancel := context.WithTimeout(parent, time.Hour)
	_, hasDeadline := ctx.Deadline()
	cancel()
	if !hasDeadline || ctx.Err() == nil {
		return -2
	}
	v, _ := ctx.Value(ctxKey{}).(int)
	return v
}

// GoroutinesInLoop starts goroutines in a loop the way core does: a named
// function (or method) with the loop variable passed as an argument, so
// nothing captures the variable Yaegi shares across iterations and no func
// literal is re-created while an earlier one runs (see ClosuresInLoop).
func GoroutinesInLoop(id int) int {
	ch := make(chan int, 4)
	for i := 0; i < 4; i++ {
		go sendValue(ch, id*4+i)
	}
	got := make([]int, 0, 4)
	for k := 0; k < 4; k++ {
		v := <-ch
		got = append(got, v)
	}
	sort.Ints(got)
	for k, v := range got {
		if v != id*4+k {
			return -2
		}
	}
	return id
}

func sendValue(ch chan<- int, v int) { ch <- v }

// jsonDoc is an interpreted struct with JSON tags, as core's error bodies.
type jsonDoc struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
}

// JSONAndFormatting marshals and unmarshals an interpreted struct and
// round-trips the id through fmt, strings and strconv.
func JSONAndFormatting(id int) int {
	b, err := json.Marshal(jsonDoc{ID: id, Name: fmt.Sprintf("n-%d", id)})
	if err != nil || !json.Valid(b) {
		return -2
	}
	var d jsonDoc
	if json.Unmarshal(b, &d) != nil || d.Name != "n-"+strconv.Itoa(d.ID) {
		return -3
	}
	var sb strings.Builder
	sb.WriteString("id=")
	sb.WriteString(strconv.Itoa(d.ID))
	n, err := strconv.Atoi(strings.TrimPrefix(sb.String(), "id="))
	if err != nil {
		return -4
	}
	return n
}

// BufioLines scans an SSE-like text line by line with bufio.Scanner.
func BufioLines(id int) int {
	text := fmt.Sprintf(": ping\n\ndata: %d\n\ndata: [DONE]\n\n", id)
	sc := bufio.NewScanner(strings.NewReader(text))
	got := -1
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "data: "); ok && v != "[DONE]" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return -2
			}
			got = n
		}
	}
	return got
}

// The HTTP probe talks to a server the test starts; its URL is set once
// with SetBaseURL before the probe runs.
var (
	httpMu     sync.Mutex
	httpBase   string
	httpClient *http.Client
)

// SetBaseURL sets the server of HTTPStream and a client of its own.
func SetBaseURL(u string) {
	httpMu.Lock()
	defer httpMu.Unlock()
	httpBase = u
	httpClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
}

// CloseIdle closes the HTTP probe's idle connections.
func CloseIdle() {
	httpMu.Lock()
	defer httpMu.Unlock()
	if httpClient != nil {
		httpClient.CloseIdleConnections()
	}
}

// HTTPStream requests /?id=N with an http.Client under a cancellable
// context and reads the streamed "data: N" lines with a bufio.Reader.
func HTTPStream(id int) int {
	httpMu.Lock()
	base, client := httpBase, httpClient
	httpMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/?id="+strconv.Itoa(id), nil)
	if err != nil {
		return -2
	}
	resp, err := client.Do(req)
	if err != nil {
		return -3
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	got := -1
	for {
		line, err := br.ReadString('\n')
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok {
			n, convErr := strconv.Atoi(v)
			if convErr != nil || (got >= 0 && n != got) {
				return -4
			}
			got = n
		}
		if err == io.EOF {
			return got
		}
		if err != nil {
			return -5
		}
	}
}
