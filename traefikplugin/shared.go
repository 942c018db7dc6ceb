package traefikplugin

import (
	"container/list"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
)

// Traefik calls New for every router that uses the middleware and again on
// every configuration reload, and never tells a plugin that an old handler
// is gone. So nothing long-lived belongs to a handler: the upstream
// transport (its connection pool) and each route's learning (TTFT
// estimators, budgets, breakers, idempotency table) live here, are created
// on the first request that needs them, and are shared by every handler of
// the same route and shape. Nothing here starts a goroutine or a timer.
//
// Without a close hook the registry judges liveness by use: every New and
// every request of a handler marks its state used (requests also sweep the
// registry now and then, at most once per sweepInterval). Traefik calls New
// for every live middleware on every reload, so the state of an unchanged
// route is used at each reload and kept. A state whose route has since been
// configured with another shape (a superseded shape) is forgotten once it
// has not been used for supersededIdle; forgetting frees its stored
// answers at once (a handler still holding it keeps hedging, without
// replays). runtime.SetFinalizer is no help: under Yaegi v0.16.1 a
// finalizer set on an interpreted value never runs and keeps the value
// alive.

const (
	// maxSharedStates bounds the route states held. When it is reached,
	// superseded shapes are forgotten first, then the least recently used.
	maxSharedStates = 1024
	// maxSharedReplyBytes bounds the answers kept for idempotent replays by
	// all route states together (raised to one route's
	// idempotency.maxBytes when that is larger): the least recently used
	// answer of any state goes first.
	maxSharedReplyBytes int64 = 256 << 20
	// supersededIdle is how long a superseded shape's state is kept unused
	// (streams of the old handler finishing, or a quick revert).
	supersededIdle = 10 * time.Minute
	// sweepInterval: superseded states are looked for at most this often.
	sweepInterval = time.Second
	// sweepEveryRequests: one request in this many plus one (a mask) of a
	// state also sweeps, so that requests alone free superseded states. A
	// counter costs a request less than reading the clock under Yaegi.
	sweepEveryRequests uint32 = 255
)

// sharedEntry is one route state and what the registry knows of its use.
type sharedEntry struct {
	key    string
	route  string
	state  *core.State // nil until the first request of one of its handlers
	store  *replyStore // the state's idempotency store, with state
	newSeq uint64      // sequence number of the latest New of this shape
	// requests counts the requests of its handlers (atomic); a sweep that
	// finds it changed since the last (seen) counts that as a use then.
	requests uint32
	seen     uint32
	lastUse  int64 // registry clock in ns of the latest use it knows of
}

// The types here never point back at their owners (an entry at its
// registry, an answer at its store): Yaegi v0.16.1 confuses the pointer
// types of mutually recursive structs and panics on such assignments.

// routeInfo is what the registry knows of one route.
type routeInfo struct {
	newest  uint64 // sequence number of the route's latest New
	entries int
}

// registry holds what outlives a handler.
type registry struct {
	mu        sync.Mutex
	transport *http.Transport
	entries   map[string]*sharedEntry // by core.StateKey
	routes    map[string]*routeInfo
	seq       uint64 // counts News
	lastSweep int64  // registry clock in ns
	replies   *replyCache

	// Limits and clock are fields so that tests can lower and drive them.
	maxEntries int
	idle       time.Duration
	now        func() time.Time // nil: time.Now
}

var shared = newRegistry()

func newRegistry() *registry {
	g := &registry{
		entries:    make(map[string]*sharedEntry),
		routes:     make(map[string]*routeInfo),
		maxEntries: maxSharedStates,
		idle:       supersededIdle,
	}
	// A closure made once: expiry follows the registry's clock.
	g.replies = newReplyCache(maxSharedReplyBytes, func() time.Time { return registryNow(g) })
	return g
}

// registryNow reads g's clock.
func registryNow(g *registry) time.Time {
	if g.now != nil {
		return g.now()
	}
	return time.Now()
}

// sweepFromRequest is how requests sweep g (one request in
// sweepEveryRequests+1 of a state, see ServeHTTP), so that superseded
// states are freed between reloads too.
func sweepFromRequest(g *registry) {
	g.mu.Lock()
	g.sweepLocked(registryNow(g))
	g.mu.Unlock()
}

// pluginTransport is the plugin's transport: core's defaults, and the
// proxy of the environment (HTTP_PROXY, HTTPS_PROXY, NO_PROXY), as Traefik
// itself honours it.
var pluginTransport = config.TransportConfig{ProxyFromEnvironment: true}

// roundTripperLocked returns the plugin's own transport, created on first
// use. Hedged attempts never go through Traefik's `next` handler, which
// must not be called concurrently for one request.
func (g *registry) roundTripperLocked() (http.RoundTripper, error) {
	if g.transport == nil {
		tr, err := core.NewTransport(pluginTransport, nil)
		if err != nil {
			return nil, err
		}
		g.transport = tr
	}
	return g.transport, nil
}

// touch records a New of shape key on route: a use of its state, if there
// is one, and the route's newest shape from now on. It creates no state.
// It returns the New's sequence number.
func (g *registry) touch(route, key string) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := registryNow(g)
	g.seq++
	seq := g.seq
	e := g.entryLocked(route, key, now)
	e.newSeq = seq
	e.lastUse = now.UnixNano()
	g.routes[route].newest = seq
	g.sweepLocked(now)
	return seq
}

// hedger builds h's engine on its route's shared state, creating the state
// on the first request of its shape, and returns the state's entry.
func (g *registry) hedger(h *Hedge) (*core.Hedger, *sharedEntry, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := registryNow(g)
	transport, err := g.roundTripperLocked()
	if err != nil {
		return nil, nil, err
	}
	e := g.entryLocked(h.cfg.Route, h.stateKey, now)
	if e.newSeq < h.newSeq {
		e.newSeq = h.newSeq // forgotten since h's New, and made again
	}
	e.lastUse = now.UnixNano()
	// The store goes in only with a new state: core.New installs it in
	// the state, which handlers already serving must not see change.
	var store core.Store
	if e.state == nil {
		e.store = newReplyStore(g.replies, h.cfg.Idempotency.MaxEntries, int64(h.cfg.Idempotency.MaxBytes))
		store = e.store
	}
	opts := core.Options{
		// Set explicitly: under Yaegi v0.16.1 core.New's own default
		// (assigning SystemClock{} to the interface field) panics.
		Clock:     core.SystemClock{},
		Transport: transport,
		State:     e.state,
		Store:     store,
	}
	if h.cfg.Fleet.Enabled() {
		fleet, err := fleetFor(fleets, h.cfg.Fleet, h.logOut)
		if err != nil {
			return nil, nil, err
		}
		opts.Fleet = fleet
	}
	var log *logObserver
	if h.logOut != nil {
		log = &logObserver{middleware: h.name, out: h.logOut}
		engineLog := &fleetLogger{out: h.logOut}
		opts.Log = engineLog.log
	}
	if h.tracing != nil {
		tracer, err := tracerFor(exporters, h.tracing)
		if err != nil {
			return nil, nil, err
		}
		opts.Tracer = tracer
	}
	var counted *metricStore
	if h.metricsPath != "" {
		counted = sharedMetrics
	}
	if log != nil || counted != nil {
		opts.Observer = &reportObserver{log: log, metrics: counted}
	}
	engine, err := core.New(h.cfg, opts)
	if err != nil {
		return nil, nil, err
	}
	if counted != nil {
		counted.setHedger(h.cfg.Route, engine)
	}
	if e.state == nil {
		e.state = engine.State()
	}
	g.sweepLocked(now)
	return engine, e, nil
}

// entryLocked returns the entry of key, creating it (without state) when
// there is none, within maxEntries.
func (g *registry) entryLocked(route, key string, now time.Time) *sharedEntry {
	if e, ok := g.entries[key]; ok {
		return e
	}
	for len(g.entries) >= g.maxEntries && g.evictOneLocked() {
	}
	e := &sharedEntry{key: key, route: route, lastUse: now.UnixNano()}
	g.entries[key] = e
	ri := g.routes[route]
	if ri == nil {
		ri = &routeInfo{}
		g.routes[route] = ri
	}
	ri.entries++
	return e
}

// superseded reports whether a newer shape of e's route has had a New
// since e's latest.
func (g *registry) superseded(e *sharedEntry) bool {
	return e.newSeq < g.routes[e.route].newest
}

// sweepLocked forgets superseded states unused for g.idle. It runs at most
// once per sweepInterval.
func (g *registry) sweepLocked(now time.Time) {
	ns := now.UnixNano()
	if ns-g.lastSweep < int64(sweepInterval) {
		return
	}
	g.lastSweep = ns
	var stale []*sharedEntry
	for _, e := range g.entries {
		noteRequests(e, ns)
		if g.superseded(e) && ns-e.lastUse >= int64(g.idle) {
			stale = append(stale, e)
		}
	}
	for _, e := range stale {
		g.dropLocked(e)
	}
}

// noteRequests counts requests of e since the last sweep as a use at ns
// (at or after the requests: a state is never thought idle too early).
func noteRequests(e *sharedEntry, ns int64) {
	n := atomic.LoadUint32(&e.requests)
	if n != e.seen {
		e.seen = n
		e.lastUse = ns
	}
}

// evictOneLocked forgets one state to make room: the least recently used
// superseded one, else the least recently used of all. It reports whether
// there was one.
func (g *registry) evictOneLocked() bool {
	var victim *sharedEntry
	victimSuperseded := false
	victimUse := int64(0)
	for _, e := range g.entries {
		sup := g.superseded(e)
		noteRequests(e, registryNow(g).UnixNano())
		use := e.lastUse
		if victim == nil || sup && !victimSuperseded || sup == victimSuperseded && use < victimUse {
			victim = e
			victimSuperseded = sup
			victimUse = use
		}
	}
	if victim == nil {
		return false
	}
	g.dropLocked(victim)
	return true
}

// dropLocked forgets e and frees its stored answers.
func (g *registry) dropLocked(e *sharedEntry) {
	delete(g.entries, e.key)
	ri := g.routes[e.route]
	ri.entries--
	if ri.entries == 0 {
		delete(g.routes, e.route)
	}
	if e.store != nil {
		e.store.close()
	}
}

// size reports how many route states are held (for tests).
func (g *registry) size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, e := range g.entries {
		if e.state != nil {
			n++
		}
	}
	return n
}

// replyCache holds the answers kept for idempotent replays by every route
// state's store, under one lock so that their total is bounded: over the
// bound the least recently used answer of any store goes first, so a
// superseded shape's answers, which no request reads, go before a live
// route's.
type replyCache struct {
	mu       sync.Mutex
	maxBytes int64
	bytes    int64
	lru      *list.List // of *storedReply, front: most recently used
	now      func() time.Time
}

func newReplyCache(maxBytes int64, now func() time.Time) *replyCache {
	return &replyCache{maxBytes: maxBytes, lru: list.New(), now: now}
}

// held reports the bytes of all stored answers.
func (c *replyCache) held() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// replyStore is one route state's core.Store: an LRU with per-answer
// expiry, bounded by the state's own idempotency.maxEntries and .maxBytes
// and, through its cache, by the total of all stores.
type replyStore struct {
	cache      *replyCache
	maxEntries int
	maxBytes   int64

	// Guarded by cache.mu.
	bytes  int64
	lru    *list.List // of *storedReply, front: most recently used
	items  map[string]*storedReply
	closed bool // forgotten by the registry: stores nothing more
}

type storedReply struct {
	owner   interface{} // its *replyStore (see sharedEntry on why not typed)
	key     string
	resp    *core.StoredResponse
	expires time.Time
	size    int64
	inCache *list.Element
	inStore *list.Element
}

func newReplyStore(c *replyCache, maxEntries int, maxBytes int64) *replyStore {
	c.mu.Lock()
	if maxBytes > c.maxBytes {
		c.maxBytes = maxBytes // the total never undercuts one route's own bound
	}
	c.mu.Unlock()
	return &replyStore{cache: c, maxEntries: maxEntries, maxBytes: maxBytes, lru: list.New(),
		items: make(map[string]*storedReply)}
}

// Get returns the unexpired answer stored under key.
func (s *replyStore) Get(key string) (*core.StoredResponse, bool) {
	c := s.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	it, ok := s.items[key]
	if !ok {
		return nil, false
	}
	if !c.now().Before(it.expires) {
		removeReply(c, it)
		return nil, false
	}
	c.lru.MoveToFront(it.inCache)
	s.lru.MoveToFront(it.inStore)
	return it.resp, true
}

// Put stores resp under key for ttl, evicting the least recently used
// answers of this store, then of all stores, beyond their bounds.
func (s *replyStore) Put(key string, resp *core.StoredResponse, ttl time.Duration) {
	size := resp.Size()
	if size > s.maxBytes {
		return
	}
	c := s.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.closed {
		return
	}
	if old, ok := s.items[key]; ok {
		removeReply(c, old)
	}
	it := &storedReply{owner: s, key: key, resp: resp, size: size}
	it.expires = c.now().Add(ttl)
	it.inCache = c.lru.PushFront(it)
	it.inStore = s.lru.PushFront(it)
	s.items[key] = it
	s.bytes += size
	c.bytes += size
	for len(s.items) > s.maxEntries || s.bytes > s.maxBytes {
		removeReply(c, s.lru.Back().Value.(*storedReply))
	}
	for c.bytes > c.maxBytes {
		removeReply(c, c.lru.Back().Value.(*storedReply))
	}
}

// close frees every answer of s and makes it store nothing more.
func (s *replyStore) close() {
	c := s.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	for s.lru.Len() > 0 {
		removeReply(c, s.lru.Back().Value.(*storedReply))
	}
	s.closed = true
}

// removeReply forgets one answer; c.mu is held.
func removeReply(c *replyCache, it *storedReply) {
	s := it.owner.(*replyStore)
	c.lru.Remove(it.inCache)
	s.lru.Remove(it.inStore)
	delete(s.items, it.key)
	s.bytes -= it.size
	c.bytes -= it.size
}
