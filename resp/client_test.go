package resp

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

func newClient(t *testing.T, opts Options) *Client {
	t.Helper()
	c, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// do runs one command that must succeed.
func do(t *testing.T, c *Client, args ...string) fleetstore.RedisValue {
	t.Helper()
	v, err := c.Do(ctxTimeout(t, 5*time.Second), args...)
	if err != nil {
		t.Fatalf("%s: %v", args[0], err)
	}
	return v
}

// connectedClients is the server's connected_clients (INFO clients), this
// client's own connection included.
func connectedClients(t *testing.T, c *Client) int {
	t.Helper()
	info := do(t, c, "INFO", "clients").Str
	for _, line := range strings.Split(info, "\r\n") {
		if strings.HasPrefix(line, "connected_clients:") {
			n, err := strconv.Atoi(strings.TrimPrefix(line, "connected_clients:"))
			if err != nil {
				t.Fatalf("INFO clients line %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("INFO clients has no connected_clients: %q", info)
	return 0
}

func TestReplyTypesFromRedis(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL()})

	if v := do(t, c, "SET", "k", "v"); v.Kind != fleetstore.RedisString || v.Str != "OK" {
		t.Fatalf("SET = %s, want \"OK\"", describe(v))
	}
	if v := do(t, c, "GET", "k"); describe(v) != `"v"` {
		t.Fatalf("GET k = %s, want \"v\"", describe(v))
	}
	if v := do(t, c, "GET", "missing"); v.Kind != fleetstore.RedisNil {
		t.Fatalf("GET missing = %s, want nil", describe(v))
	}
	if v := do(t, c, "INCRBY", "n", "-7"); v.Kind != fleetstore.RedisInt || v.Int != -7 {
		t.Fatalf("INCRBY = %s, want -7", describe(v))
	}
	do(t, c, "RPUSH", "list", "a", "", "c")
	if v := do(t, c, "LRANGE", "list", "0", "-1"); describe(v) != `["a" "" "c"]` {
		t.Fatalf("LRANGE = %s, want [\"a\" \"\" \"c\"]", describe(v))
	}
	if v := do(t, c, "LRANGE", "nolist", "0", "-1"); v.Kind != fleetstore.RedisArray || len(v.Array) != 0 {
		t.Fatalf("LRANGE of no list = %s, want []", describe(v))
	}
	// Nested arrays with integers, strings and nils, through Lua.
	v := do(t, c, "EVAL", `return {1, {"x", {2, false}}, "y"}`, "0")
	if describe(v) != `[1 ["x" [2 nil]] "y"]` {
		t.Fatalf("EVAL nested = %s, want [1 [\"x\" [2 nil]] \"y\"]", describe(v))
	}
	// A timed-out XREAD BLOCK is a nil array.
	if v := do(t, c, "XREAD", "BLOCK", "10", "STREAMS", "nostream", "0-0"); v.Kind != fleetstore.RedisNil {
		t.Fatalf("XREAD BLOCK on nothing = %s, want nil", describe(v))
	}
	id := do(t, c, "XADD", "s", "*", "f", "v").Str
	v = do(t, c, "XREAD", "COUNT", "1", "STREAMS", "s", "0-0")
	if describe(v) != `[["s" [["`+id+`" ["f" "v"]]]]]` {
		t.Fatalf("XREAD = %s, want the one entry %s", describe(v), id)
	}

	_, err := c.Do(ctxTimeout(t, 5*time.Second), "INCR", "list")
	rerr, ok := err.(*Error)
	if !ok || rerr.Code() != "WRONGTYPE" {
		t.Fatalf("INCR on a list: err = %v, want a *Error with code WRONGTYPE", err)
	}
	_, err = c.Do(ctxTimeout(t, 5*time.Second), "EVALSHA", strings.Repeat("0", 40), "0")
	rerr, ok = err.(*Error)
	if !ok || rerr.Code() != "NOSCRIPT" {
		t.Fatalf("EVALSHA of an unknown script: err = %v, want NOSCRIPT", err)
	}
	// The error reply left the connection in step.
	if v := do(t, c, "PING"); v.Str != "PONG" {
		t.Fatalf("PING after error replies = %s, want PONG", describe(v))
	}
	if d := c.Stats().Dials; d != 2 {
		t.Fatalf("Dials = %d, want 2 (one reused throughout, one for the blocking XREAD)", d)
	}
}

func TestBinarySafe(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL()})
	var all []byte
	for i := 0; i < 256; i++ {
		all = append(all, byte(i))
	}
	value := string(all) + "\r\n$-1\r\n*2\r\n" + string(all)
	key := "k\x00\r\n" + string(all[128:])
	do(t, c, "SET", key, value)
	if got := do(t, c, "GET", key).Str; got != value {
		t.Fatalf("GET of binary value: %d bytes, want %d identical bytes", len(got), len(value))
	}
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	do(t, c, "SET", "big", big)
	if got := do(t, c, "GET", "big").Str; got != big {
		t.Fatalf("GET of 1 MiB value: %d bytes, want %d identical bytes", len(got), len(big))
	}
	if got := do(t, c, "STRLEN", "big").Int; got != int64(len(big)) {
		t.Fatalf("STRLEN big = %d, want %d", got, len(big))
	}
}

func TestPipeline(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL()})
	var cmds [][]string
	for i := 0; i < 200; i++ {
		cmds = append(cmds, []string{"RPUSH", "p", strconv.Itoa(i)})
	}
	cmds = append(cmds, []string{"LLEN", "p"})
	values, err := c.Pipeline(ctxTimeout(t, 5*time.Second), cmds)
	if err != nil {
		t.Fatalf("Pipeline: %v", err)
	}
	if len(values) != 201 {
		t.Fatalf("Pipeline replies = %d, want 201", len(values))
	}
	for i := 0; i < 200; i++ {
		if values[i].Int != int64(i+1) {
			t.Fatalf("reply %d = %s, want %d", i, describe(values[i]), i+1)
		}
	}
	if values[200].Int != 200 {
		t.Fatalf("LLEN in pipeline = %d, want 200", values[200].Int)
	}
	// An error reply in the middle fails the call; the replies after it
	// were still read, so the connection is reused in step.
	values, err = c.Pipeline(ctxTimeout(t, 5*time.Second), [][]string{{"SET", "a", "1"}, {"INCR", "p"}, {"GET", "a"}})
	if rerr, ok := err.(*Error); !ok || rerr.Code() != "WRONGTYPE" {
		t.Fatalf("Pipeline with a failing command: err = %v, want WRONGTYPE", err)
	}
	if len(values) != 3 || values[2].Str != "1" {
		t.Fatalf("replies with the error: %d, third %q; want 3, \"1\"", len(values), values[2].Str)
	}
	if v := do(t, c, "GET", "a"); v.Str != "1" {
		t.Fatalf("GET a after the failed pipeline = %s, want \"1\"", describe(v))
	}
	if d := c.Stats().Dials; d != 1 {
		t.Fatalf("Dials = %d, want 1", d)
	}
	// One round trip: the server sees the pipeline as one batch of commands
	// from one connection.
	if n := connectedClients(t, c); n != 1 {
		t.Fatalf("connected_clients = %d, want 1", n)
	}
}

func TestAuth(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{Password: "s3cret-pw", User: "app", UserPassword: "app-s3cret"})
	addr := srv.Addr()

	ok := newClient(t, Options{URL: "redis://:s3cret-pw@" + addr + "/0"})
	if v := do(t, ok, "PING"); v.Str != "PONG" {
		t.Fatalf("PING with the password = %s, want PONG", describe(v))
	}
	user := newClient(t, Options{URL: "redis://app:app-s3cret@" + addr + "/0"})
	if v := do(t, user, "ACL", "WHOAMI"); v.Str != "app" {
		t.Fatalf("ACL WHOAMI = %s, want app", describe(v))
	}
	setenv(t, "LLMHEDGE_TEST_REDIS_PASSWORD", "s3cret-pw")
	fromEnv := newClient(t, Options{URL: "redis://" + addr, PasswordEnv: "LLMHEDGE_TEST_REDIS_PASSWORD"})
	if v := do(t, fromEnv, "PING"); v.Str != "PONG" {
		t.Fatalf("PING with the password from the environment = %s, want PONG", describe(v))
	}

	for _, bad := range []string{
		"redis://:wrong-hunter2@" + addr,
		"redis://app:wrong-hunter2@" + addr,
		"redis://nobody:wrong-hunter2@" + addr,
	} {
		c := newClient(t, Options{URL: bad})
		_, err := c.Do(ctxTimeout(t, 5*time.Second), "PING")
		if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Errorf("PING with a wrong password: err = %v, want WRONGPASS", err)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error %q contains the password", err.Error())
		}
		if s := c.Stats(); s.Open != 0 {
			t.Errorf("open connections after a failed AUTH = %d, want 0", s.Open)
		}
	}
	none := newClient(t, Options{URL: "redis://" + addr})
	if _, err := none.Do(ctxTimeout(t, 5*time.Second), "GET", "k"); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("GET without a password: err = %v, want NOAUTH", err)
	}
}

func TestSelectDatabase(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{Password: "pw"})
	db3 := newClient(t, Options{URL: "redis://:pw@" + srv.Addr() + "/3"})
	db0 := newClient(t, Options{URL: "redis://:pw@" + srv.Addr() + "/0"})
	do(t, db3, "SET", "only-in-3", "x")
	if v := do(t, db0, "EXISTS", "only-in-3"); v.Int != 0 {
		t.Fatalf("EXISTS in db 0 = %d, want 0", v.Int)
	}
	if v := do(t, db3, "EXISTS", "only-in-3"); v.Int != 1 {
		t.Fatalf("EXISTS in db 3 = %d, want 1", v.Int)
	}
}

func TestTLS(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{TLS: true, Password: "tls-pw"})
	// TLSConfig names no server: the client takes it from the URL's host,
	// 127.0.0.1, the certificate's address.
	c := newClient(t, Options{URL: srv.TLSURL(), TLSConfig: srv.TLSConfig()})
	do(t, c, "SET", "k", "over tls")
	if v := do(t, c, "GET", "k"); v.Str != "over tls" {
		t.Fatalf("GET over TLS = %s, want \"over tls\"", describe(v))
	}
	if d := c.Stats().Dials; d != 1 {
		t.Fatalf("Dials over TLS = %d, want 1 (the TLS connection reused)", d)
	}
	untrusted := newClient(t, Options{URL: srv.TLSURL()})
	_, err := untrusted.Do(ctxTimeout(t, 5*time.Second), "PING")
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("rediss:// without the test CA: err = %v, want a certificate error", err)
	}
	if strings.Contains(err.Error(), "tls-pw") {
		t.Fatalf("error %q contains the password", err.Error())
	}
}

func TestPoolReusesConnections(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL(), MaxOpen: 8, MaxIdle: 8})
	for i := 0; i < 500; i++ {
		do(t, c, "INCR", "seq")
	}
	if d := c.Stats().Dials; d != 1 {
		t.Fatalf("Dials after 500 sequential commands = %d, want 1", d)
	}
	const goroutines = 40
	const perGoroutine = 100
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go incrLoop(c, perGoroutine, &wg, errs)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent INCR: %v", err)
	}
	if v := do(t, c, "GET", "seq"); v.Str != strconv.Itoa(500+goroutines*perGoroutine) {
		t.Fatalf("seq = %s, want %d", v.Str, 500+goroutines*perGoroutine)
	}
	s := c.Stats()
	if s.Dials > 8 || s.Open > 8 {
		t.Fatalf("after %d concurrent callers: Dials %d, Open %d; want both ≤ MaxOpen 8", goroutines, s.Dials, s.Open)
	}
	if n := connectedClients(t, c); n != s.Open {
		t.Fatalf("server's connected_clients = %d, want the client's %d open connections", n, s.Open)
	}
}

func incrLoop(c *Client, n int, wg *sync.WaitGroup, errs chan error) {
	defer wg.Done()
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Do(ctx, "INCR", "seq")
		cancel()
		if err != nil {
			errs <- err
			return
		}
	}
}

// Each of many concurrent callers gets its own replies, never another's.
func TestConcurrentCallersGetTheirOwnReplies(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL(), MaxOpen: 4})
	const goroutines = 32
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go ownReplies(c, g, 50, &wg, errs)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func ownReplies(c *Client, id, n int, wg *sync.WaitGroup, errs chan error) {
	defer wg.Done()
	key := "own:" + strconv.Itoa(id)
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		want := key + ":" + strconv.Itoa(i) + strings.Repeat("x", id*37)
		values, err := c.Pipeline(ctx, [][]string{{"SET", key, want}, {"GET", key}, {"ECHO", want}})
		cancel()
		if err != nil {
			errs <- err
			return
		}
		if values[1].Str != want || values[2].Str != want {
			errs <- errors.New("caller " + strconv.Itoa(id) + " got another caller's reply: " + values[1].Str[:len(key)])
			return
		}
	}
}

func TestPausedServerTimesOutByTheDeadline(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL()})
	do(t, c, "PING")
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	// The second round dials a new connection (the timed-out one was
	// dropped): the kernel accepts it, the server never answers.
	for _, timeout := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond} {
		// start is taken before the deadline is set, so took can only
		// overstate the wait: a reply before the deadline shows as < timeout.
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		_, err := c.Do(ctx, "GET", "k")
		took := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("GET on a paused server: err = %v, want context.DeadlineExceeded", err)
		}
		// The server stays paused, so only the deadline can have ended the
		// GET (the error says so). wall clock: a lower bound on the
		// deadline's own duration; no upper bound, a slow machine may
		// return late.
		if took < timeout {
			t.Fatalf("GET on a paused server returned after %v, before its deadline %v", took, timeout)
		}
	}
	srv.Resume()
	resumed = true
	if v := do(t, c, "PING"); v.Str != "PONG" {
		t.Fatalf("PING after resume = %s, want PONG", describe(v))
	}
	if s := c.Stats(); s.Open != 1 {
		t.Fatalf("open connections after resume = %d, want 1 (the timed-out ones closed)", s.Open)
	}
}

func TestCancelInterruptsABlockedCommand(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL()})
	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan error, 1)
	go blockForever(c, ctx, result)
	// Wait until the server has the blocked client, then cancel.
	waitBlockedClients(t, c, 1)
	// XREAD BLOCK 0 on a stream nobody writes never returns by itself:
	// returning at all is the cancel's doing.
	cancel()
	err := awaitResult(t, result, "cancelled XREAD BLOCK 0")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled XREAD BLOCK 0: err = %v, want context.Canceled", err)
	}
	waitBlockedClients(t, c, 0)
}

// awaitResult waits for a call that only the test's own action can end.
// The guard is a hang detector, not a margin: the call returns at once
// after that action, and 30 s is only how long a hung test waits.
func awaitResult(t *testing.T, result chan error, what string) error {
	t.Helper()
	select {
	case err := <-result:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s never returned", what)
		return nil
	}
}

func blockForever(c *Client, ctx context.Context, result chan error) {
	_, err := c.Do(ctx, "XREAD", "BLOCK", "0", "STREAMS", "never", "$")
	result <- err
}

// waitBlockedClients polls INFO clients until blocked_clients is n.
func waitBlockedClients(t *testing.T, c *Client, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	want := "blocked_clients:" + strconv.Itoa(n) + "\r\n"
	for {
		if strings.Contains(do(t, c, "INFO", "clients").Str, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("blocked_clients never became %d", n)
		}
		time.Sleep(2 * time.Millisecond) // polling the server, bounded by deadline
	}
}

func TestBlockingCommandsHaveTheirOwnConnections(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL(), MaxOpen: 1, MaxBlocking: 4})
	do(t, c, "XADD", "s", "1-1", "f", "old")
	results := make(chan fleetstore.RedisValue, 3)
	for i := 0; i < 3; i++ {
		go readAfter(c, "1-1", results)
	}
	waitBlockedClients(t, c, 3)
	// Three blocked readers do not hold the one ordinary connection: if
	// they did, the XADD (the one thing that ends their reads) would wait
	// for it until its deadline, a hang guard rather than a margin.
	ctx := ctxTimeout(t, 30*time.Second)
	if _, err := c.Do(ctx, "XADD", "s", "2-1", "f", "new"); err != nil {
		t.Fatalf("XADD while 3 readers block: %v", err)
	}
	for i := 0; i < 3; i++ {
		v := <-results
		if !strings.Contains(describe(v), `"2-1" ["f" "new"]`) {
			t.Fatalf("reader %d got %s, want entry 2-1", i, describe(v))
		}
	}
	s := c.Stats()
	if s.Dials != 4 {
		t.Fatalf("Dials = %d, want 4 (1 ordinary, 3 blocking)", s.Dials)
	}
}

// A blocking pool full of readers (and with more readers waiting for one of
// its connections) leaves ordinary commands their own pool; a reader whose
// deadline passes while it waits gets fleetstore.ErrRedisBusy, not a Redis error.
func TestFullBlockingPoolLeavesPlainCommandsAlone(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL(), MaxOpen: 1, MaxBlocking: 2})
	held := make(chan error, 2)
	ctx, cancel := context.WithCancel(context.Background())
	for i := 0; i < 2; i++ {
		go blockForever(c, ctx, held)
	}
	waitBlockedClients(t, c, 2)
	queued := make(chan error, 1)
	go blockForever(c, ctx, queued)
	waitBlockingWaiters(t, c, 1)

	// The one ordinary connection is free: the command is answered while
	// every read stays blocked (they block until cancelled; the deadline
	// is a hang guard, not a margin).
	if _, err := c.Do(ctxTimeout(t, 30*time.Second), "SET", "k", "v"); err != nil {
		t.Fatalf("SET with the blocking pool full and a reader queued: %v", err)
	}
	if v := do(t, c, "GET", "k"); v.Str != "v" {
		t.Fatalf("GET k = %s, want \"v\"", describe(v))
	}

	// A reader that waits for a blocking connection past its deadline.
	_, err := c.Do(ctxTimeout(t, 50*time.Millisecond), "XREAD", "BLOCK", "10", "STREAMS", "s", "$")
	if !errors.Is(err, fleetstore.ErrRedisBusy) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("XREAD BLOCK waiting on a full blocking pool: err = %v, want fleetstore.ErrRedisBusy and context.DeadlineExceeded", err)
	}
	cancel()
	for i := 0; i < 3; i++ {
		var err error
		if i < 2 {
			err = <-held
		} else {
			err = <-queued
		}
		if !errors.Is(err, context.Canceled) || errors.Is(err, fleetstore.ErrRedisBusy) {
			t.Fatalf("cancelled reader %d: err = %v, want context.Canceled and not busy (the caller left)", i, err)
		}
	}
}

// Three times as many readers as blocking connections, each bounded like a
// fleet follower's read (a deadline past its BLOCK time plus blockSlack):
// no reader fails with anything but fleetstore.ErrRedisBusy (a reader that got
// its connection late blocks for what is left, so Redis' own timeout ends
// it before its deadline), and plain commands meanwhile succeed. The first
// eight block 200ms; the next eight get connections at 200ms or later and
// block until 400ms at most (600 - 200 slack); the last eight get theirs at
// 400ms or later, with no time left: busy, without being sent.
func TestReadersBeyondTheBlockingPoolAreBusyNotFailed(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL(), MaxBlocking: 8})
	const readers = 24
	results := make(chan error, readers)
	for i := 0; i < readers; i++ {
		go boundedRead(c, results)
	}
	waitBlockedClients(t, c, 8)
	if _, err := c.Do(ctxTimeout(t, 30*time.Second), "SET", "plain", "1"); err != nil { // a hang guard: the SET needs no blocking connection
		t.Fatalf("SET with %d readers on 8 blocking connections: %v", readers, err)
	}
	busy := 0
	for i := 0; i < readers; i++ {
		err := <-results
		if err == nil {
			continue
		}
		if !errors.Is(err, fleetstore.ErrRedisBusy) {
			t.Fatalf("reader error %v, want nil or fleetstore.ErrRedisBusy", err)
		}
		busy++
	}
	// wall clock: fitting a BLOCK into what is left of the deadline is the
	// thing under test. A slow machine only adds busy readers, so the lower
	// bound holds under load; the upper bound needs the second eight to get
	// their connections within 200ms of the first eight's end.
	if busy < 8 || busy > readers-8 {
		t.Fatalf("busy readers = %d, want 8 to %d (the first 8 read, the last 8 cannot)", busy, readers-8)
	}
	if s := c.Stats(); s.Open > 8+1 {
		t.Fatalf("open connections = %d, want at most 8 blocking + 1", s.Open)
	}
}

func boundedRead(c *Client, results chan error) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond+blockSlack+200*time.Millisecond)
	defer cancel()
	_, err := c.Do(ctx, "XREAD", "BLOCK", "200", "STREAMS", "nothing", "$")
	results <- err
}

// fitBlock shortens a BLOCK that would outlast the deadline (less
// blockSlack), copies what it changes, and leaves BLOCK 0, other commands
// and a caller's own short deadline alone.
func TestFitBlock(t *testing.T) {
	ctx := ctxTimeout(t, blockSlack+time.Second)
	cmds := [][]string{{"XREAD", "COUNT", "1", "BLOCK", "5000", "STREAMS", "s", "$"}, {"PING"}, {"XREAD", "BLOCK", "0", "STREAMS", "s", "$"}}
	fitted, ok := fitBlock(ctx, cmds, true)
	if !ok {
		t.Fatal("fitBlock with 1s of room: not ok")
	}
	ms, err := strconv.Atoi(fitted[0][4])
	if err != nil || ms > 1000 || ms < 1 {
		t.Fatalf("BLOCK 5000 with 1s of room became %q, want 1..1000", fitted[0][4])
	}
	if cmds[0][4] != "5000" {
		t.Fatalf("the caller's command changed to BLOCK %s", cmds[0][4])
	}
	if fitted[1][0] != "PING" || fitted[2][2] != "0" {
		t.Fatalf("other commands changed: %q", fitted[1:])
	}
	short := ctxTimeout(t, blockSlack/2)
	if got, ok := fitBlock(short, cmds, false); !ok || got[0][4] != "5000" {
		t.Fatalf("no room, no wait: %q, %v; want the command as asked", got, ok)
	}
	if _, ok := fitBlock(short, cmds, true); ok {
		t.Fatal("no room after a wait: ok, want not ok (busy)")
	}
	if got, ok := fitBlock(context.Background(), cmds, true); !ok || got[0][4] != "5000" {
		t.Fatalf("no deadline: %q, %v; want the command as asked", got, ok)
	}
}

// waitBlockingWaiters polls until n callers wait for a blocking connection.
func waitBlockingWaiters(t *testing.T, c *Client, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := poolWaiters(c.single.blocking)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("callers waiting for a blocking connection = %d, never %d", got, n)
		}
		time.Sleep(time.Millisecond) // polling the pool, bounded by deadline
	}
}

// Readers that come back for their next read find their connections idle:
// the blocking pool keeps every one (MaxIdle bounds ordinary ones only).
func TestBlockingConnectionsStayForTheNextReads(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL(), MaxIdle: 1, MaxBlocking: 8})
	results := make(chan fleetstore.RedisValue, 8)
	for round := 1; round <= 3; round++ {
		after := strconv.Itoa(round) + "-1"
		for i := 0; i < 8; i++ {
			go readAfter(c, after, results)
		}
		waitBlockedClients(t, c, 8)
		do(t, c, "XADD", "s", strconv.Itoa(round+1)+"-1", "f", "v")
		for i := 0; i < 8; i++ {
			if v := <-results; v.Kind != fleetstore.RedisArray {
				t.Fatalf("round %d: reader %d got %s, want the new entry", round, i, describe(v))
			}
		}
	}
	if dials, _, _ := poolStats(c.single.blocking); dials != 8 {
		t.Fatalf("blocking connections dialed over 3 rounds of 8 readers = %d, want 8 (kept idle between rounds)", dials)
	}
}

func readAfter(c *Client, id string, results chan fleetstore.RedisValue) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := c.Do(ctx, "XREAD", "BLOCK", "5000", "STREAMS", "s", id)
	if err != nil {
		var empty fleetstore.RedisValue
		empty.Kind = fleetstore.RedisString
		empty.Str = "error: " + err.Error()
		results <- empty
		return
	}
	results <- v
}

func TestPoolWaitEndsAtTheDeadline(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL(), MaxOpen: 1})
	do(t, c, "PING")
	srv.Pause()
	// The first caller has no deadline: only the resume below ends it, so
	// its connection stays taken for the whole of the second call.
	held := make(chan error, 1)
	go func() {
		_, err := c.Do(context.Background(), "GET", "k")
		held <- err
	}()
	waitOpenInUse(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := c.Do(ctx, "GET", "k")
	cancel()
	if err == nil || !strings.Contains(err.Error(), "waiting for a connection") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second caller with MaxOpen 1 held: err = %v, want a DeadlineExceeded wait for a connection", err)
	}
	if !errors.Is(err, fleetstore.ErrRedisBusy) {
		t.Fatalf("second caller with MaxOpen 1 held: err = %v, want it to wrap fleetstore.ErrRedisBusy (no connection free is not a Redis failure)", err)
	}
	// The connection was never freed, so the second caller's wait ended
	// by its own deadline, not by the first caller's end.
	select {
	case err := <-held:
		t.Fatalf("first caller ended (%v) before the resume, want it held while the second waited", err)
	default:
	}
	srv.Resume()
	if err := awaitResult(t, held, "the first caller after resume"); err != nil {
		t.Fatalf("first caller after resume: %v", err)
	}
	do(t, c, "PING")
}

// waitOpen polls until the client has n open connections.
func waitOpen(t *testing.T, c *Client, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c.Stats().Open == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("open connections = %d, never %d", c.Stats().Open, n)
		}
		time.Sleep(time.Millisecond) // polling the client's counters, bounded by deadline
	}
}

// waitOpenInUse polls until the client's one connection is in use.
func waitOpenInUse(t *testing.T, c *Client) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := c.Stats()
		if s.Open == 1 && s.Idle == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the connection never got taken: %+v", s)
		}
		time.Sleep(time.Millisecond) // polling the client's counters, bounded by deadline
	}
}

func TestServerKilledMidCommandThenRestarted(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL()})
	do(t, c, "SET", "k", "v")
	// BLPOP 0 without a deadline never returns by itself: only the kill
	// can end it.
	result := make(chan error, 1)
	go func() {
		_, err := c.Do(context.Background(), "BLPOP", "nolist", "0")
		result <- err
	}()
	waitBlockedClients(t, c, 1)
	srv.Kill()
	err := awaitResult(t, result, "BLPOP on a killed server")
	if err == nil {
		t.Fatalf("BLPOP on a killed server returned no error")
	}
	// While the server is down: a fast error, never a hang.
	if _, err := c.Do(ctxTimeout(t, 2*time.Second), "GET", "k"); err == nil {
		t.Fatalf("GET on a killed server returned no error")
	}
	srv.Restart()
	// The idle connection from before the kill is noticed dead, not used.
	do(t, c, "SET", "k", "again")
	if v := do(t, c, "GET", "k"); v.Str != "again" {
		t.Fatalf("GET after restart = %s, want \"again\"", describe(v))
	}
	if s := c.Stats(); s.Open != 1 {
		t.Fatalf("open connections after restart = %d, want 1", s.Open)
	}
}

func TestConnectionClosedByTheServerIsReplaced(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL()})
	admin := newClient(t, Options{URL: srv.URL()})
	id := do(t, c, "CLIENT", "ID").Int
	do(t, admin, "CLIENT", "KILL", "ID", strconv.FormatInt(id, 10))
	waitClientGone(t, admin, id)
	waitOpen(t, c, 0)
	// The killed connection sits idle in c's pool: the next command must
	// not fail on it.
	if v := do(t, c, "PING"); v.Str != "PONG" {
		t.Fatalf("PING after the server closed the idle connection = %s, want PONG", describe(v))
	}
	if d := c.Stats().Dials; d != 2 {
		t.Fatalf("Dials = %d, want 2 (the closed one replaced)", d)
	}
}

func TestCloseFailsLaterCommands(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL()})
	do(t, c, "PING")
	_ = c.Close()
	if _, err := c.Do(ctxTimeout(t, time.Second), "PING"); !errors.Is(err, errClosed) {
		t.Fatalf("Do after Close: err = %v, want %v", err, errClosed)
	}
	if s := c.Stats(); s.Open != 0 {
		t.Fatalf("open connections after Close = %d, want 0", s.Open)
	}
}

// waitClientGone polls CLIENT LIST until the connection id is gone.
func waitClientGone(t *testing.T, admin *Client, id int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	want := "id=" + strconv.FormatInt(id, 10) + " "
	for {
		if !strings.Contains(do(t, admin, "CLIENT", "LIST").Str, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("client %d still listed after CLIENT KILL", id)
		}
		time.Sleep(time.Millisecond) // polling the server, bounded by deadline
	}
}

func TestIdleConnectionsCloseAfterIdleTimeout(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL(), IdleTimeout: 50 * time.Millisecond})
	do(t, c, "PING")
	if s := c.Stats(); s.Open != 1 || s.Idle != 1 {
		t.Fatalf("after one command: Open %d, Idle %d; want 1, 1", s.Open, s.Idle)
	}
	waitOpen(t, c, 0)
	do(t, c, "PING")
	if d := c.Stats().Dials; d != 2 {
		t.Fatalf("Dials = %d, want 2 (the idle connection closed, a new one dialed)", d)
	}
}

func TestEndedContextSendsNothing(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c := newClient(t, Options{URL: srv.URL()})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Do(ctx, "SET", "k", "v"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do with a cancelled context: err = %v, want context.Canceled", err)
	}
	if d := c.Stats().Dials; d != 0 {
		t.Fatalf("Dials = %d, want 0", d)
	}
	if v := do(t, c, "EXISTS", "k"); v.Int != 0 {
		t.Fatalf("EXISTS k = %d, want 0 (the SET was never sent)", v.Int)
	}
}
