package core

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// keyedAs is a keyed request from the caller whose Authorization is auth.
func keyedAs(body, key, auth string) *http.Request {
	r := keyed(body, key)
	r.Header.Set("Authorization", auth)
	return r
}

// onlyFlight returns the flight in progress (nil when there is none).
func onlyFlight(hs *harness) *flight {
	t := hs.h.state.idem
	t.mu.Lock()
	defer t.mu.Unlock()
	var found *flight
	for _, f := range t.flights {
		found = f
	}
	return found
}

// answerNextCall answers the next upstream call, when it comes, with a
// stream of the one token, in the background: a test that expects a call
// the old code never made then fails on its answer instead of hanging.
func (hs *harness) answerNextCall(token string) {
	go func() {
		c := <-hs.tr.calls
		c.respond(200, "text/event-stream")
		c.write(tokenChunk(token))
		c.end()
	}()
}

// serveVia runs one request in the background with w as its writer.
func (hs *harness) serveVia(w http.ResponseWriter, r *http.Request) chan error {
	out := make(chan error, 1)
	go func() { out <- hs.h.Handle(w, r) }()
	return out
}

// Another caller's request with the same key and body, while the first is
// in flight, runs its own race: it does not join the first caller's answer.
func TestIdempotencyKeyInFlightIsScopedToCaller(t *testing.T) {
	hs := newHarness(t, testConfig())
	first := hs.serve(keyedAs("", "shared-key", "Bearer sk-A"))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("A"))

	hs.answerNextCall("B")
	pw := newPipeWriter()
	second := hs.serveVia(pw, keyedAs("", "shared-key", "Bearer sk-B"))
	if got := <-pw.writes; got != tokenChunk("B") {
		t.Fatalf("caller B's first bytes %q, want its own answer %q", got, tokenChunk("B"))
	}
	if err := <-second; err != nil {
		t.Fatalf("caller B: Handle = %v, want nil", err)
	}
	a.end()
	<-first
	if n := hs.tr.count(); n != 2 {
		t.Fatalf("%d upstream attempts, want 2 (one race per caller)", n)
	}
	for i := 0; i < 2; i++ {
		if rep := <-hs.reports; rep.Outcome != OutcomeOK {
			t.Fatalf("outcome %q, want ok for both callers", rep.Outcome)
		}
	}
}

// After the first caller's answer is stored, another caller with the same
// key gets no replay, and no 422 when its body differs (that would confirm
// the key exists); the first caller still gets its replay.
func TestIdempotencyKeyStoredIsScopedToCaller(t *testing.T) {
	hs := newHarness(t, testConfig())
	first := hs.serve(keyedAs("", "shared-key", "Bearer sk-A"))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("A"))
	a.end()
	<-first

	hs.answerNextCall("B")
	rb := <-hs.serve(keyedAs("", "shared-key", "Bearer sk-B"))
	if got := rb.rec.Header().Get("Idempotent-Replayed"); got != "" {
		t.Fatalf("caller B: got = %q, want \"\"", got)
	} else if bodyOf(rb) != tokenChunk("B") {
		t.Fatalf("caller B: bodyOf(rb) = %v, want %v", bodyOf(rb), tokenChunk("B"))
	}

	hs.answerNextCall("C")
	rc := <-hs.serve(keyedAs(`{"model":"other","stream":true}`, "shared-key", "Bearer sk-C"))
	if rc.rec.Code != 200 {
		t.Fatalf("caller C with another body: rc.rec.Code = %v, want 200", rc.rec.Code)
	} else if bodyOf(rc) != tokenChunk("C") {
		t.Fatalf("caller C with another body: bodyOf(rc) = %v, want %v", bodyOf(rc), tokenChunk("C"))
	}

	// The same Authorization with another API key header is another caller.
	hs.answerNextCall("D")
	other := keyedAs("", "shared-key", "Bearer sk-A")
	other.Header.Set("X-Api-Key", "sk-other")
	rd := <-hs.serve(other)
	if got := rd.rec.Header().Get("Idempotent-Replayed"); got != "" {
		t.Fatalf("caller A with an x-api-key: got = %q, want \"\"", got)
	} else if bodyOf(rd) != tokenChunk("D") {
		t.Fatalf("caller A with an x-api-key: bodyOf(rd) = %v, want %v", bodyOf(rd), tokenChunk("D"))
	}

	ra := <-hs.serve(keyedAs("", "shared-key", "Bearer sk-A"))
	if got := ra.rec.Header().Get("Idempotent-Replayed"); got != "true" {
		t.Fatalf("caller A again: got = %q, want \"true\"", got)
	} else if bodyOf(ra) != tokenChunk("A") {
		t.Fatalf("caller A again: bodyOf(ra) = %v, want %v", bodyOf(ra), tokenChunk("A"))
	}
	if n := hs.tr.count(); n != 4 {
		t.Fatalf("%d upstream attempts, want 4", n)
	}
}

// The same caller (same credential headers) still joins its own request in
// flight; with a tenant header configured it is part of the caller, and
// ScopeHeaders replaces the default list.
func TestIdempotencyScopeHeaders(t *testing.T) {
	cfg := testConfig()
	cfg.Budget.TenantHeader = "X-Tenant"
	hs := newHarness(t, cfg)
	leader := keyedAs("", "k-tenant", "Bearer sk-A")
	leader.Header.Set("X-Tenant", "t1")
	first := hs.serve(leader)
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("A"))

	same := keyedAs("", "k-tenant", "Bearer sk-A")
	same.Header.Set("X-Tenant", "t1")
	pw := newPipeWriter()
	joined := hs.serveVia(pw, same)
	if got := <-pw.writes; got != tokenChunk("A") {
		t.Fatalf("the same caller's first bytes %q, want the leader's %q", got, tokenChunk("A"))
	}
	a.end()
	<-first
	<-joined

	hs.answerNextCall("T2")
	tenant2 := keyedAs("", "k-tenant", "Bearer sk-A")
	tenant2.Header.Set("X-Tenant", "t2")
	if r := <-hs.serve(tenant2); bodyOf(r) != tokenChunk("T2") {
		t.Fatalf("another tenant got %q, want its own answer", bodyOf(r))
	}

	// Only X-User scopes: two Authorizations of one user share the entry.
	cfg = testConfig()
	cfg.Idempotency.ScopeHeaders = []string{"x-user"}
	hs = newHarness(t, cfg)
	first = hs.serve(keyedAs("", "k-user", "Bearer one"))
	a = hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("U"))
	a.end()
	<-first
	if r := <-hs.serve(keyedAs("", "k-user", "Bearer two")); r.rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("scope_headers [x-user]: Authorization changed the caller (Idempotent-Replayed %q)", r.rec.Header().Get("Idempotent-Replayed"))
	}
}

// The caller's identity hashes length-prefixed values: headers whose
// values concatenate alike are still different callers.
func TestIdempotencyIdentityIsUnambiguous(t *testing.T) {
	hs := newHarness(t, testConfig())
	identity := func(key string, header ...string) string {
		r := keyed("", key)
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Add(header[i], header[i+1])
		}
		return idempotencyIdentity(hs.h, &preparedRequest{orig: r, key: key})
	}
	cases := [][2]string{
		{identity("k", "Authorization", "ab"), identity("k", "Authorization", "a", "X-Api-Key", "b")},
		{identity("k", "Authorization", "ab"), identity("k", "Authorization", "a", "Authorization", "b")},
		{identity("k", "X-Api-Key", "a"), identity("k", "Api-Key", "a")},
		{identity("bk", "Authorization", "a"), identity("k", "Authorization", "ab")},
		{identity("k"), identity("k", "Authorization", "")},
	}
	for i, c := range cases {
		if c[0] == c[1] {
			t.Errorf("case %d: two callers share the identity %s", i, c[0])
		}
	}
	if identity("k", "Authorization", "a") != identity("k", "authorization", "a") {
		t.Error("the identity depends on the header name's case")
	}
}

// A replay, and a follower in flight, carry the upstream answer's headers
// only: not a Set-Cookie (the upstream's or one a wrapping handler set on
// the first request's writer), not the headers the host added around the
// handler, not the first request's report header: their own report
// header says they made no attempts.
func TestIdempotentReplayCarriesUpstreamHeadersOnly(t *testing.T) {
	cfg := testConfig()
	cfg.ReportHeader = "Server-Timing"
	hs := newHarness(t, cfg)
	rec := httptest.NewRecorder()
	// What a host or a wrapping handler puts on the leader's writer.
	rec.Header().Set("Set-Cookie", "session=leader")
	rec.Header().Set("X-Host-Added", "leader")
	first := hs.serveVia(rec, keyed("", "k-headers"))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream", "X-Upstream", "A", "Set-Cookie", "upstream=1")
	a.write(tokenChunk("x"))

	pw := newPipeWriter()
	follower := hs.serveVia(pw, keyed("", "k-headers"))
	<-pw.writes
	a.end()
	<-first
	<-follower
	if rec.Header().Get("Server-Timing") == "" {
		t.Fatalf("the leader's client lost headers: rec.Header().Get(\"Server-Timing\") = \"\", want a non-empty value")
	} else if rec.Header().Get("X-Upstream") != "A" {
		t.Fatalf("the leader's client lost headers: rec.Header().Get(\"X-Upstream\") = %q, want \"A\"", rec.Header().Get("X-Upstream"))
	}
	check := func(who string, h http.Header) {
		t.Helper()
		if h.Get("X-Upstream") != "A" {
			t.Errorf("%s: X-Upstream = %q, want A", who, h.Get("X-Upstream"))
		}
		want := `llmhedge;desc="` + map[string]string{"follower": "joined", "replay": "replayed"}[who] + ` attempts=0"`
		if got := h.Values("Server-Timing"); len(got) != 1 || got[0] != want {
			t.Errorf("%s: Server-Timing = %q, want [%s]", who, got, want)
		}
		for _, name := range []string{"Set-Cookie", "X-Host-Added"} {
			if v := h.Values(name); len(v) > 0 {
				t.Errorf("%s: %s = %q, want none", who, name, v)
			}
		}
	}
	check("follower", pw.h)
	replay := <-hs.serve(keyed("", "k-headers"))
	if replay.rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("no replay: Idempotent-Replayed %q", replay.rec.Header().Get("Idempotent-Replayed"))
	}
	check("replay", replay.rec.Header())
}

// Reports name the key by its hash (leader and follower alike), never by
// the key itself.
func TestReportCarriesKeyHash(t *testing.T) {
	hs := newHarness(t, testConfig())
	key := "client-secret-key-123"
	first := hs.serve(keyed("", key))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("x"))
	pw := newPipeWriter()
	follower := hs.serveVia(pw, keyed("", key))
	<-pw.writes
	a.end()
	<-first
	<-follower
	sum := sha256.Sum256([]byte(key))
	want := hex.EncodeToString(sum[:])[:16]
	for i := 0; i < 2; i++ {
		rep := <-hs.reports
		if rep.KeyHash != want {
			t.Errorf("%s report: KeyHash = %q, want %q", rep.Outcome, rep.KeyHash, want)
		}
		if strings.Contains(rep.KeyHash, key) {
			t.Errorf("%s report carries the key", rep.Outcome)
		}
	}
	// A generated key is not hashed: it names nothing the client knows.
	out := hs.serve(chatRequest(""))
	c := hs.tr.next(t)
	if c.req.Header.Get("Idempotency-Key") == "" {
		t.Fatal("no generated key was sent")
	}
	c.respond(200, "text/event-stream")
	c.write(tokenChunk("y"))
	c.end()
	<-out
	if rep := <-hs.reports; rep.KeyHash != "" {
		t.Errorf("generated key: KeyHash = %q, want none", rep.KeyHash)
	}
}

// When the leader's client leaves after commit, the follower still gets
// the whole answer and the upstream is not cancelled.
func TestIdempotentFollowerOutlivesLeaderClient(t *testing.T) {
	hs := newHarness(t, testConfig())
	ctx, leaderGone := context.WithCancel(context.Background())
	defer leaderGone()
	first := hs.serve(keyed("", "k-leader-gone").WithContext(ctx))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("one"))
	pw := newPipeWriter()
	follower := hs.serveVia(pw, keyed("", "k-leader-gone"))
	if got := <-pw.writes; got != tokenChunk("one") {
		t.Fatalf("follower's first bytes %q", got)
	}

	leaderGone()
	// Cancelling a context cancels its descendants at once: an attempt
	// still tied to the leader's client would be cancelled by now.
	if err := a.req.Context().Err(); err != nil {
		t.Fatalf("upstream attempt cancelled (%v) when the leader's client left with a follower reading", err)
	}
	if !a.write(tokenChunk("two")) {
		t.Fatal("upstream attempt cut when the leader's client left with a follower reading")
	}
	if got := <-pw.writes; got != tokenChunk("two") {
		t.Fatalf("follower's second bytes %q, want %q", got, tokenChunk("two"))
	}
	a.end()
	if err := <-follower; err != nil {
		t.Fatalf("follower: Handle = %v, want nil (the whole answer)", err)
	}
	<-first
	if hs.tr.count() != 1 {
		t.Fatalf("%d upstream attempts, want 1", hs.tr.count())
	}
}

// Once the leader's client and the last follower are gone, the upstream
// is cancelled and both handlers return.
func TestIdempotentLastReaderGoneCancelsUpstream(t *testing.T) {
	hs := newHarness(t, testConfig())
	lctx, leaderGone := context.WithCancel(context.Background())
	defer leaderGone()
	fctx, followerGone := context.WithCancel(context.Background())
	defer followerGone()
	first := hs.serve(keyed("", "k-all-gone").WithContext(lctx))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("one"))
	pw := newPipeWriter()
	follower := hs.serveVia(pw, keyed("", "k-all-gone").WithContext(fctx))
	<-pw.writes

	leaderGone()
	if err := a.req.Context().Err(); err != nil {
		t.Fatalf("upstream attempt cancelled (%v) while a follower reads", err)
	}
	if !a.write(tokenChunk("two")) {
		t.Fatal("upstream attempt cut while a follower reads")
	}
	<-pw.writes

	followerGone()
	a.waitCancelled() // blocks (the test times out) if the upstream is never cancelled
	if err := <-follower; err != nil {
		t.Fatalf("follower: Handle = %v, want nil (its client left)", err)
	}
	if res := <-first; res.err != nil {
		t.Fatalf("leader: Handle = %v, want nil (every reader left)", res.err)
	}
	r1 := <-hs.reports
	r2 := <-hs.reports
	outcomes := map[string]bool{}
	outcomes[r1.Outcome] = true
	outcomes[r2.Outcome] = true
	if !outcomes[OutcomeClientGone] || !outcomes[OutcomeJoined] {
		t.Fatalf("outcomes %v, want client_gone (leader) and joined (follower)", outcomes)
	}
	if fl := onlyFlight(hs); fl != nil {
		t.Fatal("the flight is still in the table")
	}
}

// gateWriter holds the leader's answer in Write until the test lets it go.
type gateWriter struct {
	rec     *httptest.ResponseRecorder
	entered chan struct{}
	release chan struct{}
}

func (g *gateWriter) Header() http.Header    { return g.rec.Header() }
func (g *gateWriter) WriteHeader(status int) { g.rec.WriteHeader(status) }
func (g *gateWriter) Write(p []byte) (int, error) {
	g.entered <- struct{}{}
	<-g.release
	return g.rec.Write(p)
}

// A follower of a leader whose answer was a clean upstream error (a 400)
// gets the same complete answer and a clean end; the error is not stored.
func TestIdempotentFollowerOfErrorAnswerEndsCleanly(t *testing.T) {
	hs := newHarness(t, testConfig())
	gate := &gateWriter{rec: httptest.NewRecorder(), entered: make(chan struct{}, 1), release: make(chan struct{})}
	first := hs.serveVia(gate, keyed("", "k-400"))
	a := hs.tr.next(t)
	errBody := `{"error":{"message":"bad request","type":"invalid_request_error"}}`
	a.respond(400, "application/json", "X-Upstream", "A")
	a.write(errBody)
	a.end()
	<-gate.entered // the answer is in the flight; the leader's client write waits

	pw := newPipeWriter()
	follower := hs.serveVia(pw, keyed("", "k-400"))
	if got := <-pw.writes; got != errBody {
		t.Fatalf("follower body %q, want %q", got, errBody)
	}
	close(gate.release)
	if err := <-first; err != nil {
		t.Fatalf("leader: Handle = %v", err)
	}
	if err := <-follower; err != nil {
		t.Fatalf("follower of a 400: Handle = %v, want nil (a complete answer, a clean end)", err)
	}
	if pw.status != 400 {
		t.Fatalf("follower: pw.status = %v, want 400", pw.status)
	} else if pw.h.Get("X-Upstream") != "A" {
		t.Fatalf("follower: pw.h.Get(\"X-Upstream\") = %q, want \"A\"", pw.h.Get("X-Upstream"))
	} else if pw.h.Get("Content-Type") != "application/json" {
		t.Fatalf("follower: pw.h.Get(\"Content-Type\") = %q, want \"application/json\"", pw.h.Get("Content-Type"))
	}
	// Not stored: the same request tries again.
	out := hs.serve(keyed("", "k-400"))
	b := hs.tr.next(t)
	b.respond(200, "text/event-stream")
	b.write(tokenChunk("ok"))
	b.end()
	if res := <-out; bodyOf(res) != tokenChunk("ok") {
		t.Fatalf("after the 400: body %q, want a new answer", bodyOf(res))
	}
}

// The request fingerprint length-prefixes its parts: a path holding an
// escaped "?" and a query that together spell another request's path and
// query are a different request (422), not a replay of it.
func TestIdempotencyFingerprintIsUnambiguous(t *testing.T) {
	hs := newHarness(t, testConfig())
	first := keyed("", "k-fingerprint")
	first.URL.Path = "/v1/a?b"
	first.URL.RawPath = "/v1/a%3Fb"
	first.URL.RawQuery = ""
	out := hs.serve(first)
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("x"))
	a.end()
	<-out
	second := keyed("", "k-fingerprint")
	second.URL.Path = "/v1/a"
	second.URL.RawPath = ""
	second.URL.RawQuery = "b?"
	if res := <-hs.serve(second); res.rec.Code != http.StatusUnprocessableEntity {
		t.Fatalf("path /v1/a%%3Fb then /v1/a?b?: status %d (Idempotent-Replayed %q), want 422",
			res.rec.Code, res.rec.Header().Get("Idempotent-Replayed"))
	}
}

// Through a real net/http server: the leader's HTTP client disconnects
// after commit, and the follower still reads the whole answer to a clean
// end.
func TestIdempotentFollowerOutlivesLeaderOverHTTP(t *testing.T) {
	hs := newHarness(t, testConfig())
	leaderLeft := make(chan struct{})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test-Role") == "leader" {
			context.AfterFunc(r.Context(), func() { close(leaderLeft) })
		}
		hs.h.ServeHTTP(w, r)
	}))
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	send := func(ctx context.Context, role string, out chan *http.Response) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-x","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Error(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k-http")
		req.Header.Set("X-Test-Role", role)
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("%s: %v", role, err)
		}
		out <- resp
	}
	readEvent := func(who string, r *bufio.Reader) string {
		t.Helper()
		var ev string
		for !strings.HasSuffix(ev, "\n\n") {
			line, err := r.ReadString('\n')
			ev += line
			if err != nil {
				t.Fatalf("%s: reading an event: %v (got %q)", who, err, ev)
			}
		}
		return ev
	}

	lctx, leaderGone := context.WithCancel(context.Background())
	defer leaderGone()
	leaderResp := make(chan *http.Response, 1)
	go send(lctx, "leader", leaderResp)
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("one"))
	lresp := <-leaderResp
	if lresp == nil {
		t.FailNow()
	}
	if got := readEvent("leader", bufio.NewReader(lresp.Body)); got != tokenChunk("one") {
		t.Fatalf("leader's first event %q", got)
	}

	followerResp := make(chan *http.Response, 1)
	go send(context.Background(), "follower", followerResp)
	fresp := <-followerResp
	if fresp == nil {
		t.FailNow()
	}
	defer fresp.Body.Close()
	fbody := bufio.NewReader(fresp.Body)
	if got := readEvent("follower", fbody); got != tokenChunk("one") {
		t.Fatalf("follower's first event %q", got)
	}

	leaderGone() // the leader's client closes its connection
	<-leaderLeft // and the server has seen it go
	if err := a.req.Context().Err(); err != nil {
		t.Fatalf("upstream attempt cancelled (%v) when the leader's client left with a follower reading", err)
	}
	if !a.write(tokenChunk("two")) {
		t.Fatal("upstream attempt cut when the leader's client left with a follower reading")
	}
	a.end()
	rest, err := io.ReadAll(fbody)
	if err != nil {
		t.Fatal(err)
	} else if string(rest) != tokenChunk("two") {
		t.Fatalf("string(rest) = %v, want %v", string(rest), tokenChunk("two"))
	}
	// Both handlers return (the leader's after the follower's answer).
	joined := 0
	for i := 0; i < 2; i++ {
		if rep := <-hs.reports; rep.Outcome == OutcomeJoined && rep.Status == 200 {
			joined++
		}
	}
	if joined != 1 {
		t.Fatalf("%d joined reports with status 200, want the follower's", joined)
	}
}

// The leader's race context keeps the client's deadline and values but
// not its cancellation, which only ends it with no follower reading.
func TestLeadFlightContext(t *testing.T) {
	type ctxKey struct{}
	deadline := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	base := context.WithValue(context.Background(), ctxKey{}, "v")
	client, cancelClient := context.WithDeadline(base, deadline)
	f := newFlight("fp", 1024)
	if !f.join() {
		t.Fatal("join refused on a fresh flight")
	}
	readers, release := leadFlight(f, client)
	defer release()
	if got, ok := readers.Deadline(); !ok || !got.Equal(deadline) {
		t.Fatalf("readers' deadline %v (%v), want the client's %v", got, ok, deadline)
	}
	if readers.Value(ctxKey{}) != "v" {
		t.Fatal("readers' context lost the request's values")
	}
	cancelClient()
	f.leaderLeft() // what the hook on the client's context does
	if readers.Err() != nil {
		t.Fatalf("readers' context %v with a follower reading", readers.Err())
	}
	if !f.join() {
		t.Fatal("join refused while a follower reads")
	}
	f.leave()
	f.leave()
	if readers.Err() == nil {
		t.Fatal("readers' context not cancelled when the last reader left")
	}
	if f.join() {
		t.Fatal("join accepted on an abandoned flight")
	}
}
