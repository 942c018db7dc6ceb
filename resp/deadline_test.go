package resp

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// stalledConn is one end of a pipe whose first Read reports its deadline
// passed, as a process too busy to run before its deadline finds it.
type stalledConn struct {
	net.Conn
	stalled bool
}

func (c *stalledConn) Read(p []byte) (int, error) {
	if !c.stalled {
		c.stalled = true
		return 0, os.ErrDeadlineExceeded
	}
	return c.Conn.Read(p)
}

// lateReplyConn returns a conn whose first read times out and whose peer
// wrote reply (none when empty).
func lateReplyConn(t *testing.T, reply string) *conn {
	client, server := net.Pipe()
	t.Cleanup(func() { client.Close(); server.Close() })
	if reply != "" {
		go server.Write([]byte(reply))
	}
	nc := &stalledConn{Conn: client}
	return &conn{nc: nc, r: bufio.NewReader(nc)}
}

// A reply that is there when the deadline is noticed counts: the claim's
// answer, not a timeout that says nothing of whether it landed.
func TestLateReplyAlreadyDeliveredIsRead(t *testing.T) {
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	cn := lateReplyConn(t, "+OK\r\n")
	if err := awaitReply(ctx, cn); err != nil {
		t.Fatalf("awaitReply with the reply delivered: %v, want the reply", err)
	}
	v, replyErr, ioErr := readReply(cn.r)
	if ioErr != nil || replyErr != nil || v.Str != "OK" {
		t.Fatalf("reply %q, %v, %v; want OK", v.Str, replyErr, ioErr)
	}
}

// No reply within the grace: the timeout stands.
func TestLateReplyMissingTimesOut(t *testing.T) {
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	err := awaitReply(ctx, lateReplyConn(t, ""))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("awaitReply with nothing delivered: %v, want a timeout", err)
	}
}

// A caller that cancelled gets no second look, even at a delivered reply.
func TestLateReplyNotReadAfterCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := awaitReply(ctx, lateReplyConn(t, "+OK\r\n")); err == nil {
		t.Fatal("awaitReply after the caller cancelled read the reply, want its timeout")
	}
}

// silentServer accepts connections and never answers: a Redis that takes
// the TCP connection but not the setup (AUTH) in time.
func silentServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// A dial its operation's deadline ends first goes on: the operation gets
// fleetstore.ErrRedisBusy (a wait for a connection, not a Redis failure) until
// a dial has failed (here: the server never answers AUTH within
// DialTimeout), then that failure. The wall clock is the subject:
// DialTimeout's own length.
func TestDialLeftByItsCallerIsBusyUntilItFails(t *testing.T) {
	const dialTimeout = 300 * time.Millisecond
	c, err := New(Options{URL: "redis://:secret@" + silentServer(t) + "/0", DialTimeout: dialTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	do := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		_, err := c.Do(ctx, "PING")
		return err
	}
	first := time.Now()
	if err := do(); !errors.Is(err, fleetstore.ErrRedisBusy) {
		t.Fatalf("first operation, its dial still going at its 20ms deadline: %v, want fleetstore.ErrRedisBusy", err)
	}
	for {
		err := do()
		if err == nil {
			t.Fatal("PING answered by a server that never answers")
		}
		if !errors.Is(err, fleetstore.ErrRedisBusy) {
			if since := time.Since(first); since < dialTimeout {
				t.Fatalf("%v after the first dial began: %v, want fleetstore.ErrRedisBusy until it fails at %v", since, err, dialTimeout)
			}
			return
		}
		if time.Since(first) > 30*time.Second { // hang guard
			t.Fatalf("still fleetstore.ErrRedisBusy 30s after the first dial began: %v", err)
		}
	}
}

// gatedServer answers AUTH once gate is closed, then PONG to every
// command.
func gatedServer(t *testing.T, gate chan struct{}) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer nc.Close()
				r := bufio.NewReader(nc)
				if _, _, err := readReply(r); err != nil { // AUTH
					return
				}
				<-gate
				nc.Write([]byte("+OK\r\n"))
				for {
					if _, _, err := readReply(r); err != nil {
						return
					}
					nc.Write([]byte("+PONG\r\n"))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// A connection whose dial outlasted its operation goes to the pool: the
// next operation uses it, with no second dial.
func TestDialLeftByItsCallerPoolsItsConnection(t *testing.T) {
	gate := make(chan struct{})
	c, err := New(Options{URL: "redis://:secret@" + gatedServer(t, gate) + "/0", DialTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	_, err = c.Do(ctx, "PING")
	cancel()
	if !errors.Is(err, fleetstore.ErrRedisBusy) {
		t.Fatalf("operation whose dial waits on AUTH past its deadline: %v, want fleetstore.ErrRedisBusy", err)
	}
	close(gate)
	for start := time.Now(); ; time.Sleep(time.Millisecond) { // polling the pool for the dial's end, not a margin
		if _, _, idle := poolStats(c.single.general); idle == 1 {
			break
		}
		if time.Since(start) > 30*time.Second { // hang guard
			t.Fatal("the dial's connection never reached the pool")
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if v, err := c.Do(ctx, "PING"); err != nil || v.Str != "PONG" {
		t.Fatalf("PING on the pooled connection: %q, %v; want PONG", v.Str, err)
	}
	if dials, _, _ := poolStats(c.single.general); dials != 1 {
		t.Errorf("dials = %d, want 1 (the first dial's connection reused)", dials)
	}
}
