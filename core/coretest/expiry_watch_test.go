package coretest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// expiryWatch records the keys Redis expires, from its own keyspace
// notifications: the event that tells a lease that ran out (a leader whose
// renewals a starved machine delayed past the lease) from a defect.
type expiryWatch struct {
	conn net.Conn
	rd   *bufio.Reader
	mu   sync.Mutex
	keys []string
	pong chan struct{}
}

// watchExpiries subscribes to srv's expired-key events; the test's end
// closes the subscription.
func watchExpiries(t *testing.T, srv *redisproc.Server) *expiryWatch {
	t.Helper()
	redisDo(t, srv, "CONFIG", "SET", "notify-keyspace-events", "Ex")
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	w := &expiryWatch{conn: conn, rd: bufio.NewReader(conn), pong: make(chan struct{}, 1)}
	fmt.Fprintf(conn, "*2\r\n$9\r\nSUBSCRIBE\r\n$%d\r\n%s\r\n", len(expiredChannel), expiredChannel)
	if msg, err := w.read(); err != nil || len(msg) < 1 || msg[0] != "subscribe" {
		t.Fatalf("SUBSCRIBE %s: %q, %v", expiredChannel, msg, err)
	}
	done := make(chan struct{})
	go w.run(done)
	t.Cleanup(func() { conn.Close(); <-done })
	return w
}

const expiredChannel = "__keyevent@0__:expired"

func (w *expiryWatch) run(done chan struct{}) {
	defer close(done)
	for {
		msg, err := w.read()
		if err != nil {
			return
		}
		switch {
		case len(msg) == 3 && msg[0] == "message":
			w.mu.Lock()
			w.keys = append(w.keys, msg[2])
			w.mu.Unlock()
		case len(msg) >= 1 && msg[0] == "pong":
			w.pong <- struct{}{}
		}
	}
}

// leases are the lease keys expired so far: after a PING through the
// subscription, so every expiry Redis published before it is counted.
func (w *expiryWatch) leases(t *testing.T) []string {
	t.Helper()
	fmt.Fprintf(w.conn, "*1\r\n$4\r\nPING\r\n")
	select {
	case <-w.pong:
	case <-time.After(30 * time.Second): // bounds a failure only
		t.Fatal("no PONG through the expiry subscription within 30s")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, k := range w.keys {
		if strings.HasSuffix(k, ":lease") {
			out = append(out, k)
		}
	}
	return out
}

// read reads one RESP array of bulk strings (what a subscription sends).
func (w *expiryWatch) read() ([]string, error) {
	line, err := w.rd.ReadString('\n')
	if err != nil {
		return nil, err
	}
	var n int
	if _, err := fmt.Sscanf(line, "*%d\r\n", &n); err != nil {
		return nil, fmt.Errorf("not an array: %q", line)
	}
	out := make([]string, 0, n)
	for i := 0; i < n; i++ {
		head, err := w.rd.ReadString('\n')
		if err != nil {
			return nil, err
		}
		switch head[0] {
		case ':':
			out = append(out, strings.TrimSpace(head[1:]))
		case '$':
			var size int
			if _, err := fmt.Sscanf(head, "$%d\r\n", &size); err != nil {
				return nil, err
			}
			buf := make([]byte, size+2)
			if _, err := io.ReadFull(w.rd, buf); err != nil {
				return nil, err
			}
			out = append(out, string(buf[:size]))
		default:
			return nil, fmt.Errorf("unexpected %q", head)
		}
	}
	return out, nil
}
