package redisproc

import (
	"bufio"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Monitor counts the commands a server runs (MONITOR), split by where they
// come from: sent by clients, or called by a script inside an EVAL or
// EVALSHA (which INFO commandstats counts alike).
type Monitor struct {
	server *Server
	conn   net.Conn
	done   chan struct{}

	mu        sync.Mutex
	seen      *sync.Cond // a line was counted
	sent      Calls
	inScripts Calls
	marks     int
	lastMark  string
}

// Monitor starts counting the server's commands (its own MONITOR
// connection; the commands of the test's INFO and other admin calls count
// too: Since's ignore drops them).
func (s *Server) Monitor() (*Monitor, error) {
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		return nil, err
	}
	r := bufio.NewReader(conn)
	if s.opts.Password != "" {
		if _, err := conn.Write(encodeCommand([]string{"AUTH", s.opts.Password})); err != nil {
			conn.Close()
			return nil, err
		}
		if _, err := readReply(r); err != nil {
			conn.Close()
			return nil, err
		}
	}
	if _, err := conn.Write(encodeCommand([]string{"MONITOR"})); err != nil {
		conn.Close()
		return nil, err
	}
	if _, err := readReply(r); err != nil { // +OK
		conn.Close()
		return nil, err
	}
	m := &Monitor{server: s, conn: conn, done: make(chan struct{}), sent: Calls{}, inScripts: Calls{}}
	m.seen = sync.NewCond(&m.mu)
	go m.read(r)
	return m, nil
}

// read counts each line: `+<time> [<db> <client or "lua">] "<command>" ...`.
func (m *Monitor) read(r *bufio.Reader) {
	defer func() {
		m.mu.Lock()
		close(m.done)
		m.seen.Broadcast()
		m.mu.Unlock()
	}()
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if i := strings.Index(strings.ToLower(line), `"echo" "`+markPrefix); i >= 0 {
			m.mu.Lock()
			m.lastMark = strings.TrimRight(line[i+len(`"echo" "`):], "\"\r\n")
			m.seen.Broadcast()
			m.mu.Unlock()
			continue
		}
		_, rest, ok := strings.Cut(line, "] \"")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(rest, "\"")
		name = strings.ToLower(name)
		m.mu.Lock()
		if strings.Contains(line, " lua] ") {
			m.inScripts[name]++
		} else {
			m.sent[name]++
		}
		m.mu.Unlock()
	}
}

const markPrefix = "llmhedge-monitor-mark-"

// Counts returns the commands run so far: sent by clients, and called by
// scripts. It first sends a mark (ECHO) and waits until MONITOR shows it,
// so every command that ran before the call is counted.
func (m *Monitor) Counts() (sent, inScripts Calls, err error) {
	m.mu.Lock()
	m.marks++
	mark := markPrefix + strconv.Itoa(m.marks)
	m.mu.Unlock()
	if _, err := m.server.Do("ECHO", mark); err != nil {
		return nil, nil, err
	}
	timedOut := false
	timer := time.AfterFunc(10*time.Second, func() {
		m.mu.Lock()
		timedOut = true
		m.seen.Broadcast()
		m.mu.Unlock()
	})
	defer timer.Stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.lastMark != mark {
		select {
		case <-m.done:
			return nil, nil, errors.New("the MONITOR connection ended before the mark")
		default:
		}
		if timedOut {
			return nil, nil, errors.New("MONITOR did not show the mark " + mark + " within 10s")
		}
		m.seen.Wait()
	}
	sent, inScripts = Calls{}, Calls{}
	for k, v := range m.sent {
		sent[k] = v
	}
	for k, v := range m.inScripts {
		inScripts[k] = v
	}
	return sent, inScripts, nil
}

// Close stops counting.
func (m *Monitor) Close() {
	m.conn.Close()
	<-m.done
}
