package chaos

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Slack for counts that other parts of a process move on their own (a
// timer goroutine, a metrics scrape's connection winding down).
const (
	socketSlack    = 2
	goroutineSlack = 8
)

func newRunner(env *Env, target Target) *runner {
	return &runner{
		client: &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 2 * defaultConcurrency,
			DisableCompression:  true,
		}},
		url: strings.TrimRight(target.BaseURL, "/") + Path,
		reg: env.reg,
	}
}

// closeIdle closes the client's keep-alive connections (so the proxy's
// side of them may end) and, where the target can, the proxy's idle
// upstream connections.
func (rn *runner) closeIdle(target Target) {
	rn.client.CloseIdleConnections()
	if target.CloseIdle != nil {
		target.CloseIdle()
	}
}

// snapshot is what the suite counts of the proxy at one moment.
type snapshot struct {
	busy, idle int // upstream connections, seen by the upstreams
	sockets    int // TCP sockets of the proxy's process (not listening)
	goroutines int
}

func (s snapshot) String() string {
	return fmt.Sprintf("upstream connections %d busy, %d idle; proxy sockets %d; goroutines %d", s.busy, s.idle, s.sockets, s.goroutines)
}

// ownSockets leaves out the sockets of the upstream pool, which a
// keep-alive proxy rightly holds.
func (s snapshot) ownSockets(t Target) int {
	perConn := 1
	if t.InProcess {
		perConn = 2
	}
	return s.sockets - perConn*(s.idle+s.busy)
}

// ownGoroutines leaves out the upstream pool's goroutines: two per idle
// connection in a Go transport (read and write loops), one more for the
// upstream server's side when it runs in the same process.
func (s snapshot) ownGoroutines(t Target) int {
	perConn := 2
	if t.InProcess {
		perConn = 3
	}
	return s.goroutines - perConn*s.idle
}

// quiet polls until no upstream connection is busy (and, where the target
// closes them, none is idle), and returns the snapshot then.
func quiet(t T, env *Env, target Target) snapshot {
	t.Helper()
	deadline := time.Now().Add(settleDeadline)
	for {
		s := observe(t, env, target)
		if (s.busy == 0 && (target.CloseIdle == nil || s.idle == 0)) || time.Now().After(deadline) {
			return s
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func observe(t T, env *Env, target Target) snapshot {
	t.Helper()
	var s snapshot
	ab, ai := env.A.Conns()
	bb, bi := env.B.Conns()
	s.busy, s.idle = ab+bb, ai+bi
	if target.PID != 0 {
		n, err := tcpSockets(target.PID)
		if err != nil {
			t.Fatalf("counting the proxy's sockets: %v", err)
		}
		s.sockets = n
	}
	if target.Goroutines != nil {
		n, err := target.Goroutines()
		if err != nil {
			t.Fatalf("counting the proxy's goroutines: %v", err)
		}
		s.goroutines = n
	}
	return s
}

// settle polls until the proxy is back to base (no busy upstream
// connection, sockets and goroutines at most the baseline) or the deadline
// passes, and returns the last snapshot. The proxy is another process or
// runs its own goroutines: polling with a deadline is how to see it wind
// down.
func settle(t T, rn *runner, env *Env, target Target, base snapshot) snapshot {
	t.Helper()
	deadline := time.Now().Add(settleDeadline)
	for {
		// Connections that were busy a moment ago may since have gone back
		// to a pool.
		rn.closeIdle(target)
		s := observe(t, env, target)
		done := s.busy == 0 && (target.CloseIdle == nil || s.idle == 0) &&
			(target.PID == 0 || s.ownSockets(target) <= base.ownSockets(target)) &&
			(target.Goroutines == nil || s.ownGoroutines(target) <= base.ownGoroutines(target))
		if done || time.Now().After(deadline) {
			return s
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tcpSockets counts the TCP sockets process pid holds open, listening ones
// excluded, from /proc/<pid>/fd and /proc/net/tcp{,6}.
func tcpSockets(pid int) (int, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	n := 0
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			const stateListen = "0A"
			if len(fields) > 9 && fields[3] != stateListen && inodes[fields[9]] {
				n++
			}
		}
		f.Close()
	}
	return n, nil
}

// PprofGoroutines returns a goroutine counter reading the first line of a
// Go pprof endpoint's /debug/pprof/goroutine?debug=1 ("goroutine profile:
// total N") under baseURL, each time on a new connection so that none of
// its own stays open in the proxy between two counts.
func PprofGoroutines(baseURL string) func() (int, error) {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	return func() (int, error) {
		resp, err := client.Get(strings.TrimRight(baseURL, "/") + "/debug/pprof/goroutine?debug=1")
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		var n int
		if _, err := fmt.Sscanf(line, "goroutine profile: total %d", &n); err != nil || resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("status %d, first line %q", resp.StatusCode, line)
		}
		return n, nil
	}
}
