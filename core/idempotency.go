package core

import (
	"container/list"
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/llmhedge/llmhedge/core/stream"
)

// StoredResponse is a completed response kept for replays.
type StoredResponse struct {
	// Fingerprint of the request (method, path, query, body) that produced it.
	Fingerprint string
	Status      int
	// Header is the upstream answer's, without hop-by-hop headers,
	// Set-Cookie and Content-Length (recordedHeader).
	Header http.Header
	Body   []byte
}

// Size is what the response costs a store's byte bound: its body, headers
// and fingerprint, plus a fixed overhead.
func (s *StoredResponse) Size() int64 {
	n := int64(len(s.Body)) + int64(len(s.Fingerprint)) + 64
	for k, vv := range s.Header {
		n += int64(len(k))
		for _, v := range vv {
			n += int64(len(v))
		}
	}
	return n
}

// Store keeps completed responses for replays. Implementations must be safe
// for concurrent use and bounded; the in-memory default is. Keys are
// SHA-256 hex digests of the caller and the client's idempotency key
// (idempotencyIdentity), never a raw key.
type Store interface {
	Get(key string) (*StoredResponse, bool)
	Put(key string, resp *StoredResponse, ttl time.Duration)
}

// memoryStore is a bounded LRU of completed responses with per-entry expiry.
type memoryStore struct {
	mu         sync.Mutex
	clock      Clock
	maxEntries int
	maxBytes   int64
	bytes      int64
	order      *list.List // front: most recently used
	entries    map[string]*list.Element
}

type memoryEntry struct {
	key     string
	resp    *StoredResponse
	expires time.Time
	size    int64
}

func newMemoryStore(maxEntries int, maxBytes int64, clock Clock) *memoryStore {
	return &memoryStore{clock: clock, maxEntries: maxEntries, maxBytes: maxBytes,
		order: list.New(), entries: make(map[string]*list.Element)}
}

func (m *memoryStore) Get(key string) (*StoredResponse, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	el, ok := m.entries[key]
	if !ok {
		return nil, false
	}
	e := el.Value.(*memoryEntry)
	if !m.clock.Now().Before(e.expires) {
		m.remove(el)
		return nil, false
	}
	m.order.MoveToFront(el)
	return e.resp, true
}

func (m *memoryStore) Put(key string, resp *StoredResponse, ttl time.Duration) {
	e := &memoryEntry{key: key, resp: resp, expires: m.clock.Now().Add(ttl), size: resp.Size()}
	if e.size > m.maxBytes {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.entries[key]; ok {
		m.remove(old)
	}
	m.entries[key] = m.order.PushFront(e)
	m.bytes += e.size
	for len(m.entries) > m.maxEntries || m.bytes > m.maxBytes {
		m.remove(m.order.Back())
	}
}

func (m *memoryStore) remove(el *list.Element) {
	e := el.Value.(*memoryEntry)
	m.order.Remove(el)
	delete(m.entries, e.key)
	m.bytes -= e.size
}

// idempotencyTable joins requests with the same identity (caller and key,
// see idempotencyIdentity): while a race runs its response is recorded in
// a flight that later requests with the same identity follow, and when it
// completes it is stored for replays.
type idempotencyTable struct {
	mu      sync.Mutex
	flights map[string]*flight
	store   Store
}

func newIdempotencyTable(store Store) *idempotencyTable {
	return &idempotencyTable{flights: make(map[string]*flight), store: store}
}

// claim looks identity up. It returns exactly one of: a stored response to
// replay, a flight to follow (the caller is counted as its follower and
// must follow it), or a new flight this request leads (and must finish).
// conflict is true when the identity was used with another request.
func (t *idempotencyTable) claim(identity, fingerprint string, maxBytes int) (replay *StoredResponse, follow *flight, lead *flight, conflict bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f, ok := t.flights[identity]; ok {
		if f.fingerprint != fingerprint {
			return nil, nil, nil, true
		}
		if f.join() {
			return nil, f, nil, false
		}
		// Abandoned: nobody reads it and its race is being cancelled.
		// This request leads a new flight in its place.
	}
	if s, ok := t.store.Get(identity); ok {
		if s.Fingerprint != fingerprint {
			return nil, nil, nil, true
		}
		return s, nil, nil, false
	}
	f := newFlight(fingerprint, maxBytes)
	t.flights[identity] = f
	return nil, nil, f, false
}

// finish ends the leader's flight: followers see the end (complete: the
// whole answer is in the flight, an error answer included), and when store
// is set a complete 2xx response that fitted is kept for ttl.
func (t *idempotencyTable) finish(identity string, f *flight, complete, store bool, ttl time.Duration) {
	f.end(complete)
	// Store before the flight leaves the table: a twin arriving in between
	// must find one or the other, or it would start a second generation.
	if store && !f.overflow && f.status >= 200 && f.status < 300 {
		t.store.Put(identity, &StoredResponse{Fingerprint: f.fingerprint, Status: f.status, Header: f.header, Body: f.body}, ttl)
	}
	t.mu.Lock()
	if t.flights[identity] == f {
		delete(t.flights, identity)
	}
	t.mu.Unlock()
}

// flight is one in-progress response, shared by its leader and followers.
// Followers wait on cond (no select: see the package doc) for new bytes.
type flight struct {
	fingerprint string
	maxBytes    int

	mu       sync.Mutex
	cond     *sync.Cond
	started  bool // status and header are set
	status   int
	header   http.Header // the answer's own headers (see recordedHeader)
	body     []byte
	overflow bool // the response outgrew maxBytes; its bytes are gone
	done     bool
	complete bool // the leader's answer ended cleanly and is all in body

	// Who reads the answer: the race goes on while anyone does.
	followers   int
	leaderGone  bool               // the leader's client left
	stopReaders context.CancelFunc // cancels the race once nobody reads
	// remote is set when the flight also leads the fleet's: followers on
	// other replicas read it too.
	remote *fleetLeader
}

func newFlight(fingerprint string, maxBytes int) *flight {
	f := &flight{fingerprint: fingerprint, maxBytes: maxBytes}
	f.cond = sync.NewCond(&f.mu)
	return f
}

// leadFlight returns the context the leader's race runs in: it carries the
// leader's request values and deadline but not its cancellation, and is
// cancelled once the leader's client and every follower have gone. The
// returned function releases it; call it when the race is over.
func leadFlight(f *flight, clientCtx context.Context) (context.Context, func()) {
	base := context.WithoutCancel(clientCtx)
	// One target per assignment, from := locals (Yaegi).
	ctx, cancel := context.WithCancel(base)
	if deadline, ok := clientCtx.Deadline(); ok {
		dctx, dcancel := context.WithDeadline(ctx, deadline)
		ctx = dctx
		cancelAll := cancel
		cancel = func() {
			dcancel()
			cancelAll()
		}
	}
	f.mu.Lock()
	f.stopReaders = cancel
	f.mu.Unlock()
	stopHook := context.AfterFunc(clientCtx, func() { f.leaderLeft() })
	release := func() {
		stopHook()
		cancel()
	}
	return ctx, release
}

// join counts a new follower, unless the flight is abandoned (its leader's
// client left and no follower reads); it reports whether it did.
func (f *flight) join() bool {
	f.mu.Lock()
	// A flight whose readers all left is being cancelled: a new flight
	// leads, unless the bytes already hold the whole answer (a client such
	// as the OpenAI SDK closes at [DONE], before the upstream's EOF).
	joined := !f.leaderGone || f.followers > 0 || f.started && !f.overflow && bodyFinished(f.body)
	if joined {
		f.followers++
	}
	f.mu.Unlock()
	return joined
}

// bodyFinished reports whether a flight's bytes end with a stream's end
// marker (see Finished).
func bodyFinished(body []byte) bool {
	if len(body) > tailSize {
		body = body[len(body)-tailSize:]
	}
	return stream.Finished(body)
}

// leave uncounts a follower; the last reader to go cancels the race.
func (f *flight) leave() {
	f.mu.Lock()
	f.followers--
	stop := f.followers == 0 && f.leaderGone
	cancel := f.stopReaders
	remote := f.remote
	f.mu.Unlock()
	if stop && remote != nil && fleetHasReaders(remote) {
		stop = false
	}
	if stop && cancel != nil {
		cancel()
	}
}

// leaderLeft records that the leader's client is gone and reports whether
// followers (here, or on other replicas) still read; when none does, the
// race is cancelled.
func (f *flight) leaderLeft() bool {
	f.mu.Lock()
	f.leaderGone = true
	reading := f.followers > 0
	cancel := f.stopReaders
	remote := f.remote
	f.mu.Unlock()
	if !reading && remote != nil && fleetHasReaders(remote) {
		reading = true
	}
	if !reading && cancel != nil {
		cancel()
	}
	return reading
}

// remoteReadersGone is told by the fleet leader's renewal that no
// follower on another replica reads: when the leader's client and every
// local follower left too, the race is cancelled.
func (f *flight) remoteReadersGone() {
	f.mu.Lock()
	stop := f.leaderGone && f.followers == 0
	cancel := f.stopReaders
	f.mu.Unlock()
	if stop && cancel != nil {
		cancel()
	}
}

func (f *flight) start(status int, header http.Header) {
	f.mu.Lock()
	if !f.started {
		f.started = true
		f.status = status
		f.header = header
	}
	f.cond.Broadcast()
	f.mu.Unlock()
}

func (f *flight) write(p []byte) {
	f.mu.Lock()
	if !f.overflow {
		if len(f.body)+len(p) > f.maxBytes {
			f.overflow = true
			f.body = nil
		} else {
			f.body = append(f.body, p...)
		}
	}
	f.cond.Broadcast()
	f.mu.Unlock()
}

func (f *flight) end(complete bool) {
	f.mu.Lock()
	f.done = true
	f.complete = complete
	f.cond.Broadcast()
	f.mu.Unlock()
}

// follow streams the flight to w as the leader produces it, for a follower
// that join counted. It returns whether the whole response was delivered.
func (f *flight) follow(ctx context.Context, w http.ResponseWriter) (status int, complete bool) {
	defer f.leave()
	stop := context.AfterFunc(ctx, func() {
		f.mu.Lock()
		f.cond.Broadcast()
		f.mu.Unlock()
	})
	defer stop()
	sent := 0
	headerSent := false
	for {
		f.mu.Lock()
		for ctx.Err() == nil && !f.done && !f.overflow && (!f.started || len(f.body) == sent && headerSent) {
			f.cond.Wait()
		}
		gone := ctx.Err() != nil
		started, st, hdr := f.started, f.status, f.header
		overflow, done, ended := f.overflow, f.done, f.complete
		var chunk []byte
		if started && !overflow && len(f.body) > sent {
			chunk = f.body[sent:]
		}
		f.mu.Unlock()
		if gone {
			return st, false
		}
		if !started || (overflow && !headerSent) {
			// The leader ended without a response, or its response is too
			// large to share: this follower cannot get the same answer.
			writeInFlightConflict(w)
			return http.StatusConflict, false
		}
		if !headerSent {
			copyHeader(w.Header(), hdr)
			w.WriteHeader(st)
			headerSent = true
		}
		if len(chunk) > 0 {
			if _, err := w.Write(chunk); err != nil {
				return st, false
			}
			sent += len(chunk)
			flush(w)
		}
		if overflow {
			return st, false
		}
		if done && (len(chunk) == 0) {
			f.mu.Lock()
			rest := len(f.body) - sent
			f.mu.Unlock()
			if rest == 0 {
				return st, ended
			}
		}
	}
}

// writeInFlightConflict answers a follower that cannot get the answer of
// the request it joined (too large to share, or its start is gone): 409,
// to retry with the same key (it then replays or leads anew).
func writeInFlightConflict(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	writeJSONError(w, http.StatusConflict, errTypeInvalidRequest, "idempotency_key_in_use",
		"a request with this idempotency key was in flight and its response cannot be shared; retry the request")
}

// flightWriter is the leader's writer: the answer goes to the leader's
// client and into the flight. The race writes the answer's headers into a
// map of the flightWriter's own, so that followers and replays get the
// answer's headers only, never those the host (or this request's handlers)
// had set on the client's writer.
type flightWriter struct {
	w            http.ResponseWriter
	f            *flight
	hdr          http.Header
	reportHeader string // the race's report header: not part of the answer
	status       int
	// clientGone: a write to the leader's client failed while followers
	// read; the answer goes on into the flight only.
	clientGone bool
	// remote, when this request leads a fleet flight, gets the answer too
	// for the followers on other replicas.
	remote *fleetLeader
	// refused: the leader lost its fleet lease before commit; the client
	// got a 503 to retry, and the race's answer goes nowhere.
	refused bool
	// fenced: the leader lost its lease after commit; the client's answer
	// must end broken (leadKeyed).
	fenced bool
	// tail is the answer's last bytes while it leads a fleet flight; held,
	// from the write with a stream's end marker on: what goes out only
	// with the generation's end (endAtMarker, leadKeyed).
	tail    []byte
	holding bool
	held    []byte
	// heldAtLine: held starts at a line (an event's whole lines).
	heldAtLine bool
	// rep is the race's report: only a winner's answer (OutcomeOK) is
	// stored.
	rep *Report
}

// errFleetFenced is what a leader's writer returns once its answer may no
// longer go out (see flightWriter.refused and fenced).
var errFleetFenced = errors.New("llmhedge: the fleet lease of this answer was lost")

// Header is the answer's own header map until the status is written;
// after it, only trailers are set (forwardTrailers), and they must reach
// the client's writer, which alone sends them.
func (fw *flightWriter) Header() http.Header {
	if fw.status != 0 {
		return fw.w.Header()
	}
	return fw.hdr
}

func (fw *flightWriter) WriteHeader(status int) {
	if fw.status != 0 {
		return
	}
	rec := recordedHeader(fw.hdr, fw.reportHeader)
	if fw.remote != nil && !fleetLeaderCommit(fw.remote, status, rec) {
		refuseCommit(fw)
		return
	}
	fw.status = status
	fw.f.start(status, rec)
	dst := fw.w.Header()
	copyHeader(dst, fw.hdr)
	if _, ok := fw.hdr["Content-Length"]; !ok {
		delete(dst, "Content-Length")
	}
	fw.w.WriteHeader(status)
}

func (fw *flightWriter) Write(p []byte) (int, error) {
	if fw.status == 0 {
		fw.WriteHeader(http.StatusOK)
	}
	if fw.refused || fw.fenced {
		return 0, errFleetFenced
	}
	if fw.remote != nil {
		// A client takes an answer with its end marker for whole: the
		// marker goes out only once the end is in Redis under this
		// leader's lease, to this client and the followers alike.
		if !fw.holding && stream.HasEndMarker(fw.tail, p) {
			fw.holding = true
			fw.heldAtLine = stream.AtLineStart(fw.tail)
		}
		fw.tail = keepTail(fw.tail, p)
		if fw.holding {
			fw.held = append(fw.held, p...)
			// A whole end event: nothing follows it.
			if stream.EndsWhole(fw.tail, false) || stream.EndsWhole(fw.held, fw.heldAtLine) {
				return fw.endAtMarker(len(p))
			}
			return len(p), nil
		}
		if !fleetLeaderData(fw.remote, p) {
			// Another leader may answer this key: this answer stops here,
			// for the followers in process too (the flight ends incomplete).
			fw.fenced = true
			return 0, errFleetFenced
		}
	}
	return fw.deliver(p)
}

// endAtMarker ends the fleet generation at its stream's whole end event
// (a client such as the OpenAI SDK leaves there, before the upstream's
// EOF), then delivers the held bytes; n is the current write's length.
// Whatever the upstream sends after goes to this client and the local
// flight only.
func (fw *flightWriter) endAtMarker(n int) (int, error) {
	held := fw.held
	remote := fw.remote
	// One by one: Yaegi panics on nil in a multiple assignment to fields.
	fw.held = nil
	fw.holding = false
	fw.remote = nil
	if !fleetLeaderEnd(remote, fw.f, true, fw.rep.Outcome == OutcomeOK, held) {
		fw.fenced = true
		return 0, errFleetFenced
	}
	if _, err := fw.deliver(held); err != nil {
		return 0, err
	}
	return n, nil
}

// deliver writes p to the flight and the leader's client.
func (fw *flightWriter) deliver(p []byte) (int, error) {
	fw.f.write(p)
	if fw.clientGone {
		return len(p), nil
	}
	n, err := fw.w.Write(p)
	if err != nil && fw.f.leaderLeft() {
		// Followers still read: the answer goes on to them.
		fw.clientGone = true
		return len(p), nil
	}
	return n, err
}

// refuseCommit answers the client (and the local followers) with a 503
// to retry instead of the race's answer: the leader lost its fleet lease
// before commit, so another replica may be answering the same key.
func refuseCommit(fw *flightWriter) {
	fw.remote = nil
	for k := range fw.hdr {
		delete(fw.hdr, k)
	}
	fw.hdr.Set("Retry-After", "1")
	writeJSONError(fw, http.StatusServiceUnavailable, errTypeUpstream, "idempotency_lease_lost",
		"another gateway replica took over the request with this idempotency key; retry it with the same key")
	fw.refused = true
}

func (fw *flightWriter) Flush() {
	if !fw.clientGone {
		flush(fw.w)
	}
}

// recordedHeader is what followers and replays get of an answer's
// headers: the upstream's (or the engine's own error answer's), without
// hop-by-hop headers, Set-Cookie (one response's cookies are not handed
// out again), Content-Length (a follower's copy is streamed) and the
// race's report header.
func recordedHeader(hdr http.Header, reportHeader string) http.Header {
	rec := hdr.Clone()
	removeHopHeaders(rec)
	delete(rec, "Set-Cookie")
	delete(rec, "Content-Length")
	if reportHeader != "" {
		rec.Del(reportHeader)
	}
	return rec
}
