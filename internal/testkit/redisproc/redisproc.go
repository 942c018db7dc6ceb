// Package redisproc starts a real redis-server for a test: Debian's
// redis-server (7.0) on a free loopback port, with its own temporary
// directory and no persistence, stopped by t.Cleanup. A test can kill it
// (SIGKILL), restart it on the same port, pause and resume it
// (SIGSTOP/SIGCONT), and ask for a password (requirepass), an ACL user and
// TLS (a self-signed certificate written into the temp dir). StartCluster
// starts a Redis Cluster of such servers (cluster.go), joined by redis-cli.
//
// A missing redis-server fails the test, with the command that installs it
// (`make test` installs it itself). LLMHEDGE_REDIS=skip turns that failure
// into a skip, for a machine where Redis cannot be installed.
//
// The package is written in the Go subset Yaegi runs (no select, no os/exec:
// `yaegi test ./resp` interprets it without -unrestricted), so the resp
// client's tests run against the same server compiled and interpreted.
package redisproc

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/testcert"
)

// InstallHint is the command that installs redis-server on Debian and
// Ubuntu; the failure message for a missing binary gives it.
const InstallHint = "apt-get install -y redis-server (as root, or with sudo; `make test` runs it when redis-server is missing)"

// startTimeout bounds how long Start and Restart wait for the server to
// answer PING. Generous on purpose: a server that answers ends the wait at
// once, so the bound only decides how long a broken start takes to fail
// (a busy 2-core machine running several test packages is slow to exec).
const startTimeout = 120 * time.Second

// logLines is how many of the server's last output lines a failed start
// quotes.
const logLines = 20

// Options configure the server. The zero value is a plain server without
// authentication on one loopback port.
type Options struct {
	// Password sets requirepass: the default user needs AUTH <password>.
	Password string
	// User and UserPassword add an ACL user with every permission, for
	// AUTH <user> <password>.
	User         string
	UserPassword string
	// TLS adds a TLS port (tls-port) next to the plain one, with a
	// self-signed server certificate for 127.0.0.1. Clients need no
	// certificate of their own.
	TLS bool
	// Args are further redis-server arguments, e.g. "--maxclients", "100".
	Args []string

	// cluster makes the server a Redis Cluster node (StartCluster): it
	// gets a cluster bus port of its own and clusterNodeTimeout.
	cluster            bool
	clusterNodeTimeout time.Duration
}

// Server is one running (or killed, or paused) redis-server.
type Server struct {
	t       testing.TB
	bin     string
	dir     string
	opts    Options
	port    int
	tlsPort int
	busPort int // cluster bus (cluster nodes only)

	// CAFile is the PEM file of the certificate clients trust (TLS only;
	// the server's own, self-signed); CAPool holds it.
	CAFile string
	CAPool *x509.CertPool

	certFile, keyFile string

	mu   sync.Mutex
	proc *process // nil when killed
}

// Start starts a redis-server for t and registers its stop in t.Cleanup.
// It returns once the server answers PING.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	skipShort(t, "redis-server")
	bin := firstExecutable(binaryCandidates())
	if bin == "" {
		if os.Getenv("LLMHEDGE_REDIS") == "skip" {
			t.Skip("redis-server not found (LLMHEDGE_REDIS=skip); install it with: " + InstallHint)
		}
		t.Fatal("redis-server not found in /usr/bin or PATH: the fleet tests need a real Redis; install it with: " + InstallHint)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), opts: opts}
	if opts.TLS {
		s.writeCertificates()
	}
	t.Cleanup(s.Stop)
	// A free port found by listening on :0 can be taken by another process
	// before redis-server binds it: try a few ports.
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatal("redisproc: no free port: " + err.Error())
		}
		s.port = port
		if opts.TLS {
			tlsPort, err := freePort()
			if err != nil {
				t.Fatal("redisproc: no free port: " + err.Error())
			}
			s.tlsPort = tlsPort
		}
		if opts.cluster {
			// Not port+10000 (the default): an ephemeral port plus
			// 10000 may be past 65535.
			busPort, err := freePort()
			if err != nil {
				t.Fatal("redisproc: no free port: " + err.Error())
			}
			s.busPort = busPort
		}
		lastErr = s.start()
		if lastErr == nil {
			return s
		}
		if !strings.Contains(lastErr.Error(), "in use") {
			break
		}
	}
	t.Fatal("redisproc: " + lastErr.Error())
	return nil
}

// Addr is the plain TCP address, "127.0.0.1:<port>".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// TLSAddr is the TLS address ("" without Options.TLS).
func (s *Server) TLSAddr() string {
	if s.tlsPort == 0 {
		return ""
	}
	return "127.0.0.1:" + strconv.Itoa(s.tlsPort)
}

// URL is redis://[:password@]127.0.0.1:<port>/0 (the requirepass password,
// if any).
func (s *Server) URL() string { return "redis://" + s.userinfo() + s.Addr() + "/0" }

// TLSURL is the rediss:// form of URL ("" without Options.TLS).
func (s *Server) TLSURL() string {
	if s.tlsPort == 0 {
		return ""
	}
	return "rediss://" + s.userinfo() + s.TLSAddr() + "/0"
}

func (s *Server) userinfo() string {
	if s.opts.Password == "" {
		return ""
	}
	return ":" + s.opts.Password + "@"
}

// Do sends one command to the server (with its password) on a connection
// of its own and returns its reply as text, as Cluster.Do does.
func (s *Server) Do(args ...string) (string, error) {
	return clusterCommand(s.Addr(), s.opts.Password, args...)
}

// Dir is the server's working directory (its log is redis.log there).
func (s *Server) Dir() string { return s.dir }

// Pid is the process id of the running server (0 when killed).
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.os.Pid
}

// Kill sends SIGKILL and waits for the process to end. Open connections see
// a reset; the port refuses connections until Restart.
func (s *Server) Kill() {
	s.mu.Lock()
	run := s.proc
	s.proc = nil
	s.mu.Unlock()
	if run == nil {
		return
	}
	_ = run.os.Kill()
	<-run.exited
}

// Restart starts the server again on the same port(s), killing it first if
// it still runs, and waits until it answers PING. The data is gone (no
// persistence), as after a crash of a cache-only Redis.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	if err := s.start(); err != nil {
		s.t.Fatal("redisproc: restart: " + err.Error())
	}
}

// Pause stops the process (SIGSTOP): connections stay open and commands
// wait unanswered, as with a Redis stuck in a slow command or a GC'd VM.
func (s *Server) Pause() {
	s.t.Helper()
	if err := s.signal("-STOP"); err != nil {
		s.t.Fatal("redisproc: pause: " + err.Error())
	}
}

// Resume continues a paused process (SIGCONT).
func (s *Server) Resume() {
	s.t.Helper()
	if err := s.signal("-CONT"); err != nil {
		s.t.Fatal("redisproc: resume: " + err.Error())
	}
}

// Stop kills the server (nothing to persist, so no graceful shutdown is
// needed). Start registers it in t.Cleanup; calling it twice is harmless.
func (s *Server) Stop() { s.Kill() }

func (s *Server) start() error {
	args := []string{s.bin,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--databases", "16",
	}
	if s.opts.Password != "" {
		args = append(args, "--requirepass", s.opts.Password)
		if s.opts.cluster {
			// Replicas authenticate to their master with it.
			args = append(args, "--masterauth", s.opts.Password)
		}
	}
	if s.opts.cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-port", strconv.Itoa(s.busPort),
			"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
			"--cluster-node-timeout", strconv.FormatInt(s.opts.clusterNodeTimeout.Milliseconds(), 10),
			// A replica takes over however long it was cut off.
			"--cluster-replica-validity-factor", "0")
	}
	if s.opts.User != "" {
		args = append(args, "--user", s.opts.User, "on", ">"+s.opts.UserPassword, "~*", "&*", "+@all")
	}
	if s.opts.TLS {
		args = append(args,
			"--tls-port", strconv.Itoa(s.tlsPort),
			"--tls-cert-file", s.certFile,
			"--tls-key-file", s.keyFile,
			"--tls-ca-cert-file", s.CAFile,
			"--tls-auth-clients", "no")
	}
	args = append(args, s.opts.Args...)

	devNull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer devNull.Close()
	// What redis-server says before it opens its log file (a bad argument,
	// say) goes to stdout: keep it for the failure message.
	out, err := os.OpenFile(filepath.Join(s.dir, "redis.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	proc, err := os.StartProcess(s.bin, args, &os.ProcAttr{
		Dir:   s.dir,
		Files: []*os.File{devNull, out, out},
	})
	if err != nil {
		return errors.New("starting " + s.bin + ": " + err.Error())
	}
	run := &process{os: proc, exited: make(chan struct{})}
	go run.wait()
	s.mu.Lock()
	s.proc = run
	s.mu.Unlock()

	if err := s.waitReady(run); err != nil {
		s.Kill()
		return errors.New(strings.Join(args, " ") + ": " + err.Error() +
			"\nlast " + strconv.Itoa(logLines) + " lines of its output:\n" + lastLines(s.output("redis.out"), logLines) +
			"\nlast " + strconv.Itoa(logLines) + " lines of redis.log:\n" + lastLines(s.output("redis.log"), logLines))
	}
	return nil
}

// process is one run of redis-server; Restart makes a new one.
type process struct {
	os     *os.Process
	exited chan struct{} // closed once the process has been waited for

	mu   sync.Mutex
	done bool // set just before exited is closed, for polling without select
}

func (p *process) wait() {
	_, _ = p.os.Wait()
	p.mu.Lock()
	p.done = true
	p.mu.Unlock()
	close(p.exited)
}

func (p *process) hasExited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// waitReady polls the plain port with PING until a reply arrives, the
// process exits, or startTimeout passes.
func (s *Server) waitReady(run *process) error {
	deadline := time.Now().Add(startTimeout)
	for {
		if run.hasExited() {
			return errors.New("redis-server exited during start-up")
		}
		if pingOnce(s.Addr()) {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("redis-server did not answer PING within " + startTimeout.String())
		}
		time.Sleep(5 * time.Millisecond) // polling interval, bounded by deadline
	}
}

// pingOnce reports whether addr answers a PING with any reply (+PONG, or
// -NOAUTH when a password is required).
func pingOnce(addr string) bool {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return false
	}
	return strings.HasPrefix(line, "+PONG") || strings.HasPrefix(line, "-NOAUTH")
}

// signal sends a signal through kill(1): os.Process.Signal needs a
// syscall.Signal for SIGSTOP, and Yaegi offers package syscall only with
// -syscall.
func (s *Server) signal(sig string) error {
	pid := s.Pid()
	if pid == 0 {
		return errors.New("server not running")
	}
	killBin := ""
	for _, candidate := range []string{"/usr/bin/kill", "/bin/kill"} {
		if info, err := os.Stat(candidate); err == nil && !info.IsDir() {
			killBin = candidate
			break
		}
	}
	if killBin == "" {
		return errors.New("kill(1) not found in /usr/bin or /bin")
	}
	proc, err := os.StartProcess(killBin, []string{"kill", sig, strconv.Itoa(pid)}, &os.ProcAttr{})
	if err != nil {
		return err
	}
	state, err := proc.Wait()
	if err != nil {
		return err
	}
	if !state.Success() {
		return errors.New("kill " + sig + " " + strconv.Itoa(pid) + ": " + state.String())
	}
	return nil
}

func (s *Server) logTail() string {
	text := s.output("redis.log")
	if len(text) > 2000 {
		text = text[len(text)-2000:]
	}
	return text
}

// output is the content of file name in the server's directory ("(none:
// why)" when it cannot be read).
func (s *Server) output(name string) string {
	data, err := os.ReadFile(filepath.Join(s.dir, name))
	if err != nil {
		return "(none: " + err.Error() + ")"
	}
	return string(data)
}

// short is testing.Short (a variable: the missing-binary policy's test
// runs under -short too).
var short = testing.Short

// binaryCandidates lists where Start looks for redis-server, in order (a
// variable: the missing-binary policy has a test).
var binaryCandidates = defaultCandidates

// defaultCandidates are $LLMHEDGE_REDIS_SERVER, /usr/bin/redis-server and
// redis-server in each PATH folder.
func defaultCandidates() []string {
	candidates := []string{}
	if env := os.Getenv("LLMHEDGE_REDIS_SERVER"); env != "" {
		candidates = append(candidates, env)
	}
	candidates = append(candidates, "/usr/bin/redis-server")
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if dir != "" {
			candidates = append(candidates, filepath.Join(dir, "redis-server"))
		}
	}
	return candidates
}

// firstExecutable is the first of candidates that is an executable file,
// "" when none is.
func firstExecutable(candidates []string) string {
	for _, c := range candidates {
		if info, err := os.Stat(c); err == nil && !info.IsDir() && info.Mode()&0o111 != 0 {
			return c
		}
	}
	return ""
}

// skipShort skips t under -short (`make unit` starts no process outside
// the test binary). Not testkit/proc's SkipShort: see freePort.
func skipShort(t testing.TB, what string) {
	t.Helper()
	if short() {
		t.Skip("-short: starts " + what)
	}
}

// freePort returns a loopback port that was free a moment ago. Not
// testkit/proc's PickPort: resp's tests import this package under Yaegi,
// and proc imports syscall, which Yaegi cannot load.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	return port, nil
}

// writeCertificates writes a self-signed server certificate for 127.0.0.1
// (internal/testkit/testcert) into the temp dir; it is its own CA.
func (s *Server) writeCertificates() {
	cert := testcert.Server(s.t)
	certFile, keyFile := cert.WriteFiles(s.t, s.dir)
	s.certFile = certFile
	s.keyFile = keyFile
	s.CAFile = certFile
	s.CAPool = cert.Pool(s.t)
}

// TLSConfig is a client configuration that trusts the test certificate
// (its name is 127.0.0.1, which a client takes from the address).
func (s *Server) TLSConfig() *tls.Config {
	return &tls.Config{RootCAs: s.CAPool, MinVersion: tls.VersionTLS12}
}
