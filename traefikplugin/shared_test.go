package traefikplugin

import (
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
)

// testClock is a clock the registry reads; tests move it.
type testClock struct {
	mu sync.Mutex
	at time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.at = c.at.Add(d)
	c.mu.Unlock()
}

// useRegistry makes handlers built during the test use g.
func useRegistry(t *testing.T, g *registry) {
	saved := shared
	shared = g
	t.Cleanup(func() { shared = saved })
}

// engineState builds h's engine as its first request would and returns
// the shared state it got.
func engineState(t *testing.T, h http.Handler) *core.State {
	t.Helper()
	e, err := h.(*Hedge).engine()
	if err != nil {
		t.Fatal(err)
	}
	return e.State()
}

// keyedPost sends a non-streaming request with an idempotency key
// straight to h, and returns the status and whether it was a replay.
func keyedPost(t *testing.T, h http.Handler, key string) (status int, replayed bool) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	st := rec.Code
	rp := rec.Header().Get("Idempotent-Replayed") == "true"
	return st, rp
}

func oneUpstream(url, route string) *Config {
	cfg := CreateConfig()
	cfg.Log = logOff
	cfg.Upstreams = []Upstream{{URL: url}}
	cfg.Route = route
	return cfg
}

func TestAnUnchangedRouteKeepsItsStateAfterManyOtherShapes(t *testing.T) {
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{nonStream: true} })
	suffix := strconv.FormatInt(time.Now().UnixNano(), 10)
	stable := oneUpstream(a.srv.URL, "stable-"+suffix)
	first := newHedge(t, stable, "stable", nil, nil)
	if st, _ := keyedPost(t, first, "k1"); st != http.StatusOK {
		t.Fatalf("first request: status %d", st)
	}
	state := engineState(t, first)
	// 300 other shapes: one route reloaded with another upstream path
	// each time, each reload serving a request.
	for i := 0; i < 300; i++ {
		churn := oneUpstream(a.srv.URL+"/v"+strconv.Itoa(i), "churn-"+suffix)
		engineState(t, newHedge(t, churn, "churn", nil, nil))
	}
	// The unchanged route is reloaded: its new handler finds its state,
	// and the stored answer is replayed without reaching the upstream.
	reloaded := newHedge(t, stable, "stable", nil, nil)
	if got := engineState(t, reloaded); got != state {
		t.Fatalf("after 300 other shapes the unchanged route got a new state (learned delay, budget and idempotency table lost)")
	}
	servedBefore, _ := a.counts()
	st, replayed := keyedPost(t, reloaded, "k1")
	servedAfter, _ := a.counts()
	if st != http.StatusOK || !replayed || servedAfter != servedBefore {
		t.Fatalf("repeated key after the reload: status %d, replayed %v, upstream requests %d, want 200, true, 0",
			st, replayed, servedAfter-servedBefore)
	}
}

func TestEveryNewCountsAsUseAndEntriesStayBounded(t *testing.T) {
	g := newRegistry()
	g.maxEntries = 8
	useRegistry(t, g)
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{} })
	stable := oneUpstream(a.srv.URL, "stable")
	state := engineState(t, newHedge(t, stable, "stable", nil, nil))
	// Reloads as Traefik does them: New for every middleware, the
	// unchanged one included, and a new route each time.
	for i := 0; i < 40; i++ {
		newHedge(t, stable, "stable", nil, nil)
		engineState(t, newHedge(t, oneUpstream(a.srv.URL, "route-"+strconv.Itoa(i)), "other", nil, nil))
		if n := len(g.entries); n > g.maxEntries {
			t.Fatalf("reload %d: %d entries, want at most %d", i, n, g.maxEntries)
		}
	}
	if got := engineState(t, newHedge(t, stable, "stable", nil, nil)); got != state {
		t.Fatalf("a route New'd at every reload lost its state to least recently used ones")
	}
	// Superseded shapes go before any live route's state: the same route
	// reshaped 40 times without the stable route being touched.
	for i := 0; i < 40; i++ {
		engineState(t, newHedge(t, oneUpstream(a.srv.URL+"/v"+strconv.Itoa(i), "churn"), "churn", nil, nil))
	}
	if got := engineState(t, newHedge(t, stable, "stable", nil, nil)); got != state {
		t.Fatalf("superseded shapes of another route pushed out a live route's state")
	}
}

func TestSupersededShapeUnusedForAWhileIsForgotten(t *testing.T) {
	clock := &testClock{at: time.Unix(1000, 0)}
	g := newRegistry()
	g.now = clock.now
	useRegistry(t, g)
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{nonStream: true} })
	shapeA := oneUpstream(a.srv.URL, "r")
	shapeB := oneUpstream(a.srv.URL+"/b", "r")
	hA := newHedge(t, shapeA, "r", nil, nil)
	engineState(t, hA)
	keyA := hA.(*Hedge).stateKey
	hB := newHedge(t, shapeB, "r", nil, nil) // the reload: A is superseded
	engineState(t, hB)
	held := func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.entries[keyA] != nil
	}
	// The old handler still serves (a stream finishing, or a second
	// middleware with the same route name): that is use.
	clock.advance(g.idle / 2)
	keyedPost(t, hA, "ka")
	newHedge(t, shapeB, "r", nil, nil) // a registry call sweeps
	clock.advance(g.idle/2 + time.Second)
	newHedge(t, shapeB, "r", nil, nil)
	if !held() {
		t.Fatalf("a superseded shape used %v ago was forgotten (idle limit %v)", g.idle/2+time.Second, g.idle)
	}
	clock.advance(g.idle)
	newHedge(t, shapeB, "r", nil, nil)
	if held() {
		t.Fatalf("a superseded shape unused for %v is still held", g.idle+time.Second)
	}
	// The newest shape is never forgotten for being idle.
	clock.advance(10 * g.idle)
	if got := engineState(t, newHedge(t, shapeB, "r", nil, nil)); got != engineState(t, hB) {
		t.Fatalf("the route's current shape lost its state for being idle")
	}
}

// bigUpstream answers every request with a JSON completion of about n
// bytes.
func bigUpstream(t *testing.T, n int) *httptest.Server {
	content := strings.Repeat("x", n)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`+content+`"}}]}`)
	}))
	t.Cleanup(func() { srv.Close() })
	return srv
}

// heapBytes is the live heap after a full collection.
func heapBytes() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// storeAnswers sends n keyed requests through a handler of cfg, which is
// gone when it returns (a function of its own: Yaegi keeps every value of
// a frame until the frame ends).
func storeAnswers(t *testing.T, cfg *Config, n int) {
	h := newHedge(t, cfg, "big", nil, nil)
	for i := 0; i < n; i++ {
		if st, _ := keyedPost(t, h, "big-"+strconv.Itoa(i)); st != http.StatusOK {
			t.Fatalf("request %d: status %d", i, st)
		}
	}
}

func TestSupersededShapesFreeTheirStoredAnswers(t *testing.T) {
	clock := &testClock{at: time.Unix(1000, 0)}
	g := newRegistry()
	g.now = clock.now
	useRegistry(t, g)
	big := bigUpstream(t, 512<<10)
	old := oneUpstream(big.URL, "big")
	const answers = 60 // about 31 MiB
	base := heapBytes()
	storeAnswers(t, old, answers)
	stored := heapBytes() - base
	if stored < 25<<20 {
		t.Fatalf("%d answers of 512 KiB hold only %d MiB: the test measures nothing", answers, stored>>20)
	}
	// A moment later a reload changes the route's shape; every handler of
	// the old shape is gone. After the idle limit its answers are freed.
	clock.advance(sweepInterval)
	reshaped := oneUpstream(big.URL+"/v2", "big")
	engineState(t, newHedge(t, reshaped, "big", nil, nil))
	clock.advance(supersededIdle + time.Second)
	newHedge(t, reshaped, "big", nil, nil) // the next reload
	left := heapBytes() - base
	if left > 6<<20 {
		t.Fatalf("superseded shape still holds %d MiB of %d MiB of stored answers, want < 6 MiB", left>>20, stored>>20)
	}
	t.Logf("heap above the start: %.1f MiB with the answers stored, %.1f MiB after the superseded shape was forgotten",
		float64(stored)/(1<<20), float64(left)/(1<<20))
}

func TestStoredAnswersAreBoundedPerStateAndInTotal(t *testing.T) {
	clock := &testClock{at: time.Unix(1000, 0)}
	c := newReplyCache(3000, clock.now)
	a := newReplyStore(c, 100, 2000)
	b := newReplyStore(c, 2, 2500)
	answer := func() *core.StoredResponse { return &core.StoredResponse{Status: 200, Body: make([]byte, 936)} } // 1000 bytes
	has := func(s *replyStore, key string) bool {
		_, ok := s.Get(key)
		return ok
	}
	a.Put("a1", answer(), time.Minute)
	a.Put("a2", answer(), time.Minute)
	b.Put("b1", answer(), time.Minute)
	has(a, "a1") // a2 is now the least recently used of all
	b.Put("b2", answer(), time.Minute)
	if got := c.held(); got != 3000 {
		t.Fatalf("total held = %d bytes, want 3000 (the bound)", got)
	}
	// In this order: Get refreshes an answer, as the || chain did.
	for _, w := range []struct {
		store *replyStore
		key   string
		kept  bool
	}{{a, "a2", false}, {a, "a1", true}, {b, "b1", true}, {b, "b2", true}} {
		if has(w.store, w.key) != w.kept {
			t.Fatalf("over the total: %s kept = %v, want %v (the least recently used answer, a2, goes)", w.key, !w.kept, w.kept)
		}
	}
	b.Put("b3", answer(), time.Minute) // b's own bound: 2 answers
	for _, w := range []struct {
		key  string
		kept bool
	}{{"b1", false}, {"b2", true}, {"b3", true}} {
		if has(b, w.key) != w.kept {
			t.Fatalf("over a store's own entry bound: %s kept = %v, want %v (its least recently used answer, b1, goes)", w.key, !w.kept, w.kept)
		}
	}
	big := &core.StoredResponse{Status: 200, Body: make([]byte, 2200)}
	a.Put("too-big", big, time.Minute) // over a's maxBytes: not stored
	if has(a, "too-big") {
		t.Fatalf("an answer over its store's maxBytes was stored")
	}
	clock.advance(time.Minute)
	if has(a, "a1") {
		t.Fatalf("an answer past its TTL was replayed")
	}
	b.close()
	b.Put("b4", answer(), time.Minute) // a closed store keeps nothing
	if got := c.held(); got != 0 {
		t.Fatalf("after the last answer expired and the other store closed, %d bytes held, want 0", got)
	}
	// The total never undercuts one route's own bound.
	newReplyStore(c, 10, 5000)
	if c.maxBytes != 5000 {
		t.Fatalf("total bound = %d after a store of 5000 bytes, want 5000", c.maxBytes)
	}
}

// The plugin's transport is core.NewTransport's, with core's defaults and
// the environment's proxy (which the README promises).
func TestPluginTransportIsCoresDefault(t *testing.T) {
	g := newRegistry()
	rt, err := g.roundTripperLocked()
	if err != nil {
		t.Fatal(err)
	}
	tr, ok := rt.(*http.Transport)
	if !ok {
		t.Fatalf("transport is %T, want *http.Transport", rt)
	}
	defaults := config.TransportConfig{}.WithDefaults()
	if tr.MaxIdleConnsPerHost != defaults.MaxIdleConnsPerHost {
		t.Errorf("MaxIdleConnsPerHost = %d, want core's %d", tr.MaxIdleConnsPerHost, defaults.MaxIdleConnsPerHost)
	}
	if tr.IdleConnTimeout != defaults.KeepAliveIdleTimeout.D() {
		t.Errorf("IdleConnTimeout = %v, want core's %v", tr.IdleConnTimeout, defaults.KeepAliveIdleTimeout)
	}
	if tr.TLSHandshakeTimeout != defaults.TLSHandshakeTimeout.D() {
		t.Errorf("TLSHandshakeTimeout = %v, want core's %v", tr.TLSHandshakeTimeout, defaults.TLSHandshakeTimeout)
	}
	if tr.Proxy == nil {
		t.Error("Proxy is nil: HTTP_PROXY/HTTPS_PROXY would be ignored")
	}
	if again, _ := g.roundTripperLocked(); again != rt {
		t.Error("a second call built another transport")
	}
}

// goroutinesOfOurs lists the goroutines started neither by net/http, nor
// by a timer firing, nor by the Redis client, each by its state and
// creator: the connections of earlier tests' clients and servers start and
// end on their own (a cancelled attempt's dial may land later and start its
// read and write loops), and so do their timers' callbacks (an exporter's
// flush) and the Redis dials of earlier tests' fleets, which live on (a
// dial its caller left finishes in a goroutine of its own); so only the
// rest say whether New started something. (That New dials no Redis is
// checked on its own: the fleet registry has no client after it.)
func goroutinesOfOurs() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var ours []string
	for _, g := range strings.Split(string(buf), "\n\ngoroutine ") {
		if strings.Contains(g, "\ncreated by net/http.") || strings.Contains(g, "\ncreated by time.goFunc") ||
			strings.Contains(g, "\ncreated by github.com/llmhedge/llmhedge/resp.") {
			continue
		}
		desc := strings.SplitN(g, "\n", 2)[0]
		if i := strings.Index(g, "\ncreated by "); i >= 0 {
			desc += " " + strings.SplitN(g[i+1:], "\n", 2)[0]
		}
		ours = append(ours, desc)
	}
	return ours
}
