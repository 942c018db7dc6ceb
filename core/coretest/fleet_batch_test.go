package coretest

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// windowClock is the system clock, but for the timers of a leader's batch
// window (fleetstore.LoneBatchWindow): those wait for the test's fire.
type windowClock struct {
	mu      sync.Mutex
	pending []*windowTimer
	armed   int
	armedCh chan struct{} // gets one value per window armed
}

type windowTimer struct {
	c       *windowClock
	f       func()
	stopped bool
}

func newWindowClock() *windowClock { return &windowClock{armedCh: make(chan struct{}, 100)} }

func (c *windowClock) Now() time.Time { return time.Now() }

func (c *windowClock) AfterFunc(d time.Duration, f func()) core.Timer {
	if d != fleetstore.LoneBatchWindow {
		var t core.Timer = time.AfterFunc(d, f)
		return t
	}
	t := &windowTimer{c: c, f: f}
	c.mu.Lock()
	c.pending = append(c.pending, t)
	c.armed++
	c.mu.Unlock()
	c.armedCh <- struct{}{}
	return t
}

func (t *windowTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// fire ends every pending window, as its timer would, and returns how
// many it ended.
func (c *windowClock) fire() int {
	c.mu.Lock()
	var due []func()
	for _, t := range c.pending {
		if !t.stopped {
			t.stopped = true
			due = append(due, t.f)
		}
	}
	c.pending = nil
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
	return len(due)
}

func (c *windowClock) armedCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.armed
}

func (c *windowClock) waitArmed(t *testing.T) {
	t.Helper()
	select {
	case <-c.armedCh:
	case <-time.After(10 * time.Second): // bounds a failure only
		t.Fatal("no batch window was armed within 10s")
	}
}

// A leader nobody follows holds its data for the batch's window: an
// answer that ends within it sends its head, then all its data, the end
// marker's chunk included, with the end in one write; the stream holds
// the whole answer in order and a later request replays it.
func TestFleetLoneLeaderSendsItsDataWithTheEnd(t *testing.T) {
	clock := newWindowClock()
	rig := newFleetRigClocks(t, []core.Clock{clock}, nil)
	a := rig.replicas[0]
	// Redis learns the scripts on a first request (NOSCRIPT, then EVAL:
	// two operations counted for one write).
	if warm := a.send(t, "kb0", "alice", chatBody); !warm.complete {
		t.Fatalf("warm-up answer incomplete: %q", warm.body)
	}
	for _, s := range redisArray(t, rig.redis, "KEYS", "*:s:*") {
		redisDo(t, rig.redis, "DEL", s)
	}
	for len(clock.armedCh) > 0 { // the warm-up's windows, armed before its answer ended
		<-clock.armedCh
	}
	appendsBefore := a.sink.count(fleetstore.OpAppend)
	armedBefore := clock.armedCount()
	release := rig.upstream.hold("kb1", true) // the first event comes alone
	defer release()
	answer := a.sendAsync(t, "kb1", "alice", chatBody)
	clock.waitArmed(t) // the head is in; the first event waits for its window
	release()
	first := recvAnswer(t, answer)
	if first.status != 200 || !first.complete || !strings.Contains(first.body, "gen1-tok4") {
		t.Fatalf("answer: status %d complete %v body %q, want a complete generation 1", first.status, first.complete, first.body)
	}
	if n := clock.armedCount() - armedBefore; n != 1 {
		t.Errorf("batch windows armed = %d, want 1 (the first event's, which the rest joined; 0: the data went out as it came)", n)
	}
	if got := a.sink.count(fleetstore.OpAppend) - appendsBefore; got != 1 {
		t.Errorf("appends = %d, want 1 (the head; the data goes with the end)", got)
	}
	streams := redisArray(t, rig.redis, "KEYS", "*:s:*")
	if len(streams) != 1 {
		t.Fatalf("streams in Redis: %q, want one", streams)
	}
	stream := streams[0]
	var kinds []string
	var data strings.Builder
	for _, e := range redisDo(t, rig.redis, "XRANGE", stream, "-", "+").Array {
		fields := e.Array[1].Array
		kinds = append(kinds, fields[1].Str+fields[5].Str)
		if fields[1].Str == "d" {
			data.WriteString(fields[3].Str)
		}
	}
	if got := strings.Join(kinds, " "); got != "h1 d2 e3" {
		t.Errorf("stream entries (kind and number) %q, want \"h1 d2 e3\" (the head, the data, the end)", got)
	}
	if data.String() != first.body {
		t.Errorf("the stream's data %q differs from the answer %q", data.String(), first.body)
	}
	replay := a.send(t, "kb1", "alice", chatBody)
	if replay.body != first.body || replay.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: replayed %q, body equal %v; want the stored answer", replay.header.Get("Idempotent-Replayed"), replay.body == first.body)
	}
}

// A follower that claimed before the leader's head is reported by the
// head's write: every batch then goes at once, no window waits.
func TestFleetFollowedLeaderWritesAtOnce(t *testing.T) {
	clock := newWindowClock()
	rig := newFleetRigClocks(t, []core.Clock{clock, nil}, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	release := rig.upstream.hold("kb2", false) // before the first event: b claims before the head
	defer release()
	first := a.sendAsync(t, "kb2", "alice", chatBody)
	rig.upstream.waitStarted(t, "kb2")
	second := b.sendAsync(t, "kb2", "alice", chatBody)
	b.sink.waitClaim(t)
	release()
	ra, rb := recvAnswer(t, first), recvAnswer(t, second)
	if !ra.complete || !rb.complete || ra.body != rb.body {
		t.Fatalf("leader complete %v, follower complete %v, bodies equal %v; want both whole and equal", ra.complete, rb.complete, ra.body == rb.body)
	}
	if n := clock.armedCount(); n != 0 {
		t.Errorf("%d batch windows armed while a follower read, want 0", n)
	}
}

// A follower that joins a lone leader's answer gets the data the leader
// held once the window ends (nothing else sends it: the upstream is
// held), and the rest of the answer whole.
func TestFleetLateFollowerGetsTheHeldBatchWhenTheWindowEnds(t *testing.T) {
	clock := newWindowClock()
	rig := newFleetRigClocks(t, []core.Clock{clock, nil}, nil)
	a, b := rig.replicas[0], rig.replicas[1]
	release := rig.upstream.hold("kb3", true) // after the first event
	defer release()
	first := a.sendAsync(t, "kb3", "alice", chatBody)
	clock.waitArmed(t) // the head is in, the first event waits for its window
	resp := b.open(t, "kb3", "alice", chatBody)
	defer resp.Body.Close()
	b.sink.waitClaim(t)
	if n := clock.fire(); n != 1 {
		t.Fatalf("windows ended = %d, want 1", n)
	}
	head := make(chan []byte, 1)
	go func() {
		var read []byte
		buf := make([]byte, 4096)
		for !strings.Contains(string(read), "gen1-tok0") {
			n, err := resp.Body.Read(buf)
			read = append(read, buf[:n]...)
			if err != nil {
				break
			}
		}
		head <- read
	}()
	var body []byte
	select {
	case body = <-head:
	case <-time.After(10 * time.Second): // bounds a failure only
		t.Fatal("the follower did not get the held first event after the window ended")
	}
	if !strings.Contains(string(body), "gen1-tok0") {
		t.Fatalf("the follower's answer ended at %q, before the held first event", body)
	}
	release()
	ra := recvAnswer(t, first)
	rest, err := io.ReadAll(resp.Body)
	body = append(body, rest...)
	if err != nil || !ra.complete || string(body) != ra.body || !strings.HasSuffix(ra.body, "data: [DONE]\n\n") {
		t.Errorf("follower's answer %q (err %v), leader's %q (complete %v): want both whole and equal", body, err, ra.body, ra.complete)
	}
}

// A follower that reads a cut generation whole in one read (its head,
// the data that fitted, the cut end) gives its client the status and
// those bytes, then the break: never a connection closed unanswered. The
// leader's answer outgrows max_response_bytes, so its stream is cut after
// the data that fitted.
func TestFleetFollowerOfACutAnswerGetsTheStatusAndTheBytes(t *testing.T) {
	rig := newFleetRig(t, 2, func(c *config.Config) { c.Idempotency.MaxResponseBytes = 1024 })
	a, b := rig.replicas[0], rig.replicas[1]
	rig.upstream.mu.Lock()
	rig.upstream.size = 300 // ~360 bytes an event: two fit, the third overflows
	rig.upstream.mu.Unlock()
	release := rig.upstream.hold("kc", true)
	defer release()
	first := a.sendAsync(t, "kc", "alice", chatBody)
	rig.upstream.waitStarted(t, "kc")
	held, releaseReads := b.client.holdCommands("XREAD")
	defer releaseReads()
	second := make(chan *http.Response, 1)
	go func() { second <- b.open(t, "kc", "alice", chatBody) }()
	select {
	case <-held: // b follows; its first read waits
	case <-time.After(10 * time.Second): // bounds a failure only
		t.Fatal("the follower's read never came")
	}
	release()
	ra := recvAnswer(t, first)
	if !ra.complete || !strings.Contains(ra.body, "[DONE]") {
		t.Fatalf("leader's answer complete %v body %q, want whole", ra.complete, ra.body)
	}
	releaseReads() // the stream holds the head, the data that fitted and the cut end
	var resp *http.Response
	select {
	case resp = <-second:
	case <-time.After(10 * time.Second): // bounds a failure only
		t.Fatal("no answer to the follower")
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || err == nil || len(body) == 0 || !strings.HasPrefix(ra.body, string(body)) || strings.Contains(string(body), "[DONE]") {
		t.Errorf("follower: status %d, %d bytes (a prefix of the leader's: %v), read error %v; want 200, the bytes that fitted, then a broken body",
			resp.StatusCode, len(body), strings.HasPrefix(ra.body, string(body)), err)
	}
}
