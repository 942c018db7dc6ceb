package redisproc

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// clusterTimeout bounds how long StartCluster waits for cluster_state:ok on
// every node, and Failover for a replica's promotion.
const clusterTimeout = 60 * time.Second

// ClusterOptions configure a Redis Cluster. The zero value is 3 masters
// without replicas.
type ClusterOptions struct {
	// Masters is the number of masters (default 3, the fewest
	// redis-cli --cluster create accepts).
	Masters int
	// Replicas is the number of replicas per master (default 0).
	Replicas int
	// Password sets requirepass (and masterauth) on every node.
	Password string
	// NodeTimeout is cluster-node-timeout (default 1.5 s): a master is
	// failed over about twice that after it stops answering.
	NodeTimeout time.Duration
	// Args are further redis-server arguments for every node.
	Args []string
}

// Cluster is a Redis Cluster of Debian's redis-server processes started by
// the test, joined with redis-cli --cluster create. Each node is a Server
// (Kill, Pause, Resume, Restart): a restarted node keeps its identity
// (nodes.conf in its directory) and rejoins, a former master as a replica.
type Cluster struct {
	t    testing.TB
	opts ClusterOptions
	cli  string
	dir  string

	// Nodes are the nodes in start order: the first Masters were made
	// masters by --cluster create (Masters reports the current ones).
	Nodes []*Server
}

// StartCluster starts Masters×(1+Replicas) cluster nodes for t, joins them
// and returns once every node reports cluster_state:ok, knows every other
// node, and every replica's link to its master is up. t.Cleanup stops them.
func StartCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	skipShort(t, "a Redis Cluster (redis-server, redis-cli)")
	if opts.Masters == 0 {
		opts.Masters = 3
	}
	if opts.NodeTimeout == 0 {
		opts.NodeTimeout = 1500 * time.Millisecond
	}
	bin := firstExecutable(binaryCandidates())
	cli := ""
	if bin != "" {
		cli = firstExecutable(cliCandidates(bin))
	}
	if cli == "" {
		if os.Getenv("LLMHEDGE_REDIS") == "skip" {
			t.Skip("redis-server or redis-cli not found (LLMHEDGE_REDIS=skip); install them with: " + InstallHint)
		}
		t.Fatal("redis-server or redis-cli not found in /usr/bin or PATH: the cluster tests need both; install them with: " + InstallHint)
	}
	c := &Cluster{t: t, opts: opts, cli: cli, dir: t.TempDir()}
	n := opts.Masters * (1 + opts.Replicas)
	for i := 0; i < n; i++ {
		c.Nodes = append(c.Nodes, Start(t, Options{
			Password:           opts.Password,
			Args:               opts.Args,
			cluster:            true,
			clusterNodeTimeout: opts.NodeTimeout,
		}))
	}
	c.create()
	if err := c.waitHealthy(time.Now().Add(clusterTimeout), c.Nodes); err != nil {
		t.Fatal("redisproc: cluster not ready: " + err.Error() + "\n" + c.logTails())
	}
	return c
}

// create runs redis-cli --cluster create over every node.
func (c *Cluster) create() {
	c.t.Helper()
	args := []string{c.cli, "--cluster", "create"}
	for _, s := range c.Nodes {
		args = append(args, s.Addr())
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(c.opts.Replicas), "--cluster-yes")
	outPath := filepath.Join(c.dir, "cluster-create.out")
	out, err := os.Create(outPath)
	if err != nil {
		c.t.Fatal("redisproc: " + err.Error())
	}
	defer out.Close()
	env := os.Environ()
	if c.opts.Password != "" {
		// Not -a: the password stays off the command line.
		env = append(env, "REDISCLI_AUTH="+c.opts.Password)
	}
	proc, err := os.StartProcess(c.cli, args, &os.ProcAttr{Dir: c.dir, Env: env, Files: []*os.File{nil, out, out}})
	if err != nil {
		c.t.Fatal("redisproc: starting redis-cli: " + err.Error())
	}
	state, err := proc.Wait()
	if err != nil || !state.Success() {
		text, _ := os.ReadFile(outPath)
		status := "?"
		if state != nil {
			status = state.String()
		}
		c.t.Fatal("redisproc: redis-cli --cluster create failed (" + status + "): " + lastLines(string(text), 20))
	}
}

// Addrs are every node's address, in start order.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		out[i] = s.Addr()
	}
	return out
}

// URL is redis+cluster://[:password@]host1:port1,host2:port2,.../ over
// every node, the form fleetredis takes for a cluster-aware client.
func (c *Cluster) URL() string {
	userinfo := ""
	if c.opts.Password != "" {
		userinfo = ":" + c.opts.Password + "@"
	}
	return "redis+cluster://" + userinfo + strings.Join(c.Addrs(), ",") + "/"
}

// Node is the node listening on addr (nil when none is).
func (c *Cluster) Node(addr string) *Server {
	for _, s := range c.Nodes {
		if s.Addr() == addr {
			return s
		}
	}
	return nil
}

// Do sends one command to the node at addr (with the cluster's password)
// and returns its reply as text: a bulk or simple string, an integer in
// decimal, an array's elements one per line. An error reply is an error.
func (c *Cluster) Do(addr string, args ...string) (string, error) {
	return clusterCommand(addr, c.opts.Password, args...)
}

// ClusterNode is one line of CLUSTER NODES.
type ClusterNode struct {
	ID       string
	Addr     string // host:port, without the bus port
	Master   bool
	Failed   bool   // fail or pfail flagged
	MasterID string // a replica's master ("" for a master)
	Slots    [][2]int
}

// Topology is CLUSTER NODES as the node at addr sees it.
func (c *Cluster) Topology(addr string) ([]ClusterNode, error) {
	text, err := c.Do(addr, "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	return parseClusterNodes(text), nil
}

func parseClusterNodes(text string) []ClusterNode {
	var out []ClusterNode
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		n := ClusterNode{ID: f[0], Addr: f[1]}
		if i := strings.IndexByte(n.Addr, '@'); i >= 0 {
			n.Addr = n.Addr[:i]
		}
		for _, flag := range strings.Split(f[2], ",") {
			switch flag {
			case "master":
				n.Master = true
			case "fail", "fail?":
				n.Failed = true
			}
		}
		if f[3] != "-" {
			n.MasterID = f[3]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // a slot being migrated
				continue
			}
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil {
				n.Slots = append(n.Slots, [2]int{a, b})
			}
		}
		out = append(out, n)
	}
	return out
}

// Masters are the nodes that are masters with slots now, as a running node
// sees it.
func (c *Cluster) Masters() []*Server {
	c.t.Helper()
	nodes := c.topology()
	var out []*Server
	for _, n := range nodes {
		if n.Master && !n.Failed && len(n.Slots) > 0 {
			if s := c.Node(n.Addr); s != nil {
				out = append(out, s)
			}
		}
	}
	return out
}

// Slot is key's hash slot (CLUSTER KEYSLOT).
func (c *Cluster) Slot(key string) int {
	c.t.Helper()
	text, err := c.Do(c.anyRunning().Addr(), "CLUSTER", "KEYSLOT", key)
	if err != nil {
		c.t.Fatal("redisproc: CLUSTER KEYSLOT: " + err.Error())
	}
	n, err := strconv.Atoi(text)
	if err != nil {
		c.t.Fatal("redisproc: CLUSTER KEYSLOT reply " + strconv.Quote(text))
	}
	return n
}

// MasterFor is the master that serves key's slot now.
func (c *Cluster) MasterFor(key string) *Server {
	c.t.Helper()
	slot := c.Slot(key)
	for _, n := range c.topology() {
		if !n.Master || n.Failed {
			continue
		}
		for _, r := range n.Slots {
			if slot >= r[0] && slot <= r[1] {
				if s := c.Node(n.Addr); s != nil {
					return s
				}
			}
		}
	}
	c.t.Fatal("redisproc: no master serves slot " + strconv.Itoa(slot))
	return nil
}

// Failover kills master (SIGKILL) and waits until one of its replicas is a
// master with its slots and every running node reports cluster_state:ok.
// It returns the promoted replica. The killed node stays down until its
// Restart (it then rejoins as a replica of the promoted one).
func (c *Cluster) Failover(master *Server) *Server {
	c.t.Helper()
	var id string
	var replicas []string
	for _, n := range c.topology() {
		if n.Addr == master.Addr() {
			if !n.Master {
				c.t.Fatal("redisproc: Failover: " + master.Addr() + " is not a master")
			}
			id = n.ID
		}
	}
	for _, n := range c.topology() {
		if id != "" && n.MasterID == id {
			replicas = append(replicas, n.Addr)
		}
	}
	if len(replicas) == 0 {
		c.t.Fatal("redisproc: Failover: " + master.Addr() + " has no replica")
	}
	master.Kill()
	deadline := time.Now().Add(clusterTimeout)
	var promoted *Server
	for promoted == nil {
		for _, n := range c.topologyOrNil() {
			if n.Master && !n.Failed && len(n.Slots) > 0 && contains(replicas, n.Addr) {
				promoted = c.Node(n.Addr)
			}
		}
		if promoted != nil {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatal("redisproc: Failover: no replica of " + master.Addr() + " promoted within " + clusterTimeout.String() + "\n" + c.logTails())
		}
		time.Sleep(20 * time.Millisecond) // polling interval, bounded by deadline
	}
	if err := c.waitHealthy(deadline, c.running()); err != nil {
		c.t.Fatal("redisproc: Failover: cluster not ok after the promotion of " + promoted.Addr() + ": " + err.Error() + "\n" + c.logTails())
	}
	return promoted
}

// WaitHealthy waits until every running node reports cluster_state:ok and
// knows its peers, and every running replica's master link is up (after a
// Restart, say).
func (c *Cluster) WaitHealthy() {
	c.t.Helper()
	if err := c.waitHealthy(time.Now().Add(clusterTimeout), c.running()); err != nil {
		c.t.Fatal("redisproc: cluster not healthy: " + err.Error() + "\n" + c.logTails())
	}
}

// waitHealthy polls nodes until each one says cluster_state:ok, counts
// every node of the cluster as known, sees no node it considers failed
// among the running ones, and (for a replica) has its master link up.
func (c *Cluster) waitHealthy(deadline time.Time, nodes []*Server) error {
	for {
		err := c.healthy(nodes)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond) // polling interval, bounded by deadline
	}
}

func (c *Cluster) healthy(nodes []*Server) error {
	running := map[string]bool{}
	for _, s := range nodes {
		running[s.Addr()] = true
	}
	for _, s := range nodes {
		info, err := c.Do(s.Addr(), "CLUSTER", "INFO")
		if err != nil {
			return errors.New(s.Addr() + ": CLUSTER INFO: " + err.Error())
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return errors.New(s.Addr() + ": not cluster_state:ok")
		}
		if !strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(c.Nodes))+"\r") &&
			!strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(c.Nodes))+"\n") {
			return errors.New(s.Addr() + ": does not know all " + strconv.Itoa(len(c.Nodes)) + " nodes yet")
		}
		topo, err := c.Topology(s.Addr())
		if err != nil {
			return errors.New(s.Addr() + ": CLUSTER NODES: " + err.Error())
		}
		for _, n := range topo {
			if running[n.Addr] && n.Failed {
				return errors.New(s.Addr() + " still flags running node " + n.Addr + " as failed")
			}
		}
		repl, err := c.Do(s.Addr(), "INFO", "replication")
		if err != nil {
			return errors.New(s.Addr() + ": INFO replication: " + err.Error())
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return errors.New(s.Addr() + ": replica whose master link is not up")
		}
	}
	return nil
}

// topology is CLUSTER NODES from the first running node that answers.
func (c *Cluster) topology() []ClusterNode {
	c.t.Helper()
	nodes := c.topologyOrNil()
	if nodes == nil {
		c.t.Fatal("redisproc: no running cluster node answers CLUSTER NODES\n" + c.logTails())
	}
	return nodes
}

func (c *Cluster) topologyOrNil() []ClusterNode {
	for _, s := range c.running() {
		if nodes, err := c.Topology(s.Addr()); err == nil {
			return nodes
		}
	}
	return nil
}

// running are the nodes whose process runs (paused ones included).
func (c *Cluster) running() []*Server {
	var out []*Server
	for _, s := range c.Nodes {
		if s.Pid() != 0 {
			out = append(out, s)
		}
	}
	return out
}

func (c *Cluster) anyRunning() *Server {
	c.t.Helper()
	r := c.running()
	if len(r) == 0 {
		c.t.Fatal("redisproc: no cluster node runs")
	}
	return r[0]
}

// logTails are the last lines of every node's log, for failure messages.
func (c *Cluster) logTails() string {
	var b strings.Builder
	for _, s := range c.Nodes {
		b.WriteString("--- " + s.Addr() + " redis.log:\n")
		b.WriteString(lastLines(s.logTail(), 8))
		b.WriteString("\n")
	}
	return b.String()
}

func lastLines(text string, n int) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// cliCandidates lists where StartCluster looks for redis-cli: next to
// redis-server first, then /usr/bin and PATH.
func cliCandidates(serverBin string) []string {
	candidates := []string{filepath.Join(filepath.Dir(serverBin), "redis-cli"), "/usr/bin/redis-cli"}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if dir != "" {
			candidates = append(candidates, filepath.Join(dir, "redis-cli"))
		}
	}
	return candidates
}

// clusterCommand sends one RESP command on a fresh connection (AUTH first
// with a password) and returns the reply as text (see Cluster.Do).
func clusterCommand(addr, password string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	r := bufio.NewReader(conn)
	if password != "" {
		if _, err := conn.Write(encodeCommand([]string{"AUTH", password})); err != nil {
			return "", err
		}
		if _, err := readReply(r); err != nil {
			return "", errors.New("AUTH: " + err.Error())
		}
	}
	if _, err := conn.Write(encodeCommand(args)); err != nil {
		return "", err
	}
	return readReply(r)
}

func encodeCommand(args []string) []byte {
	var b strings.Builder
	b.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b.WriteString("$" + strconv.Itoa(len(a)) + "\r\n" + a + "\r\n")
	}
	return []byte(b.String())
}

// readReply reads one RESP2 reply as text; an error reply is an error.
func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply line")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		parts := []string{}
		for i := 0; i < n; i++ {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", errors.New("unexpected reply " + strconv.Quote(line))
}
