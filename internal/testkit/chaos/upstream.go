package chaos

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Request headers the suite sends through the proxy to the fault upstream.
const (
	// HeaderRequest names the client request an attempt belongs to.
	HeaderRequest = "X-Chaos-Request"
	// HeaderPlan scripts each attempt, by the engine's attempt number:
	// "0=reset_after:3@80ms;1=ok;*=ok". See Action.
	HeaderPlan = "X-Chaos-Plan"
	// HeaderShape is the answer's size: "<chunks>,<padding>,<pace µs>".
	HeaderShape = "X-Chaos-Shape"
	// headerAttempt is the engine's attempt number on every attempt.
	headerAttempt = "X-LLM-Hedge-Attempt"
)

// Action kinds: what one upstream attempt does.
const (
	ActOK            = "ok"             // the whole answer
	ActResetEarly    = "reset_early"    // TCP reset before any response byte
	ActResetPreamble = "reset_preamble" // 200, a ping and the role chunk, then a reset (before commit)
	ActResetAfter    = "reset_after"    // K content chunks, then a reset (after commit)
	ActTruncate      = "truncate"       // K chunks, half of the next `data:` line, then a clean end
	ActStatus        = "status"         // status K with an OpenAI-shaped error (429: Retry-After: 1)
	ActStall         = "stall"          // the preamble, then nothing until the proxy hangs up
	ActStallAfter    = "stall_after"    // K chunks, then nothing until the proxy hangs up
)

// Action is one attempt's script: Kind, its count K, and the time to the
// first content chunk.
type Action struct {
	Kind string
	K    int
	TTFT time.Duration
}

func (a Action) String() string {
	s := a.Kind
	if a.K != 0 {
		s += ":" + strconv.Itoa(a.K)
	}
	if a.TTFT > 0 {
		s += "@" + a.TTFT.String()
	}
	return s
}

func parseAction(s string) Action {
	var a Action
	if at := strings.IndexByte(s, '@'); at >= 0 {
		a.TTFT, _ = time.ParseDuration(s[at+1:])
		s = s[:at]
	}
	kind, k, _ := strings.Cut(s, ":")
	a.Kind = kind
	a.K, _ = strconv.Atoi(k)
	return a
}

// Plan maps attempt numbers to actions; "*" (Default) covers the rest.
type Plan struct {
	ByAttempt map[int]Action
	Default   Action
}

func (p Plan) header() string {
	var parts []string
	for i := 0; i < 8; i++ {
		if a, ok := p.ByAttempt[i]; ok {
			parts = append(parts, strconv.Itoa(i)+"="+a.String())
		}
	}
	def := p.Default
	if def.Kind == "" {
		def.Kind = ActOK
	}
	return strings.Join(append(parts, "*="+def.String()), ";")
}

func parsePlan(v string) Plan {
	p := Plan{ByAttempt: map[int]Action{}, Default: Action{Kind: ActOK}}
	for _, entry := range strings.Split(v, ";") {
		name, act, ok := strings.Cut(strings.TrimSpace(entry), "=")
		if !ok {
			continue
		}
		if name == "*" {
			p.Default = parseAction(act)
		} else if n, err := strconv.Atoi(name); err == nil {
			p.ByAttempt[n] = parseAction(act)
		}
	}
	return p
}

func (p Plan) forAttempt(n int) Action {
	if a, ok := p.ByAttempt[n]; ok {
		return a
	}
	return p.Default
}

// Shape is the size of an answer: Chunks content chunks, each padded with
// Padding bytes, Pace between two chunks.
type Shape struct {
	Chunks, Padding int
	Pace            time.Duration
}

func (s Shape) header() string {
	return fmt.Sprintf("%d,%d,%d", s.Chunks, s.Padding, s.Pace.Microseconds())
}

func parseShape(v string) Shape {
	s := Shape{Chunks: 5}
	f := strings.Split(v, ",")
	if len(f) == 3 {
		s.Chunks, _ = strconv.Atoi(f[0])
		s.Padding, _ = strconv.Atoi(f[1])
		us, _ := strconv.Atoi(f[2])
		s.Pace = time.Duration(us) * time.Microsecond
	}
	if s.Chunks < 1 {
		s.Chunks = 1
	}
	return s
}

// AuthHash is the short hash of an Authorization value that the upstream
// embeds in every chunk (never the value itself).
func AuthHash(authorization string) string {
	sum := sha256.Sum256([]byte(authorization))
	return hex.EncodeToString(sum[:4])
}

// Generation is one answer an upstream started to produce. Its bytes are a
// pure function of its fields, so the checker can render what a complete
// answer is and compare byte for byte.
type Generation struct {
	ID        string // upstream name + sequence number, e.g. "A000042"
	Upstream  string
	RequestID string // the X-Chaos-Request it was produced for
	AuthHash  string // AuthHash of the Authorization the upstream received
	Attempt   int
	Action    Action
	Shape     Shape
	Stream    bool
}

func (g *Generation) content(i int) string {
	return fmt.Sprintf("%s|%s|%s|%d/%d|%s ", g.ID, g.RequestID, g.AuthHash, i, g.Shape.Chunks,
		strings.Repeat(string(rune('a'+i%26)), g.Shape.Padding))
}

// preamble is what a stream sends before its first content chunk: a
// keep-alive comment and the role-only chunk (neither is output).
func (g *Generation) preamble() []byte {
	return []byte(": ping\n\n" + `data: {"id":"chatcmpl-` + g.ID +
		`","object":"chat.completion.chunk","created":0,"model":"chaos","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n")
}

func (g *Generation) chunk(i int) []byte {
	return []byte(`data: {"id":"chatcmpl-` + g.ID +
		`","object":"chat.completion.chunk","created":0,"model":"chaos","choices":[{"index":0,"delta":{"content":"` +
		g.content(i) + `"},"finish_reason":null}]}` + "\n\n")
}

func (g *Generation) final() []byte {
	return []byte(`data: {"id":"chatcmpl-` + g.ID +
		`","object":"chat.completion.chunk","created":0,"model":"chaos","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` +
		"\n\ndata: [DONE]\n\n")
}

// Expected is the complete answer: the whole SSE stream through [DONE], or
// the whole JSON body.
func (g *Generation) Expected() []byte {
	var b bytes.Buffer
	if !g.Stream {
		b.WriteString(`{"id":"chatcmpl-` + g.ID + `","object":"chat.completion","created":0,"model":"chaos","choices":[{"index":0,"message":{"role":"assistant","content":"`)
		for i := 0; i < g.Shape.Chunks; i++ {
			b.WriteString(g.content(i))
		}
		b.WriteString(`"},"finish_reason":"stop"}]}`)
		return b.Bytes()
	}
	b.Write(g.preamble())
	for i := 0; i < g.Shape.Chunks; i++ {
		b.Write(g.chunk(i))
	}
	b.Write(g.final())
	return b.Bytes()
}

// postCommitFault reports whether g's script breaks it after output began,
// the only case in which a client may see this generation end broken.
func (g *Generation) postCommitFault() bool {
	switch g.Action.Kind {
	case ActResetAfter, ActTruncate, ActStallAfter:
		return true
	}
	return false
}

// Registry records every generation of every upstream of a run.
type Registry struct {
	mu    sync.Mutex
	gens  map[string]*Generation
	seen  map[string]chan struct{} // request id -> closed at its first attempt
	count int
}

func newRegistry() *Registry {
	return &Registry{gens: map[string]*Generation{}, seen: map[string]chan struct{}{}}
}

func (r *Registry) add(g *Generation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gens[g.ID] = g
	r.count++
	ch := r.seenLocked(g.RequestID)
	select {
	case <-ch:
	default:
		close(ch)
	}
}

func (r *Registry) seenLocked(id string) chan struct{} {
	ch, ok := r.seen[id]
	if !ok {
		ch = make(chan struct{})
		r.seen[id] = ch
	}
	return ch
}

// Seen is closed once an upstream received an attempt of request id.
func (r *Registry) Seen(id string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seenLocked(id)
}

// Lookup returns generation id, or nil.
func (r *Registry) Lookup(id string) *Generation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gens[id]
}

// Count is the number of generations started.
func (r *Registry) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// Upstream is a fault-injecting OpenAI Chat Completions server. It tracks
// its connections, so the suite can see that the proxy closed every one it
// no longer uses.
type Upstream struct {
	Name string
	URL  string
	reg  *Registry
	srv  *http.Server
	lis  net.Listener

	mu    sync.Mutex
	seq   int
	conns map[net.Conn]*connInfo
}

// connInfo is what the upstream knows of one connection: its state, since
// when, and the last request it served (to name a connection left busy).
type connInfo struct {
	state   http.ConnState
	since   time.Time
	last    string // the last attempt on it: generation, request, action
	serving bool   // its handler is running
}

type connKey struct{}

// unused reports whether a connection in state s carries no request: idle
// between two requests, or new (connected, nothing received yet).
func unused(s http.ConnState) bool { return s == http.StateIdle || s == http.StateNew }

func startUpstream(name string, reg *Registry) (*Upstream, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &Upstream{Name: name, URL: "http://" + lis.Addr().String(), reg: reg, lis: lis, conns: map[net.Conn]*connInfo{}}
	u.srv = &http.Server{Handler: u, ConnState: u.connState, ErrorLog: nil,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) }}
	go u.srv.Serve(lis)
	return u, nil
}

func (u *Upstream) connState(c net.Conn, s http.ConnState) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if s == http.StateClosed || s == http.StateHijacked {
		delete(u.conns, c)
		return
	}
	info := u.conns[c]
	if info == nil {
		info = &connInfo{}
		u.conns[c] = info
	}
	info.state = s
	info.since = time.Now()
}

// busyReport describes every connection that is not idle: its state, for
// how long, and the attempt it last carried.
func (u *Upstream) busyReport() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for c, info := range u.conns {
		if unused(info.state) {
			continue
		}
		last := info.last
		if last == "" {
			last = "no request yet"
		}
		out = append(out, fmt.Sprintf("upstream %s conn %s: %s for %v, handler running %t, last attempt %s",
			u.Name, c.RemoteAddr(), info.state, time.Since(info.since).Round(time.Millisecond), info.serving, last))
	}
	return out
}

func (u *Upstream) serving(r *http.Request, desc string, on bool) {
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	u.mu.Lock()
	defer u.mu.Unlock()
	if info := u.conns[c]; info != nil {
		info.serving = on
		if on {
			info.last = desc
		}
	}
}

// Conns returns the upstream's open connections: busy (a request in
// progress) and idle (kept alive in the proxy's pool).
//
// A connection that has not sent a byte yet (StateNew) counts as idle: Go's
// transport (1.23 on) finishes a dial even when the attempt that started it
// was cancelled or got another connection first, and parks the new
// connection in its pool unused, where it stays until the pool's idle
// timeout (2 minutes in core's transport). No request is open on it.
func (u *Upstream) Conns() (busy, idle int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, info := range u.conns {
		if unused(info.state) {
			idle++
		} else {
			busy++
		}
	}
	return busy, idle
}

// Close stops the server and closes every connection.
func (u *Upstream) Close() { u.srv.Close() }

func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	attempt, _ := strconv.Atoi(r.Header.Get(headerAttempt))
	u.mu.Lock()
	u.seq++
	id := fmt.Sprintf("%s%06d", u.Name, u.seq)
	u.mu.Unlock()
	g := &Generation{
		ID:        id,
		Upstream:  u.Name,
		RequestID: r.Header.Get(HeaderRequest),
		AuthHash:  AuthHash(r.Header.Get("Authorization")),
		Attempt:   attempt,
		Action:    parsePlan(r.Header.Get(HeaderPlan)).forAttempt(attempt),
		Shape:     parseShape(r.Header.Get(HeaderShape)),
		Stream:    bytes.Contains(body, []byte(`"stream":true`)),
	}
	u.reg.add(g)
	desc := fmt.Sprintf("%s of %s (attempt %d, %s, stream %t)", g.ID, g.RequestID, g.Attempt, g.Action, g.Stream)
	u.serving(r, desc, true)
	defer u.serving(r, desc, false)
	if g.Action.Kind == ActResetEarly {
		resetConn(w)
		return
	}
	if g.Action.Kind == ActStatus {
		writeStatus(w, g)
		return
	}
	if g.Stream {
		serveStream(w, r, g)
		return
	}
	serveJSON(w, r, g)
}

// resetConn takes the connection over and resets it (SO_LINGER 0): the
// proxy reads a connection reset instead of a response.
func resetConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		tcp.SetLinger(0)
	}
	conn.Close()
}

func writeStatus(w http.ResponseWriter, g *Generation) {
	w.Header().Set("Content-Type", "application/json")
	if g.Action.K == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(g.Action.K)
	fmt.Fprintf(w, `{"error":{"message":"chaos %s: status %d","type":"chaos","param":null,"code":"chaos_%d"}}`, g.ID, g.Action.K, g.Action.K)
}

// wait pauses d, or until the proxy hangs up; false if it did.
func wait(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return r.Context().Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

func serveStream(w http.ResponseWriter, r *http.Request, g *Generation) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	w.Write(g.preamble())
	rc.Flush()
	act := g.Action
	switch act.Kind {
	case ActResetPreamble:
		panic(http.ErrAbortHandler)
	case ActStall:
		<-r.Context().Done()
		return
	}
	if !wait(r, act.TTFT) {
		return
	}
	for i := 0; i < g.Shape.Chunks; i++ {
		if i == act.K {
			switch act.Kind {
			case ActResetAfter:
				panic(http.ErrAbortHandler)
			case ActTruncate:
				c := g.chunk(i)
				w.Write(c[:len(c)/2])
				rc.Flush()
				return // a clean end of the HTTP response, mid-event
			case ActStallAfter:
				<-r.Context().Done()
				return
			}
		}
		if i > 0 && !wait(r, g.Shape.Pace) {
			return
		}
		if _, err := w.Write(g.chunk(i)); err != nil {
			return
		}
		rc.Flush()
	}
	w.Write(g.final())
}

func serveJSON(w http.ResponseWriter, r *http.Request, g *Generation) {
	act := g.Action
	if act.Kind == ActStall {
		<-r.Context().Done()
		return
	}
	if !wait(r, act.TTFT) {
		return
	}
	body := g.Expected()
	// The cut is K chunks' share of the body (half without K): past
	// max_prefix in a large answer, which the engine then streams.
	cut := len(body) / 2
	if act.K > 0 {
		cut = len(body) * act.K / g.Shape.Chunks
	}
	half := body[:cut]
	w.Header().Set("Content-Type", "application/json")
	switch act.Kind {
	case ActTruncate: // chunked, so the response ends cleanly after half the JSON
		w.WriteHeader(http.StatusOK)
		w.Write(half)
		return
	case ActResetPreamble, ActResetAfter, ActStallAfter:
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusOK)
		if act.Kind != ActResetPreamble {
			w.Write(half)
		}
		http.NewResponseController(w).Flush()
		if act.Kind == ActStallAfter {
			<-r.Context().Done()
			return
		}
		panic(http.ErrAbortHandler)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Write(body)
}
