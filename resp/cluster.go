package resp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// Redis Cluster (redis+cluster://h1:p1,h2:p2/, rediss+cluster://).
//
// The client keeps a map from hash slot to the master that serves it, read
// with CLUSTER SLOTS (Redis 3+; CLUSTER SHARDS is 7.0+ only) from the URL's
// nodes or any node it has learnt of, and a node (two pools) per master.
// A command goes to the master of its first key's slot:
//
//   - MOVED <slot> <host:port>: the slot has a new owner. The client moves
//     the slot in its map at once, sends the command there, and reads the
//     whole map again in the background.
//   - ASK <slot> <host:port>: the slot is being migrated and this key is
//     already on the target: the command is sent there once, preceded by
//     ASKING on the same connection; the map is unchanged.
//   - A node that cannot be dialed (a master killed, not yet replaced):
//     nothing was sent, so the client reads the map again (one read at a
//     time, shared by every caller that waits for it, within each caller's
//     deadline) and sends the command to the slot's new master if there is
//     one; otherwise the dial error is returned. A failure after the
//     command was sent is returned (it may have run) and the map is read
//     again in the background.
//
// At most maxRedirects redirections or re-routes are followed per call.
// A slot the map does not know yet (before the first read) goes to a node
// of the URL and follows its MOVED.

// numSlots is the number of Redis Cluster hash slots.
const numSlots = 16384

// maxRedirects bounds the MOVED, ASK and re-routes one call follows.
const maxRedirects = 5

// ErrCrossSlot is wrapped by the error of a pipeline, on a Redis Cluster,
// whose commands have keys in more than one hash slot: a cluster runs a
// pipeline on one node, so the client refuses it before sending anything
// (the fleet pipelines only the keys of one hash tag).
var ErrCrossSlot = errors.New("resp: CROSSSLOT pipeline keys in different hash slots")

// crc16Table is CRC-16/XMODEM (polynomial 0x1021, initial value 0, no
// reflection), the checksum of Redis Cluster's key slots.
var crc16Table = makeCRC16Table()

func makeCRC16Table() []uint16 {
	table := make([]uint16, 256)
	for i := 0; i < 256; i++ {
		crc := uint16(i) << 8
		for bit := 0; bit < 8; bit++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		table[i] = crc
	}
	return table
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

// keySlot is key's hash slot: CRC16 of the key, or of its hash tag (what
// lies between the first "{" and the first "}" after it, when that is not
// empty), modulo 16384.
func keySlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	return int(crc16(key) % numSlots)
}

// commandKey is the key that routes cmd: its first key, or none for the
// commands without keys (PING, INFO, SCRIPT, EVAL with no keys, ...),
// which go to any node.
func commandKey(cmd []string) (string, bool) {
	if len(cmd) < 2 {
		return "", false
	}
	name := strings.ToUpper(cmd[0])
	keyAt := 1
	switch name {
	case "EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO":
		// script numkeys key...
		if len(cmd) < 4 {
			return "", false
		}
		n, err := strconv.Atoi(cmd[2])
		if err != nil || n <= 0 {
			return "", false
		}
		keyAt = 3
	case "XREAD", "XREADGROUP":
		for i := 1; i+1 < len(cmd); i++ {
			if strings.EqualFold(cmd[i], "STREAMS") {
				return cmd[i+1], true
			}
		}
		return "", false
	case "BLMPOP", "BZMPOP": // timeout numkeys key...
		keyAt = 3
	case "LMPOP", "ZMPOP", "SINTERCARD", "ZINTERCARD", "ZUNION", "ZINTER", "ZDIFF": // numkeys key...
		keyAt = 2
	case "OBJECT", "XINFO", "XGROUP", "MEMORY": // subcommand key
		keyAt = 2
	case "PING", "ECHO", "INFO", "TIME", "SCRIPT", "CONFIG", "CLUSTER", "CLIENT", "COMMAND",
		"DBSIZE", "FLUSHALL", "FLUSHDB", "ROLE", "LASTSAVE", "SLOWLOG", "LATENCY", "ACL",
		"FUNCTION", "MODULE", "DEBUG", "SAVE", "BGSAVE", "BGREWRITEAOF", "WAIT", "WAITAOF",
		"READONLY", "READWRITE", "ASKING", "AUTH", "SELECT", "HELLO", "PUBLISH", "RANDOMKEY",
		"KEYS", "SCAN", "MULTI", "EXEC", "DISCARD", "UNWATCH", "RESET", "QUIT", "LOLWUT", "SWAPDB":
		return "", false
	}
	if keyAt >= len(cmd) {
		return "", false
	}
	return cmd[keyAt], true
}

// commandsSlot is the one slot of cmds' keys (-1: no command has a key),
// or an error wrapping ErrCrossSlot.
func commandsSlot(cmds [][]string) (int, error) {
	slot := -1
	first := ""
	for _, cmd := range cmds {
		key, ok := commandKey(cmd)
		if !ok {
			continue
		}
		s := keySlot(key)
		if slot < 0 {
			slot = s
			first = cmd[0]
			continue
		}
		if s != slot {
			return -1, fmt.Errorf("%w: %s on slot %d, %s on slot %d (a Redis Cluster runs a pipeline on one node: give its keys one hash tag {...})", ErrCrossSlot, first, slot, cmd[0], s)
		}
	}
	return slot, nil
}

// parseRedirect reads a MOVED or ASK error reply: "MOVED 3999 host:port"
// (host empty: the node that replied).
func parseRedirect(msg string) (bool, int, string, bool) {
	var ask bool
	switch {
	case strings.HasPrefix(msg, "MOVED "):
	case strings.HasPrefix(msg, "ASK "):
		ask = true
	default:
		return false, 0, "", false
	}
	f := strings.Split(msg, " ")
	if len(f) != 3 {
		return false, 0, "", false
	}
	slot, err := strconv.Atoi(f[1])
	if err != nil || slot < 0 || slot >= numSlots {
		return false, 0, "", false
	}
	colon := strings.LastIndexByte(f[2], ':')
	if colon < 0 {
		return false, 0, "", false
	}
	return ask, slot, f[2], true
}

// resolveAddr makes a redirection's or CLUSTER SLOTS' host:port dialable:
// an empty host is the host of from, the node that sent it; an IPv6 host
// gets its brackets.
func resolveAddr(hostPort, from string) string {
	colon := strings.LastIndexByte(hostPort, ':')
	host := strings.TrimSuffix(strings.TrimPrefix(hostPort[:colon], "["), "]")
	port := hostPort[colon+1:]
	if host == "" {
		fromHost, _, err := net.SplitHostPort(from)
		if err == nil {
			host = fromHost
		}
	}
	return net.JoinHostPort(host, port)
}

// slotRange is one line of CLUSTER SLOTS: slots first..last served by the
// master at addr.
type slotRange struct {
	first, last int
	addr        string
}

// parseClusterSlots reads a CLUSTER SLOTS reply from the node at from:
// [[first, last, [host, port, id, ...], replicas...], ...]. A NULL or empty
// host means from's host; "?" (an unknown endpoint) leaves the range out.
func parseClusterSlots(v fleetstore.RedisValue, from string) ([]slotRange, error) {
	if v.Kind != fleetstore.RedisArray {
		return nil, errors.New("CLUSTER SLOTS reply is not an array")
	}
	var out []slotRange
	for _, e := range v.Array {
		if e.Kind != fleetstore.RedisArray || len(e.Array) < 3 {
			return nil, errors.New("CLUSTER SLOTS entry is not [first, last, master...]")
		}
		first := e.Array[0]
		last := e.Array[1]
		master := e.Array[2]
		if first.Kind != fleetstore.RedisInt || last.Kind != fleetstore.RedisInt || first.Int < 0 || last.Int >= numSlots || first.Int > last.Int {
			return nil, errors.New("CLUSTER SLOTS entry has no slot range")
		}
		if master.Kind != fleetstore.RedisArray || len(master.Array) < 2 || master.Array[1].Kind != fleetstore.RedisInt {
			return nil, errors.New("CLUSTER SLOTS entry has no master [host, port]")
		}
		host := master.Array[0].Str
		if host == "?" {
			continue
		}
		addr := resolveAddr(host+":"+strconv.FormatInt(master.Array[1].Int, 10), from)
		out = append(out, slotRange{first: int(first.Int), last: int(last.Int), addr: addr})
	}
	return out, nil
}

// clusterState is a cluster client's view of the cluster. Every field is
// guarded by mu.
type clusterState struct {
	mu      sync.Mutex
	seeds   []string         // the URL's nodes
	nodes   map[string]*node // every node met, by address
	slots   []*node          // by slot; nil: not known
	version uint64           // counts the maps installed
	// lastGood is the node that answered the last CLUSTER SLOTS: the
	// first one asked next time, and where keyless commands go.
	lastGood   string
	refreshing bool
	waiters    []*waiter // answered grant{slot: a map was installed}
	closed     bool
	moved      uint64 // MOVED replies followed
	asked      uint64 // ASK replies followed
	refreshes  uint64 // maps installed from CLUSTER SLOTS
}

func newClusterState(seeds []string) *clusterState {
	return &clusterState{seeds: seeds, nodes: make(map[string]*node), slots: make([]*node, numSlots), lastGood: seeds[0]}
}

// nodeLocked is the node at addr, made on first use (cl.mu held).
func nodeLocked(c *Client, cl *clusterState, addr string) *node {
	n, ok := cl.nodes[addr]
	if ok {
		return n
	}
	n = newNode(c, addr)
	if cl.closed {
		closeNode(n)
	}
	cl.nodes[addr] = n
	return n
}

func nodeAt(c *Client, cl *clusterState, addr string) *node {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	n := nodeLocked(c, cl, addr)
	return n
}

// route is the node for slot (-1: any node) and the map's version; a slot
// the map does not know goes to the last node that answered, and starts a
// read of the map.
func route(c *Client, slot int) (*node, uint64) {
	cl := c.cl
	cl.mu.Lock()
	var n *node
	if slot >= 0 {
		n = cl.slots[slot]
	}
	unknown := n == nil && slot >= 0 && cl.version == 0
	if n == nil {
		n = nodeLocked(c, cl, cl.lastGood)
	}
	version := cl.version
	cl.mu.Unlock()
	if unknown {
		refreshAsync(c)
	}
	return n, version
}

// moveSlot records a MOVED: slot is served by the master at addr.
func moveSlot(c *Client, slot int, addr string) *node {
	cl := c.cl
	cl.mu.Lock()
	defer cl.mu.Unlock()
	n := nodeLocked(c, cl, addr)
	cl.slots[slot] = n
	cl.moved++
	return n
}

func clusterNodes(cl *clusterState) []*node {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	out := make([]*node, 0, len(cl.nodes))
	for _, n := range cl.nodes {
		out = append(out, n)
	}
	return out
}

func closeCluster(cl *clusterState) {
	cl.mu.Lock()
	cl.closed = true
	nodes := make([]*node, 0, len(cl.nodes))
	for _, n := range cl.nodes {
		nodes = append(nodes, n)
	}
	cl.mu.Unlock()
	for _, n := range nodes {
		closeNode(n)
	}
}

// refreshAsync starts a read of the map unless one runs.
func refreshAsync(c *Client) {
	cl := c.cl
	cl.mu.Lock()
	start := !cl.refreshing && !cl.closed
	cl.refreshing = true
	cl.mu.Unlock()
	if start {
		go refreshSlots(c)
	}
}

// refreshAndWait makes sure the map is newer than seen: it waits for the
// read that runs, or starts one, until ctx ends. It reports whether a map
// newer than seen is installed.
func refreshAndWait(c *Client, ctx context.Context, seen uint64) bool {
	cl := c.cl
	cl.mu.Lock()
	if cl.version != seen {
		cl.mu.Unlock()
		return true
	}
	if cl.closed {
		cl.mu.Unlock()
		return false
	}
	w := &waiter{ch: make(chan grant, 1)}
	cl.waiters = append(cl.waiters, w)
	start := !cl.refreshing
	cl.refreshing = true
	cl.mu.Unlock()
	if start {
		go refreshSlots(c)
	}
	stop := context.AfterFunc(ctx, func() { answerRefreshWaiter(cl, w, false) })
	g := <-w.ch
	stop()
	if !g.slot {
		return false
	}
	cl.mu.Lock()
	newer := cl.version != seen
	cl.mu.Unlock()
	return newer
}

// answerRefreshWaiter answers w unless it has been answered.
func answerRefreshWaiter(cl *clusterState, w *waiter, ok bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if w.done {
		return
	}
	cl.waiters = removeWaiter(cl.waiters, w)
	w.done = true
	w.ch <- grant{slot: ok}
}

// refreshTimeout bounds the CLUSTER SLOTS of one node in a read of the map.
func refreshTimeout(c *Client) time.Duration {
	d := c.opts.DialTimeout
	if d <= 0 {
		d = DefaultDialTimeout
	}
	r := c.opts.ReadTimeout
	if r <= 0 {
		r = DefaultReadTimeout
	}
	return d + r
}

// refreshSlots reads the map from the first node that answers CLUSTER
// SLOTS (the last one that did first, then the URL's nodes, then every
// other node met) and installs it; then it answers the waiters. A node
// with cluster support disabled refuses the client: the URL names a
// single server.
func refreshSlots(c *Client) {
	cl := c.cl
	installed := false
	for _, addr := range refreshOrder(cl) {
		n := nodeAt(c, cl, addr)
		ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout(c))
		values, replyErrs, _, failure := roundTrip(c, ctx, n, [][]string{{"CLUSTER", "SLOTS"}}, false)
		cancel()
		if failure != nil {
			continue
		}
		if replyErr := firstError(replyErrs); replyErr != nil {
			if strings.Contains(replyErr.Error(), "cluster support disabled") {
				_ = refuse(c, errors.New("resp: "+addr+" is not a Redis Cluster node ("+replyErr.Error()+"), but the URL is redis+cluster://: use redis:// (or rediss://) for a single server"))
				break
			}
			continue
		}
		ranges, err := parseClusterSlots(values[0], addr)
		if err != nil || len(ranges) == 0 {
			continue
		}
		installSlots(c, ranges, addr)
		installed = true
		break
	}
	cl.mu.Lock()
	cl.refreshing = false
	waiters := cl.waiters
	cl.waiters = nil
	for _, w := range waiters {
		w.done = true
		w.ch <- grant{slot: installed}
	}
	cl.mu.Unlock()
}

// refreshOrder lists the nodes to ask for the map, each once.
func refreshOrder(cl *clusterState) []string {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	seen := make(map[string]bool)
	var out []string
	candidates := append([]string{cl.lastGood}, cl.seeds...)
	for addr := range cl.nodes {
		candidates = append(candidates, addr)
	}
	for _, addr := range candidates {
		if !seen[addr] {
			seen[addr] = true
			out = append(out, addr)
		}
	}
	return out
}

// installSlots replaces the map with ranges, read from the node at from.
func installSlots(c *Client, ranges []slotRange, from string) {
	cl := c.cl
	cl.mu.Lock()
	defer cl.mu.Unlock()
	slots := make([]*node, numSlots)
	for _, r := range ranges {
		n := nodeLocked(c, cl, r.addr)
		for s := r.first; s <= r.last; s++ {
			slots[s] = n
		}
	}
	cl.slots = slots
	cl.version++
	cl.refreshes++
	cl.lastGood = from
}

// clusterRun sends cmds to the master of their slot and follows MOVED and
// ASK (see the top of this file). Replies come back in cmds' order, with
// the first error reply as the error, as for one server.
func clusterRun(c *Client, ctx context.Context, cmds [][]string, blocking bool) ([]fleetstore.RedisValue, error) {
	slot, err := commandsSlot(cmds)
	if err != nil {
		return nil, err
	}
	values := make([]fleetstore.RedisValue, len(cmds))
	replyErrs := make([]error, len(cmds))
	pending := make([]int, len(cmds))
	for i := range pending {
		pending[i] = i
	}
	n, version := route(c, slot)
	asking := false
	for attempt := 0; ; attempt++ {
		batch := make([][]string, 0, 2*len(pending))
		for _, i := range pending {
			if asking {
				batch = append(batch, []string{"ASKING"})
			}
			batch = append(batch, cmds[i])
		}
		got, gotErrs, how, failure := roundTrip(c, ctx, n, batch, blocking)
		if failure != nil {
			if how == dialFailed && attempt < maxRedirects && slot >= 0 {
				if refreshAndWait(c, ctx, version) {
					next, nextVersion := route(c, slot)
					if next != n {
						// The slot has another master now: nothing was sent.
						n = next
						version = nextVersion
						asking = false
						continue
					}
				}
				return nil, failure
			}
			if how == ioFailed || how == dialFailed {
				refreshAsync(c)
			}
			return nil, failure
		}
		var redirected []int
		target := ""
		ask := false
		for j, i := range pending {
			k := j
			if asking {
				k = 2*j + 1
			}
			var e error
			if gotErrs != nil {
				e = gotErrs[k]
			}
			if e != nil {
				isAsk, movedSlot, addr, ok := parseRedirect(e.Error())
				if ok {
					redirected = append(redirected, i)
					target = resolveAddr(addr, n.addr)
					ask = isAsk
					if !isAsk {
						moveSlot(c, movedSlot, target)
					}
					continue
				}
				if strings.HasPrefix(e.Error(), "CLUSTERDOWN") {
					refreshAsync(c)
				}
			}
			values[i] = got[k]
			replyErrs[i] = e
		}
		if len(redirected) == 0 {
			break
		}
		if attempt >= maxRedirects {
			return nil, fmt.Errorf("resp: %s: more than %d MOVED/ASK redirections (last to %s): the cluster's slots keep moving", cmds[redirected[0]][0], maxRedirects, target)
		}
		if ask {
			countAsk(c.cl)
		} else {
			refreshAsync(c)
		}
		pending = redirected
		asking = ask
		n = nodeAt(c, c.cl, target)
	}
	return values, firstError(replyErrs)
}

func countAsk(cl *clusterState) {
	cl.mu.Lock()
	cl.asked++
	cl.mu.Unlock()
}

// clusterCounters reads the redirection counters.
func clusterCounters(cl *clusterState) (uint64, uint64, uint64) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	moved := cl.moved
	asked := cl.asked
	refreshes := cl.refreshes
	return moved, asked, refreshes
}
