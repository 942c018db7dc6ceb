package core

import (
	"container/list"
	"context"
	"net/http"
	"sync"
	"time"
)

// StoredResponse is a completed response kept for replays.
type StoredResponse struct {
	// Fingerprint of the request (method, path, body) that produced it.
	Fingerprint string
	Status      int
	Header      http.Header
	Body        []byte
}

func (s *StoredResponse) size() int64 {
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
// for concurrent use and bounded; the in-memory default is.
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
	e := &memoryEntry{key: key, resp: resp, expires: m.clock.Now().Add(ttl), size: resp.size()}
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

// idempotencyTable joins requests with the same key: while a race runs its
// response is recorded in a flight that later requests with the same key
// follow, and when it completes it is stored for replays.
type idempotencyTable struct {
	mu      sync.Mutex
	flights map[string]*flight
	store   Store
}

func newIdempotencyTable(store Store) *idempotencyTable {
	return &idempotencyTable{flights: make(map[string]*flight), store: store}
}

// claim looks key up. It returns exactly one of: a stored response to
// replay, a flight to follow, or a new flight this request leads (and must
// finish). conflict is true when the key was used with another request.
func (t *idempotencyTable) claim(key, fingerprint string, maxBytes int) (replay *StoredResponse, follow *flight, lead *flight, conflict bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f, ok := t.flights[key]; ok {
		if f.fingerprint != fingerprint {
			return nil, nil, nil, true
		}
		return nil, f, nil, false
	}
	if s, ok := t.store.Get(key); ok {
		if s.Fingerprint != fingerprint {
			return nil, nil, nil, true
		}
		return s, nil, nil, false
	}
	f := newFlight(fingerprint, maxBytes)
	t.flights[key] = f
	return nil, nil, f, false
}

// finish ends the leader's flight: followers see the end, and a complete 2xx
// response that fitted is stored for ttl.
func (t *idempotencyTable) finish(key string, f *flight, ok bool, ttl time.Duration) {
	f.end(ok)
	t.mu.Lock()
	delete(t.flights, key)
	t.mu.Unlock()
	if ok && !f.overflow && f.status >= 200 && f.status < 300 {
		t.store.Put(key, &StoredResponse{Fingerprint: f.fingerprint, Status: f.status, Header: f.header, Body: f.body}, ttl)
	}
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
	header   http.Header
	body     []byte
	overflow bool // the response outgrew maxBytes; its bytes are gone
	done     bool
	ok       bool // the leader's response completed normally
}

func newFlight(fingerprint string, maxBytes int) *flight {
	f := &flight{fingerprint: fingerprint, maxBytes: maxBytes}
	f.cond = sync.NewCond(&f.mu)
	return f
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

func (f *flight) end(ok bool) {
	f.mu.Lock()
	f.done = true
	f.ok = ok
	f.cond.Broadcast()
	f.mu.Unlock()
}

// follow streams the flight to w as the leader produces it. It returns
// whether the whole response was delivered.
func (f *flight) follow(ctx context.Context, w http.ResponseWriter) (status int, complete bool) {
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
		overflow, done, ok := f.overflow, f.done, f.ok
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
			writeJSONError(w, http.StatusConflict, "idempotency_key_in_use",
				"a request with this idempotency key was in flight and its response cannot be shared; retry the request")
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
				return st, ok
			}
		}
	}
}

// flightWriter is the leader's writer: everything sent to the client is
// recorded in the flight too.
type flightWriter struct {
	w      http.ResponseWriter
	f      *flight
	status int
}

func (fw *flightWriter) Header() http.Header { return fw.w.Header() }

func (fw *flightWriter) WriteHeader(status int) {
	if fw.status != 0 {
		return
	}
	fw.status = status
	fw.f.start(status, fw.w.Header().Clone())
	fw.w.WriteHeader(status)
}

func (fw *flightWriter) Write(p []byte) (int, error) {
	if fw.status == 0 {
		fw.WriteHeader(http.StatusOK)
	}
	fw.f.write(p)
	return fw.w.Write(p)
}

func (fw *flightWriter) Flush() { flush(fw.w) }
