package redisproc

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// command sends one inline command on a fresh connection and returns the
// first reply line (the kit's own tests need no RESP client).
func command(t *testing.T, dial func() (net.Conn, error), lines ...string) string {
	t.Helper()
	conn, err := dial()
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	last := ""
	for _, line := range lines {
		if _, err := conn.Write([]byte(line + "\r\n")); err != nil {
			t.Fatalf("write %q: %v", line, err)
		}
		reply, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reply to %q: %v", line, err)
		}
		last = strings.TrimRight(reply, "\r\n")
	}
	return last
}

func plainDial(s *Server) func() (net.Conn, error) {
	return func() (net.Conn, error) { return net.DialTimeout("tcp", s.Addr(), time.Second) }
}

func TestStartKillRestart(t *testing.T) {
	s := Start(t, Options{})
	if got := command(t, plainDial(s), "SET k v", "GET k"); got != "$1" {
		t.Fatalf("GET k = %q, want $1 (a one-byte bulk string)", got)
	}
	if got := command(t, plainDial(s), "CONFIG GET save"); got != "*2" {
		t.Fatalf("CONFIG GET save header = %q, want *2", got)
	}
	port := s.Addr()
	s.Kill()
	if conn, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		conn.Close()
		t.Fatalf("dial after Kill succeeded, want connection refused")
	}
	s.Restart()
	if s.Addr() != port {
		t.Fatalf("Addr after Restart = %s, want %s", s.Addr(), port)
	}
	if got := command(t, plainDial(s), "GET k"); got != "$-1" {
		t.Fatalf("GET k after restart = %q, want $-1 (no persistence)", got)
	}
}

func TestPauseResume(t *testing.T) {
	s := Start(t, Options{})
	s.Pause()
	conn, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		t.Fatalf("dial a paused server: %v (the kernel still accepts)", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		t.Fatalf("write: %v", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	r := bufio.NewReader(conn)
	if line, err := r.ReadString('\n'); err == nil {
		t.Fatalf("paused server answered %q, want no answer", line)
	}
	s.Resume()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := r.ReadString('\n')
	if err != nil || line != "+PONG\r\n" {
		t.Fatalf("after Resume: reply %q, err %v; want +PONG", line, err)
	}
}

func TestPasswordAndUser(t *testing.T) {
	s := Start(t, Options{Password: "s3cret", User: "app", UserPassword: "apppw"})
	if got := command(t, plainDial(s), "GET k"); !strings.HasPrefix(got, "-NOAUTH") {
		t.Fatalf("GET without AUTH = %q, want -NOAUTH", got)
	}
	if got := command(t, plainDial(s), "AUTH s3cret", "PING"); got != "+PONG" {
		t.Fatalf("PING after AUTH password = %q, want +PONG", got)
	}
	if got := command(t, plainDial(s), "AUTH app apppw", "PING"); got != "+PONG" {
		t.Fatalf("PING after AUTH user password = %q, want +PONG", got)
	}
	if !strings.Contains(s.URL(), ":s3cret@127.0.0.1:") {
		t.Fatalf("URL = %q, want the requirepass password in its userinfo", s.URL())
	}
}

func TestTLS(t *testing.T) {
	s := Start(t, Options{TLS: true})
	dial := func() (net.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", s.TLSAddr(), s.TLSConfig())
	}
	if got := command(t, dial, "PING"); got != "+PONG" {
		t.Fatalf("PING over TLS = %q, want +PONG", got)
	}
	if !strings.HasPrefix(s.TLSURL(), "rediss://127.0.0.1:") {
		t.Fatalf("TLSURL = %q, want rediss://127.0.0.1:<port>/0", s.TLSURL())
	}
	// A client that does not trust the test CA is refused.
	_, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", s.TLSAddr(), &tls.Config{})
	if err == nil {
		t.Fatalf("TLS dial without the test CA succeeded, want a certificate error")
	}
}

// stopped ends a fakeTB's test, as Fatal and Skip end a real one.
type stopped struct{}

// fakeTB records what Start reports instead of ending the test.
type fakeTB struct {
	testing.TB
	fatal, skip string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatal(args ...any) {
	f.fatal = fmt.Sprint(args...)
	panic(stopped{})
}
func (f *fakeTB) Skip(args ...any) {
	f.skip = fmt.Sprint(args...)
	panic(stopped{})
}

func startWithout(t *testing.T) *fakeTB {
	saved, savedShort := binaryCandidates, short
	binaryCandidates = func() []string { return []string{"/nonexistent/redis-server"} }
	short = func() bool { return false } // nothing starts: the binary is missing
	defer func() { binaryCandidates, short = saved, savedShort }()
	f := &fakeTB{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(stopped); !ok {
					panic(r)
				}
			}
		}()
		Start(f, Options{})
	}()
	return f
}

// A missing redis-server fails the test with the command that installs
// it; LLMHEDGE_REDIS=skip makes it a skip.
func TestMissingRedisServerFailsWithTheInstallCommand(t *testing.T) {
	f := startWithout(t)
	if f.skip != "" || !strings.Contains(f.fatal, "apt-get install -y redis-server") {
		t.Fatalf("without redis-server: Fatal %q, Skip %q; want a Fatal naming apt-get install -y redis-server", f.fatal, f.skip)
	}
	if err := os.Setenv("LLMHEDGE_REDIS", "skip"); err != nil {
		t.Fatal(err)
	}
	defer os.Unsetenv("LLMHEDGE_REDIS")
	f = startWithout(t)
	if f.fatal != "" || !strings.Contains(f.skip, "apt-get install -y redis-server") {
		t.Fatalf("without redis-server, LLMHEDGE_REDIS=skip: Fatal %q, Skip %q; want a Skip naming the install command", f.fatal, f.skip)
	}
}
