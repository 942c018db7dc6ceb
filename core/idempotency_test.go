package core

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

func keyed(body, key string) *http.Request {
	r := chatRequest(body)
	r.Header.Set("Idempotency-Key", key)
	return r
}

// A second request with the same key while the first is in flight joins the
// same race: one set of upstream attempts, the same bytes for both.
func TestIdempotentJoinSharesOneRace(t *testing.T) {
	hs := newHarness(t, testConfig())
	first := hs.serve(keyed("", "k1"))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("one"))
	second := hs.serve(keyed("", "k1"))
	// The follower is attached once it reports; the leader's stream goes on.
	a.write(tokenChunk("two"))
	a.end()
	r1, r2 := <-first, <-second
	want := tokenChunk("one") + tokenChunk("two")
	if bodyOf(r1) != want {
		t.Fatalf("bodyOf(r1) = %v, want %v", bodyOf(r1), want)
	} else if bodyOf(r2) != want {
		t.Fatalf("bodyOf(r2) = %v, want %v", bodyOf(r2), want)
	} else if r2.rec.Code != 200 {
		t.Fatalf("r2.rec.Code = %v, want 200", r2.rec.Code)
	}
	if n := hs.tr.count(); n != 1 {
		t.Fatalf("%d upstream attempts, want 1", n)
	}
	outcomes := map[string]bool{}
	outcomes[(<-hs.reports).Outcome] = true
	outcomes[(<-hs.reports).Outcome] = true
	if !outcomes[OutcomeOK] {
		t.Fatalf("outcomes %v, want one %s (the leader)", outcomes, OutcomeOK)
	} else if !outcomes[OutcomeJoined] && !outcomes[OutcomeReplayed] {
		t.Fatalf("outcomes %v, want the twin %s or %s", outcomes, OutcomeJoined, OutcomeReplayed)
	}
}

// A follower that attaches while the leader's stream is open receives the
// rest as it comes (it is streamed, not held until the end).
func TestIdempotentFollowerStreams(t *testing.T) {
	hs := newHarness(t, testConfig())
	first := hs.serve(keyed("", "k2"))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("one"))
	fl := onlyFlight(hs)
	if fl == nil {
		t.Fatal("no flight for k2")
	}
	pw := newPipeWriter()
	done := make(chan struct{})
	go func() {
		fl.join()
		fl.follow(context.Background(), pw)
		close(done)
	}()
	if got := <-pw.writes; got != tokenChunk("one") {
		t.Fatalf("follower first write %q", got)
	}
	a.write(tokenChunk("two"))
	if got := <-pw.writes; got != tokenChunk("two") {
		t.Fatalf("follower second write %q", got)
	}
	a.end()
	<-first
	<-done
}

// The same key with another body is rejected with 422 and a JSON error, both
// while in flight and after completion.
func TestIdempotentConflict(t *testing.T) {
	hs := newHarness(t, testConfig())
	first := hs.serve(keyed("", "k3"))
	a := hs.tr.next(t)
	res := <-hs.serve(keyed(`{"model":"other","stream":true}`, "k3"))
	if res.rec.Code != 422 {
		t.Fatalf("in flight: res.rec.Code = %v, want 422", res.rec.Code)
	} else if !strings.Contains(bodyOf(res), `"code":"idempotency_key_reused"`) {
		t.Fatalf("in flight: bodyOf(res) = %q, want it to contain `\"code\":\"idempotency_key_reused\"`", bodyOf(res))
	}
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("x"))
	a.end()
	<-first
	res = <-hs.serve(keyed(`{"model":"other","stream":true}`, "k3"))
	if res.rec.Code != 422 {
		t.Fatalf("after completion: %d", res.rec.Code)
	}
}

// A completed response is replayed within the TTL without an upstream call,
// and not after it.
func TestIdempotentReplayWithinTTL(t *testing.T) {
	cfg := testConfig()
	cfg.Idempotency.TTL = config.Duration(time.Minute)
	hs := newHarness(t, cfg)
	first := hs.serve(keyed("", "k4"))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream", "X-Upstream", "A")
	a.write(tokenChunk("x"))
	a.end()
	r1 := <-first
	r2 := <-hs.serve(keyed("", "k4"))
	if bodyOf(r2) != bodyOf(r1) {
		t.Fatalf("bodyOf(r2) = %v, want %v", bodyOf(r2), bodyOf(r1))
	} else if r2.rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("r2.rec.Header().Get(\"Idempotent-Replayed\") = %q, want \"true\"", r2.rec.Header().Get("Idempotent-Replayed"))
	} else if r2.rec.Header().Get("X-Upstream") != "A" {
		t.Fatalf("r2.rec.Header().Get(\"X-Upstream\") = %q, want \"A\"", r2.rec.Header().Get("X-Upstream"))
	}
	if hs.tr.count() != 1 {
		t.Fatalf("replay called upstream")
	}
	hs.clock.Advance(time.Minute)
	out := hs.serve(keyed("", "k4"))
	c := hs.tr.next(t)
	c.respond(200, "text/event-stream")
	c.write(tokenChunk("y"))
	c.end()
	<-out
}

// Errors are not stored: a retry with the same key tries again.
func TestIdempotentErrorsAreNotReplayed(t *testing.T) {
	cfg := testConfig()
	cfg.MaxAttempts = 1
	hs := newHarness(t, cfg)
	out := hs.serve(keyed("", "k5"))
	a := hs.tr.next(t)
	a.respond(500, "application/json")
	a.end()
	<-out
	out = hs.serve(keyed("", "k5"))
	b := hs.tr.next(t)
	b.respond(200, "text/event-stream")
	b.write(tokenChunk("ok"))
	b.end()
	if res := <-out; bodyOf(res) != tokenChunk("ok") {
		t.Fatalf("got %q", bodyOf(res))
	}
}

// The store is bounded by entries and bytes (least recently used goes).
func TestMemoryStoreBounds(t *testing.T) {
	c := newFakeClock()
	s := newMemoryStore(2, 1<<20, c)
	for _, k := range []string{"a", "b", "c"} {
		s.Put(k, &StoredResponse{Status: 200, Body: []byte(k)}, time.Minute)
	}
	if _, ok := s.Get("a"); ok {
		t.Fatal("oldest entry kept past max_entries")
	}
	small := newMemoryStore(100, 300, c)
	small.Put("x", &StoredResponse{Body: make([]byte, 200)}, time.Minute)
	small.Put("y", &StoredResponse{Body: make([]byte, 200)}, time.Minute)
	if _, ok := small.Get("x"); ok {
		t.Fatalf("byte bound broken: %d bytes", small.bytes)
	} else if small.bytes > 300 {
		t.Fatalf("byte bound broken: small.bytes = %v, want <= 300", small.bytes)
	}
	small.Put("huge", &StoredResponse{Body: make([]byte, 400)}, time.Minute)
	if _, ok := small.Get("huge"); ok {
		t.Fatal("entry larger than the store kept")
	}
}

// pipeWriter is a ResponseWriter that hands each Write to the test. Its
// status and headers may be read once a write has been received.
type pipeWriter struct {
	h      http.Header
	status int
	writes chan string
}

func newPipeWriter() *pipeWriter {
	return &pipeWriter{h: make(http.Header), writes: make(chan string, 16)}
}

func (p *pipeWriter) Header() http.Header { return p.h }
func (p *pipeWriter) WriteHeader(status int) {
	if p.status == 0 {
		p.status = status
	}
}
func (p *pipeWriter) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	p.writes <- string(b)
	return len(b), nil
}

// claimDuringPut is a Store that claims the identity again while the
// leader's answer is being stored: the moment a twin could arrive in.
type claimDuringPut struct {
	Store
	table    *idempotencyTable
	identity string
	replay   *StoredResponse
	follow   *flight
	lead     *flight
}

func (s *claimDuringPut) Put(key string, resp *StoredResponse, ttl time.Duration) {
	s.replay, s.follow, s.lead, _ = s.table.claim(s.identity, "fp", 1<<20)
	s.Store.Put(key, resp, ttl)
}

// A twin that arrives while the leader's complete answer is being stored
// finds the flight or the stored answer, never an empty table that would
// make it start a second generation.
func TestIdempotentTwinDuringStoreJoins(t *testing.T) {
	store := &claimDuringPut{Store: newMemoryStore(10, 1<<20, newFakeClock()), identity: "id"}
	table := newIdempotencyTable(store)
	store.table = table
	_, _, f, _ := table.claim("id", "fp", 1<<20)
	if f == nil {
		t.Fatal("the first claim did not lead")
	}
	f.start(200, http.Header{})
	f.write([]byte("answer"))
	table.finish("id", f, true, true, time.Minute)
	if store.lead != nil {
		t.Fatal("a twin arriving while the answer was stored led a new flight, want it to follow or replay")
	}
	if store.follow == nil && store.replay == nil {
		t.Fatal("a twin arriving while the answer was stored got neither the flight nor the stored answer")
	}
}

// The leader's client closes right after [DONE], before the upstream's EOF:
// a twin arriving then follows the started flight, it does not start a
// second generation.
func TestIdempotentTwinAfterLeaderClosedAtDone(t *testing.T) {
	table := newIdempotencyTable(newMemoryStore(10, 1<<20, newFakeClock()))
	_, _, f, _ := table.claim("id", "fp", 1<<20)
	f.start(200, http.Header{})
	f.write([]byte("data: [DONE]\n\n"))
	f.leaderLeft()
	_, follow, lead, _ := table.claim("id", "fp", 1<<20)
	if lead != nil || follow != f {
		t.Fatalf("twin after the leader's client left: lead %v, follows the flight %v; want it to follow", lead != nil, follow == f)
	}
}

// The leader's client left in the middle of the answer, before any twin
// came: the race is being cancelled, so a twin leads a new flight rather
// than follow one that will be cut.
func TestIdempotentTwinAfterLeaderLeftMidStreamLeads(t *testing.T) {
	table := newIdempotencyTable(newMemoryStore(10, 1<<20, newFakeClock()))
	_, _, f, _ := table.claim("id", "fp", 1<<20)
	f.start(200, http.Header{})
	f.write([]byte(tokenChunk("one")))
	f.leaderLeft()
	_, follow, lead, _ := table.claim("id", "fp", 1<<20)
	if lead == nil || follow != nil {
		t.Fatalf("twin after the leader's client left mid-stream: lead %v, follows %v; want a new flight", lead != nil, follow != nil)
	}
}
