package fleetsuite

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
	"github.com/llmhedge/llmhedge/resp"
)

// The fault suite (issue 25's acceptance): keyed streaming requests from
// several clients (each key by 2-3 clients through different replicas at
// once, some also through a second route with the same caller, key and
// body) while Redis loses its data (FLUSHALL, restarted empty), evicts
// (maxmemory with allkeys-lru), a replica is paused (SIGSTOP) past its
// lease, and a follower storm runs. Every answer is judged from the
// client's side: a complete answer (200, [DONE], no transport error) must
// be exactly one generation's whole text; a key must not get two complete
// answers of different generations on one route; no answer carries a
// generation of the other route; everything else must be an error or a
// visibly broken stream.

// The fault suite's routes, by the path the replicas serve them under:
// the same upstream, caller, key and body on each. FaultRoute2 is a second
// route (another name); FaultDeployment2 is a second deployment sharing
// the Redis and its default prefix: a route with FaultRoute's name whose
// upstream is the same server under another address (localhost).
const (
	FaultRoute       = "faults"
	FaultRoute2      = "faults-b"
	FaultDeployment2 = "faults-d2"
)

// FaultRouteSpec is one route of the fault suite: served under Path, with
// the route name Name, to UpstreamURL alone (one attempt, no hedge).
type FaultRouteSpec struct {
	Path, Name, UpstreamURL string
}

// FaultSpec is what an adapter's replicas serve in the fault suite: the
// Routes, each in fleet mode on RedisURL with these options.
type FaultSpec struct {
	RedisURL                      string
	Routes                        []FaultRouteSpec
	Lease, Timeout, RetryInterval string
}

// FaultStart starts the adapter's replicas for spec (stopped at the end
// of the test) and returns their Rig: Replicas, BaseURL and, where the
// replicas can be paused alone, Pause and Resume; Metric where the
// replicas export metrics.
type FaultStart func(t *testing.T, spec FaultSpec) Rig

// Signals are a Rig's Pause and Resume: SIGSTOP and SIGCONT to replica
// i's process (proc(i)).
func Signals(t *testing.T, proc func(i int) *os.Process) (pause, resume func(int)) {
	signal := func(sig syscall.Signal) func(int) {
		return func(i int) {
			if err := proc(i).Signal(sig); err != nil {
				t.Errorf("replica %d: %v: %v", i, sig, err)
			}
		}
	}
	return signal(syscall.SIGSTOP), signal(syscall.SIGCONT)
}

// FaultWorkload is the fault suite's upstream: 16 tokens after 40ms, 8ms
// apart; the generation of a slow-* key that a pause holds (the paused
// leader before its commit) starts once the pause landed.
func FaultWorkload() llmsim.Workload {
	return llmsim.Workload{MedianTTFT: 40 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 16, TokenGap: 8 * time.Millisecond, PingEvery: 10 * time.Millisecond}
}

// faultAnswer is what one client got.
type faultAnswer struct {
	route, key string
	replica    int
	status     int // 0: no response
	retryAfter string
	replayed   bool // Idempotent-Replayed: true
	done       bool // the body carried data: [DONE]
	text       string
	err        error
	end        time.Time
}

// complete: 200, [DONE] and no error.
func (a faultAnswer) complete() bool { return a.status == http.StatusOK && a.done && a.err == nil }

func (a faultAnswer) String() string {
	return fmt.Sprintf("%s %s via replica %d: status %d, [DONE] %v, err %v, %d bytes %q", a.route, a.key, a.replica, a.status, a.done, a.err, len(a.text), shorten(a.text))
}

func shorten(s string) string {
	if len(s) <= 120 {
		return s
	}
	return s[:60] + "..." + s[len(s)-60:]
}

// target is one client of a key: its replica and route.
type target struct {
	replica int
	route   string
}

// window is a time Redis was away (killed until joins worked again on
// every replica): keyed requests then run on their replica's own state, as
// the README documents, so a generation started in it may stand beside
// another.
type window struct{ from, to time.Time }

// faultRun is one run of the suite.
type faultRun struct {
	t      *testing.T
	rig    Rig
	up     *GenUpstream
	redis  *redisproc.Server  // nil on a cluster
	cl     *redisproc.Cluster // nil on a single node
	client *http.Client
	held   *llmsim.Holder // slow-* generations held (see newFaultRun)

	mu      sync.Mutex
	answers []faultAnswer
	away    []window
	faults  map[string]int
	notes   []string

	// hold: the load's workers send while they hold it for reading; a
	// fault that needs the replicas quiet takes it.
	hold sync.RWMutex

	progress   atomic.Int64  // keys whose clients all returned
	progressed chan struct{} // closed and replaced on progress
	progressMu sync.Mutex
}

// RunFaults runs the fault suite through the replicas start starts, named
// proxy in the ACCEPTANCE line: Count(300, 5000) keyed requests at least,
// every fault at least once (the full form cycles through them until the
// requests are sent).
func RunFaults(t *testing.T, proxy string, start FaultStart) {
	runFaults(t, proxy, newFaultRun(t, start, false))
}

// RunClusterFaults is RunFaults on a real Redis Cluster (3 masters, one
// replica each, the replicas on its redis+cluster:// URL): a master's
// failover (killed; its replica takes over with what it had replicated;
// the killed node comes back as a replica), FLUSHALL on every master, a
// follower storm and, where the rig can, a leader paused past its lease.
// The same judge: the slots of the failed master are away from its kill
// until joins work again on every replica.
func RunClusterFaults(t *testing.T, proxy string, start FaultStart) {
	runFaults(t, proxy+" cluster", newFaultRun(t, start, true))
}

// runFaults is RunFaults on s.
func runFaults(t *testing.T, proxy string, s *faultRun) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(Count(240, 1800))*time.Second)
	defer cancel()
	target := Count(300, 5000)
	stop := make(chan struct{})
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < Count(2, 8); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				i := int(next.Add(1))
				s.hold.RLock()
				s.sendLoadKey(ctx, i)
				s.hold.RUnlock()
			}
		}()
	}
	// The faults, each after some load since the previous one; the full
	// form cycles until the requests are sent.
	for cycle := 0; ; cycle++ {
		for _, f := range s.faultList() {
			s.waitProgress(ctx, 8)
			before := s.operationErrors()
			f.run(ctx, cycle)
			s.faults[f.name]++
			t.Logf("fault %s (cycle %d) injected; fleet operation errors %s -> %s; %d keyed requests so far", f.name, cycle, before, s.operationErrors(), s.requests())
		}
		if s.requests() >= target || ctx.Err() != nil {
			break
		}
	}
	for s.requests() < target && ctx.Err() == nil {
		s.waitProgress(ctx, 1)
	}
	close(stop)
	wg.Wait()
	s.judge(proxy)
}

// RunClaimTimedOut runs n times, with no other load: Redis paused
// (SIGSTOP) while replica 0 claims a long-* key, until that claim timed
// out and replica 0 runs its race; then Redis resumes and runs the claim
// it had queued, so the key's lease names replica 0's request. That
// request leads all the same and renews the lease once Redis answers, so
// the key through the other replicas follows it: one generation. (Before,
// the lease went unrenewed, and they raced a second generation beside the
// first once it ran out: the judge fails on two overlapping whole
// generations.) It still fails now and then: the pause also opens the
// breakers of the other replicas (their syncs failed), and a replica whose
// fleet is still down right after the resume answers the key from local
// state, a second generation the README allows while Redis is away. The
// judge cannot tell that from a defect yet, so the scenario runs only with
// LLMHEDGE_FLEET_CLAIM=1 (core/coretest's TestFleetTimedOutClaimStillLeads
// covers the engine's part deterministically).
func RunClaimTimedOut(t *testing.T, proxy string, start FaultStart, n int) {
	if os.Getenv("LLMHEDGE_FLEET_CLAIM") != "1" {
		t.Skip("opt-in (LLMHEDGE_FLEET_CLAIM=1): see fleetsuite.RunClaimTimedOut's comment")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	s := newFaultRun(t, start, false)
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("long-claim-%d", i)
		paused := time.Now()
		s.redis.Pause()
		leader := make(chan faultAnswer, 1)
		go func() { leader <- s.send(ctx, target{0, FaultRoute}, key, nil) }()
		err := s.up.WaitFor(ctx, func() bool { return s.up.Attempts(key) == 1 })
		raced := time.Since(paused)
		s.redis.Resume()
		resumed := time.Now()
		if err != nil {
			t.Fatalf("%s: replica 0's own race never reached the upstream while Redis was paused: %v", key, err)
		}
		var others []target
		for r := 1; r < s.rig.Replicas; r++ {
			others = append(others, target{r, FaultRoute})
		}
		if len(others) < 2 {
			others = append(others, others[0])
		}
		got := s.sendKey(ctx, key, others)
		first := <-leader
		s.record(first)
		t.Logf("%s: replica 0's claim waited on the paused Redis, its race began %v after the pause; then the others: %d generations, the second began %v after Redis resumed; replica 0's client: status %d, [DONE] %v, err %v; the others: %v",
			key, raced.Round(time.Millisecond), s.up.Attempts(key), s.up.Started(key, 2).Sub(resumed).Round(time.Millisecond), first.status, first.done, first.err, got)
	}
	s.judge(proxy)
}

// newFaultRun starts the suite's upstream and Redis (a Cluster of 3
// masters with a replica each when cluster) and the adapter's replicas
// for t.
func newFaultRun(t *testing.T, start FaultStart, cluster bool) *faultRun {
	// long-* keys: 250 tokens 10ms apart, so a leader still streams after
	// Redis came back, or after a lease ran out.
	long := llmsim.Workload{MedianTTFT: 40 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 250, TokenGap: 10 * time.Millisecond, PingEvery: 10 * time.Millisecond}
	up := StartGenUpstream(t, FaultWorkload(), long)
	// slow-* keys: the generation the test holds (pause before commit)
	// waits before its status line until the test has paused its leader.
	held := &llmsim.Holder{}
	up.sim.Behave = func(r *http.Request) llmsim.Behavior {
		if strings.HasPrefix(r.Header.Get(llmsim.HeaderIdempotencyKey), "slow-") {
			held.Behave(r)
		}
		return llmsim.Behavior{}
	}
	s := &faultRun{t: t, up: up, held: held, faults: map[string]int{}, progressed: make(chan struct{})}
	url := ""
	if cluster {
		s.cl = redisproc.StartCluster(t, redisproc.ClusterOptions{Masters: 3, Replicas: 1})
		url = s.cl.URL()
	} else {
		s.redis = redisproc.Start(t, redisproc.Options{})
		url = s.redis.URL()
	}
	s.rig = start(t, FaultSpec{RedisURL: url, Routes: []FaultRouteSpec{
		{FaultRoute, FaultRoute, up.URL}, {FaultRoute2, FaultRoute2, up.URL},
		{FaultDeployment2, FaultRoute, strings.Replace(up.URL, "127.0.0.1", "localhost", 1)}},
		Lease: "2s", Timeout: "500ms", RetryInterval: "200ms"})
	tr := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	s.client = &http.Client{Transport: tr}
	return s
}

// sendLoadKey sends load key i: at once from 2 or 3 clients on FaultRoute
// through different replicas and, on every third key, one more on
// FaultRoute2 and one on FaultDeployment2 with the same caller, key and
// body; then, once they all returned, on the next third of the keys one
// more request on FaultRoute2 and FaultDeployment2 each (another route's
// answer is stored: it must not be replayed) and on the last third one
// more on FaultRoute (a replay).
func (s *faultRun) sendLoadKey(ctx context.Context, i int) {
	n := s.rig.Replicas
	key := "k" + strconv.Itoa(i)
	var at []target
	for j := 0; j < 2+i%2; j++ {
		at = append(at, target{(i + j) % n, FaultRoute})
	}
	if i%3 == 0 {
		at = append(at, target{(i + 1) % n, FaultRoute2}, target{(i + 2) % n, FaultDeployment2})
	}
	s.sendKey(ctx, key, at)
	switch i % 3 {
	case 1:
		s.sendKey(ctx, key, []target{{(i + 2) % n, FaultRoute2}, {(i + 1) % n, FaultDeployment2}})
	case 2:
		s.sendKey(ctx, key, []target{{(i + 2) % n, FaultRoute}})
	}
}

// sendKey sends key from every target at once (one gate) and records the
// answers.
func (s *faultRun) sendKey(ctx context.Context, key string, targets []target) []faultAnswer {
	got := make([]faultAnswer, len(targets))
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for j, tg := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			got[j] = s.send(ctx, tg, key, nil)
		}()
	}
	close(gate)
	wg.Wait()
	s.record(got...)
	return got
}

// record keeps answers and counts the key as progress.
func (s *faultRun) record(answers ...faultAnswer) {
	s.mu.Lock()
	s.answers = append(s.answers, answers...)
	s.mu.Unlock()
	s.progress.Add(1)
	s.progressMu.Lock()
	close(s.progressed)
	s.progressed = make(chan struct{})
	s.progressMu.Unlock()
}

// requests is how many keyed requests have returned.
func (s *faultRun) requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.answers)
}

// waitProgress waits until n more keys have returned (or ctx ends).
func (s *faultRun) waitProgress(ctx context.Context, n int64) {
	goal := s.progress.Load() + n
	for {
		s.progressMu.Lock()
		ch := s.progressed
		s.progressMu.Unlock()
		if s.progress.Load() >= goal {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// send streams one keyed chat completion through tg with the SDK (retries
// off) and watches the raw body for [DONE]; firstChunk, when set, runs on
// the first chunk.
func (s *faultRun) send(ctx context.Context, tg target, key string, firstChunk func()) faultAnswer {
	a := faultAnswer{route: tg.route, key: key, replica: tg.replica}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	client := openai.NewClient(option.WithBaseURL(s.rig.BaseURL(tg.replica, tg.route)), option.WithAPIKey("sk-faults"),
		option.WithMaxRetries(0), option.WithHTTPClient(s.client),
		option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			res, err := next(req)
			if res != nil {
				a.status = res.StatusCode
				a.retryAfter = res.Header.Get("Retry-After")
				a.replayed = res.Header.Get("Idempotent-Replayed") == "true"
				res.Body = &doneWatch{ReadCloser: res.Body, done: &a.done}
			}
			return res, err
		}))
	a.text, a.err = StreamChat(ctx, client, key, "hello", firstChunk, nil)
	a.end = time.Now()
	return a
}

// doneWatch notes whether a body carried the stream's end marker.
type doneWatch struct {
	io.ReadCloser
	tail []byte
	done *bool
}

func (d *doneWatch) Read(p []byte) (int, error) {
	n, err := d.ReadCloser.Read(p)
	if n > 0 && !*d.done {
		buf := append(append([]byte(nil), d.tail...), p[:n]...)
		if bytes.Contains(buf, []byte("data: [DONE]")) {
			*d.done = true
		}
		if len(buf) > 16 {
			buf = buf[len(buf)-16:]
		}
		d.tail = buf
	}
	return n, err
}

// fault is one injected fault.
type fault struct {
	name string
	run  func(ctx context.Context, cycle int)
}

// faultList is the faults in the order each cycle injects them (the pause
// only where the rig can pause a replica alone).
func (s *faultRun) faultList() []fault {
	list := []fault{
		{"flushall", s.flushAll},
		{"evict", s.evict},
		{"restart-empty", s.restartEmpty},
		{"storm", s.storm},
	}
	if s.cl != nil {
		list = []fault{{"failover", s.failover}, {"flushall", s.flushAll}, {"storm", s.storm}}
	}
	if s.rig.Replicas >= 3 && s.cl == nil {
		list = append(list, fault{"restart-mid-flight", s.restartMidFlight})
	}
	if s.rig.Pause != nil {
		list = append(list, fault{"pause-before-commit", func(ctx context.Context, cycle int) { s.pause(ctx, cycle, true) }},
			fault{"pause-after-commit", func(ctx context.Context, cycle int) { s.pause(ctx, cycle, false) }})
	}
	return list
}

// redisClient is a fresh client of the suite's Redis (one per fault: the
// server may have been restarted since the last).
func (s *faultRun) redisClient() *resp.Client {
	c, err := resp.New(resp.Options{URL: s.redis.URL()})
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// keyNodes are the nodes that hold keys now: the Redis, or each master of
// the Cluster.
func (s *faultRun) keyNodes() []*redisproc.Server {
	if s.cl == nil {
		return []*redisproc.Server{s.redis}
	}
	return s.cl.Masters()
}

// nodeDo runs one command on node; a failure fails the test.
func (s *faultRun) nodeDo(node *redisproc.Server, args ...string) string {
	v, err := node.Do(args...)
	if err != nil {
		s.t.Errorf("redis %s at %s: %v", strings.Join(args, " "), node.Addr(), err)
	}
	return v
}

// do runs one command; a failure fails the test.
func (s *faultRun) do(c *resp.Client, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := c.Do(ctx, args...)
	if err != nil {
		s.t.Errorf("redis %s: %v", strings.Join(args, " "), err)
	}
	if v.Str != "" {
		return v.Str
	}
	return strconv.FormatInt(v.Int, 10)
}

// info is a numeric field of INFO section.
func (s *faultRun) info(c *resp.Client, section, field string) int64 {
	for _, line := range strings.Split(s.do(c, "INFO", section), "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// until re-checks cond as Redis changes (another process: no event to
// wait on) every few milliseconds until it holds; false after 15s.
func until(ctx context.Context, cond func() bool) bool {
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// flushAll runs FLUSHALL once the fleet has keys (flights in progress or
// stored answers).
func (s *faultRun) flushAll(ctx context.Context, cycle int) {
	nodes := s.keyNodes()
	size := 0
	if !until(ctx, func() bool {
		size = 0
		for _, node := range nodes {
			n, _ := strconv.Atoi(s.nodeDo(node, "DBSIZE"))
			size += n
		}
		return size > 0
	}) {
		s.t.Errorf("flushall: Redis never held a key to flush")
	}
	for _, node := range nodes {
		s.nodeDo(node, "FLUSHALL")
	}
	s.note("flushall %d: %d keys flushed on %d nodes", cycle, size, len(nodes))
}

// failover kills a master of the Cluster (the next one each cycle) while
// the load runs, waits until its replica took over its slots, starts the
// killed node again (it rejoins as the new master's replica), then waits
// until joins work again between every two neighbouring replicas: the
// time from the kill is a window Redis was away. What the killed master
// had not yet replicated is lost: streams with a gap, leases gone.
func (s *faultRun) failover(ctx context.Context, cycle int) {
	masters := s.cl.Masters()
	m := masters[cycle%len(masters)]
	from := time.Now()
	promoted := s.cl.Failover(m)
	m.Restart()
	s.cl.WaitHealthy()
	back := time.Now()
	s.rejoin(ctx, fmt.Sprintf("failover %d", cycle), from, back)
	s.note("failover %d: master %s killed, %s promoted; cluster healthy again %v after the kill, joins on every replica %v after that",
		cycle, m.Addr(), promoted.Addr(), back.Sub(from).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
}

// evict lets Redis evict (allkeys-lru, maxmemory at what it uses) until
// it has evicted keys, then turns eviction off again.
func (s *faultRun) evict(ctx context.Context, cycle int) {
	c := s.redisClient()
	defer c.Close()
	before := s.info(c, "stats", "evicted_keys")
	used := s.info(c, "memory", "used_memory")
	s.do(c, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	s.do(c, "CONFIG", "SET", "maxmemory", strconv.FormatInt(used, 10))
	var evicted int64
	ok := until(ctx, func() bool { evicted = s.info(c, "stats", "evicted_keys") - before; return evicted > 0 })
	s.do(c, "CONFIG", "SET", "maxmemory", "0")
	s.do(c, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	if !ok {
		s.t.Errorf("evict: no key evicted within 15s at maxmemory %d", used)
	}
	s.note("evict %d: maxmemory %d bytes, %d keys evicted", cycle, used, evicted)
}

// restartEmpty kills Redis and starts it again empty (no persistence),
// then waits until joins work again between every two neighbouring
// replicas: the time between is a window Redis was away.
func (s *faultRun) restartEmpty(ctx context.Context, cycle int) {
	from := time.Now()
	s.redis.Kill()
	s.redis.Restart()
	back := time.Now()
	s.rejoin(ctx, fmt.Sprintf("restart-empty %d", cycle), from, back)
	s.note("restart-empty %d: Redis away %v, joins on every replica %v after its return", cycle, back.Sub(from).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
}

// rejoin waits until every replica and its neighbour join a key again
// (one generation, both answers whole) after Redis' return at back, and
// records the time from the fault's start until then as a window Redis
// was away.
func (s *faultRun) rejoin(ctx context.Context, fault string, from, back time.Time) {
	defer func() {
		s.mu.Lock()
		s.away = append(s.away, window{from, time.Now()})
		s.mu.Unlock()
	}()
	n := s.rig.Replicas
	for r := 0; r < n; r++ {
		joined := false
		// Polling pairs for the event, bounded by rejoinGuard.
		for i := 0; !joined && time.Since(back) < rejoinGuard && ctx.Err() == nil; i++ {
			key := fmt.Sprintf("probe-%s-%d-%d", strings.ReplaceAll(fault, " ", "-"), r, i)
			got := s.sendKey(ctx, key, []target{{r, FaultRoute}, {(r + 1) % n, FaultRoute}})
			joined = got[0].complete() && got[1].complete() && s.up.Attempts(key) == 1
		}
		if !joined {
			s.t.Errorf("%s: replicas %d and %d never joined a key again within %v of Redis' return", fault, r, (r+1)%n, rejoinGuard)
		}
	}
}

// restartMidFlight restarts Redis empty while replica 0 leads a long
// answer (long-*, 2.5s after its first token) and nothing else runs (the
// load holds), waits until replicas 1 and 2 join keys through the new
// Redis, then, while the first leader still streams, sends the same key
// through replicas 1 and 2. The README says a leader whose stream vanished
// ends its answer broken: the first generation must not end whole beside
// the second (the judge counts two overlapping whole generations).
func (s *faultRun) restartMidFlight(ctx context.Context, cycle int) {
	s.hold.Lock()
	defer s.hold.Unlock()
	key := fmt.Sprintf("long-%d", cycle)
	first := make(chan struct{})
	leader := make(chan faultAnswer, 1)
	go func() { leader <- s.send(ctx, target{0, FaultRoute}, key, func() { close(first) }) }()
	select {
	case <-first:
	case <-ctx.Done():
	}
	from := time.Now()
	s.redis.Kill()
	s.redis.Restart()
	back := time.Now()
	joined := false
	// Polling pairs for the event, bounded by rejoinGuard.
	for i := 0; !joined && time.Since(back) < rejoinGuard && ctx.Err() == nil; i++ {
		probe := fmt.Sprintf("probe-mid-%d-%d", cycle, i)
		got := s.sendKey(ctx, probe, []target{{1, FaultRoute}, {2, FaultRoute}})
		joined = got[0].complete() && got[1].complete() && s.up.Attempts(probe) == 1
	}
	s.mu.Lock()
	s.away = append(s.away, window{from, time.Now()})
	s.mu.Unlock()
	var still bool
	select {
	case a := <-leader:
		leader <- a
	default:
		still = true
	}
	second := s.sendKey(ctx, key, []target{{1, FaultRoute}, {2, FaultRoute}})
	first0 := <-leader
	s.record(first0)
	s.note("restart-mid-flight %d: Redis away %v, replicas 1 and 2 joined again %v after; the leader (replica 0) still streaming then: %v; its client: status %d, [DONE] %v, err %v, %d bytes; the same key through replicas 1 and 2 after: %v / %v; %d generations",
		cycle, back.Sub(from).Round(time.Millisecond), time.Since(back).Round(time.Millisecond), still, first0.status, first0.done, first0.err, len(first0.text),
		second[0].complete(), second[1].complete(), s.up.Attempts(key))
}

// storm follows many keys at once: 40 keys (the full form: 60, its first
// 500, 1,000 followers), each from 3 clients through 3 replicas (the 2-replica
// rigs: two on one), all sent at one gate.
func (s *faultRun) storm(ctx context.Context, cycle int) {
	keys := Count(40, 60)
	if cycle == 0 {
		keys = Count(40, 500)
	}
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("storm-%d-%d", cycle, k)
		var targets []target
		for j := 0; j < 3; j++ {
			targets = append(targets, target{(k + j) % s.rig.Replicas, FaultRoute})
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			s.sendKey(ctx, key, targets)
		}()
	}
	close(gate)
	wg.Wait()
	s.note("storm %d: %d keys, 3 clients each, at once", cycle, keys)
}

// pause pauses (SIGSTOP) a replica that leads a key with followers on the
// others, keeps it stopped until every lease in Redis at the pause is gone
// (its own ran out: it was paused past its lease), then resumes it. Before
// commit: the upstream holds the leader's generation (slow-*) until the
// pause has landed, whatever the machine's load; after: the leader's
// client already has its first chunk.
func (s *faultRun) pause(ctx context.Context, cycle int, beforeCommit bool) {
	n := s.rig.Replicas
	r := (cycle*2 + map[bool]int{true: 0, false: 1}[beforeCommit]) % n
	key := fmt.Sprintf("paused-%d-%d", cycle, r)
	release := func() {}
	if beforeCommit {
		key = "slow-" + key
		gate := s.held.Hold(GenID(key, 1))
		var once sync.Once
		release = func() { once.Do(func() { close(gate) }) }
		defer release()
	}
	var wg sync.WaitGroup
	leaderFirst := make(chan struct{})
	answers := make([]faultAnswer, 3)
	wg.Add(1)
	go func() {
		defer wg.Done()
		answers[0] = s.send(ctx, target{r, FaultRoute}, key, func() { close(leaderFirst) })
	}()
	if err := s.up.WaitFor(ctx, func() bool { return s.up.Attempts(key) >= 1 }); err != nil {
		s.t.Errorf("pause: the leader's generation of %s never reached the upstream: %v", key, err)
	}
	if !beforeCommit {
		select {
		case <-leaderFirst:
		case <-ctx.Done():
		}
	}
	for j := 1; j <= 2; j++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[j] = s.send(ctx, target{(r + j) % n, FaultRoute}, key, nil)
		}()
	}
	nodes := s.keyNodes()
	leases := s.leases(nodes)
	paused := time.Now()
	s.rig.Pause(r)
	release() // the leader is stopped before its generation's first byte
	gone := until(ctx, func() bool {
		now := s.leases(nodes)
		for k, v := range leases {
			if now[k] == v {
				return false
			}
		}
		return true
	})
	s.rig.Resume(r)
	if !gone {
		s.t.Errorf("pause: replica %d paused 15s and the leases of the pause still held", r)
	}
	wg.Wait()
	s.record(answers...)
	s.note("pause %s %d: replica %d leading %s stopped %v (%d leases at the pause); its client: status %d, [DONE] %v, err %v; %d generations",
		map[bool]string{true: "before commit", false: "after commit"}[beforeCommit], cycle, r, key, time.Since(paused).Round(time.Millisecond),
		len(leases), answers[0].status, answers[0].done, answers[0].err, s.up.Attempts(key))
}

// leases is every lease key on nodes and its value.
func (s *faultRun) leases(nodes []*redisproc.Server) map[string]string {
	out := map[string]string{}
	for _, node := range nodes {
		keys, err := node.Do("KEYS", "*:lease")
		if err != nil {
			s.t.Errorf("KEYS at %s: %v", node.Addr(), err)
			continue
		}
		for _, k := range strings.Fields(keys) {
			if v, err := node.Do("GET", k); err == nil && v != "" {
				out[k] = v
			}
		}
	}
	return out
}

func (s *faultRun) note(format string, args ...any) {
	s.mu.Lock()
	s.notes = append(s.notes, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

// fleetOps are the fleet's operations, as its error counter labels them.
var fleetOps = []string{"claim", "append", "finish", "renew", "read", "lease", "sync", "publish", "heartbeat"}

// operationErrors is the replicas' fleet operation errors by operation
// ("op=n ...", the ones that failed; "n/a" without Metric).
func (s *faultRun) operationErrors() string {
	if s.rig.Metric == nil {
		return "n/a"
	}
	var parts []string
	for _, op := range fleetOps {
		if n := s.rig.Metric(s.t, "llm_hedge_fleet_operation_errors_total", map[string]string{"op": op}); n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%v", op, n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// awayAt is the window Redis was away that at lies in (ok false: none).
func (s *faultRun) awayAt(at time.Time) (w window, ok bool) {
	for _, w := range s.away {
		if !at.Before(w.from) && !at.After(w.to) {
			return w, true
		}
	}
	return window{}, false
}

// judge counts every answer and fails the test on a clean answer with a
// hole, a key with two complete generations on one route (outside the
// windows Redis was away), a generation read through both routes, or a
// broken answer that is not a prefix of its generation.
func (s *faultRun) judge(proxy string) {
	t := s.t
	var complete, cut, noDone, retry409, retry503, noRetryAfter, other int
	var holes, spliced, foreign []string
	var otherErrs []string
	completeGens := map[string]map[int][]faultAnswer{} // route key -> generation -> its complete answers
	genRoutes := map[string]map[string]bool{}          // generation -> routes that read it
	keys := map[string]bool{}
	route2, route2Complete, replays := 0, 0, 0
	for _, a := range s.answers {
		keys[a.key] = true
		if a.replayed && a.complete() {
			replays++
		}
		if a.route != FaultRoute {
			route2++
			if a.complete() {
				route2Complete++
			}
		}
		switch {
		case a.complete():
			complete++
		case a.status == http.StatusOK && a.err != nil:
			cut++
		case a.status == http.StatusOK:
			noDone++
		case a.status == http.StatusConflict || a.status == http.StatusServiceUnavailable:
			if a.status == http.StatusConflict {
				retry409++
			} else {
				retry503++
			}
			if a.retryAfter == "" {
				noRetryAfter++
			}
		default:
			other++
			if len(otherErrs) < 5 {
				otherErrs = append(otherErrs, a.String())
			}
		}
		if a.text == "" {
			if a.complete() {
				holes = append(holes, a.String())
			}
			continue
		}
		key, n, ok := ParseGen(a.text)
		if !ok || key != a.key || n > s.up.Attempts(a.key) {
			foreign = append(foreign, a.String())
			continue
		}
		gen := GenID(key, n)
		if genRoutes[gen] == nil {
			genRoutes[gen] = map[string]bool{}
		}
		genRoutes[gen][a.route] = true
		want := s.up.Expected(key, n)
		if a.complete() {
			if a.text != want {
				holes = append(holes, a.String()+fmt.Sprintf(", want generation %d's %d bytes", n, len(want)))
				continue
			}
			rk := a.route + " " + a.key
			if completeGens[rk] == nil {
				completeGens[rk] = map[int][]faultAnswer{}
			}
			completeGens[rk][n] = append(completeGens[rk][n], a)
		} else if !strings.HasPrefix(want, a.text) {
			spliced = append(spliced, a.String())
		}
	}
	// A key's complete generations on one route: two that overlapped (the
	// later one started before any client had the earlier one whole) are
	// two committed generations, unless one started while Redis was away;
	// one that started after another was complete is a fresh race after
	// the stored answer was lost (flushed, evicted, restarted), not a
	// second commit of one flight.
	var twoGens, failOpen, acrossRestart, afresh []string
	joined := 0
	for rk, gens := range completeGens {
		for _, as := range gens {
			if len(as) > 1 {
				joined++
			}
		}
		if len(gens) < 2 {
			continue
		}
		key := strings.SplitN(rk, " ", 2)[1]
		var order []int
		for n := range gens {
			order = append(order, n)
		}
		sort.Ints(order)
		var desc []string
		away, overlap := false, false
		var awayFrom time.Time
		for k, n := range order {
			started := s.up.Started(key, n)
			if w, in := s.awayAt(started); in {
				away, awayFrom = true, w.from
			}
			var reps []string
			firstWhole := gens[n][0].end
			for _, a := range gens[n] {
				reps = append(reps, strconv.Itoa(a.replica))
				if a.end.Before(firstWhole) {
					firstWhole = a.end
				}
			}
			if k+1 < len(order) && s.up.Started(key, order[k+1]).Before(firstWhole) {
				overlap = true
			}
			desc = append(desc, fmt.Sprintf("generation %d (started %s, first whole %s) complete via replicas %s",
				n, started.Format("15:04:05.000"), firstWhole.Format("15:04:05.000"), strings.Join(reps, ",")))
		}
		var others []string
		for _, a := range s.answers {
			if a.route+" "+a.key == rk && !a.complete() {
				others = append(others, fmt.Sprintf("replica %d: status %d, [DONE] %v, err %v, %d bytes, returned %s", a.replica, a.status, a.done, a.err, len(a.text), a.end.Format("15:04:05.000")))
			}
		}
		if len(others) > 0 {
			desc = append(desc, "the others: "+strings.Join(others, "; "))
		}
		line := rk + ": " + strings.Join(desc, "; ")
		switch {
		case overlap && away && s.up.Started(key, order[0]).Before(awayFrom):
			// The first began before Redis went away (a fleet flight),
			// another while it was away; both whole.
			acrossRestart = append(acrossRestart, line)
		case overlap && away:
			failOpen = append(failOpen, line)
		case overlap:
			twoGens = append(twoGens, line)
		default:
			afresh = append(afresh, line)
		}
	}
	var crossRoute []string
	for gen, routes := range genRoutes {
		if len(routes) > 1 {
			crossRoute = append(crossRoute, gen)
		}
	}
	for _, n := range s.notes {
		t.Log(n)
	}
	faults := make([]string, 0, len(s.faults))
	for name, n := range s.faults {
		faults = append(faults, fmt.Sprintf("%s=%d", name, n))
	}
	sort.Strings(faults)
	line := fmt.Sprintf("ACCEPTANCE %s: keyed requests %d (%d keys; %d on the second route or deployment, %d of them complete), complete %d, broken %d (%d cut, %d without [DONE] and no error), retryable 409 %d / 503 %d, other errors %d; generations %d; generations whole at 2+ clients %d; complete replays %d; clean answers with a hole %d, keys with two complete generations on one route %d (+%d all begun while Redis was away, +%d one begun before Redis went away and one while it was; +%d a fresh race after the first was whole), replays from another route %d, broken answers not a prefix of one generation %d; faults %s; fleet operation errors %s",
		proxy, len(s.answers), len(keys), route2, route2Complete, complete, cut+noDone, cut, noDone, retry409, retry503, other, s.up.Generations(), joined, replays,
		len(holes), len(twoGens), len(failOpen), len(acrossRestart), len(afresh), len(crossRoute), len(spliced)+len(foreign), strings.Join(faults, " "), s.operationErrors())
	fmt.Fprintln(os.Stdout, line)
	t.Log(line)
	for _, l := range failOpen {
		t.Logf("two generations while Redis was away (documented: requests run on local state): %s", l)
	}
	for _, l := range twoGens {
		t.Logf("two overlapping whole generations: %s", l)
	}
	for _, l := range acrossRestart {
		t.Logf("two generations, one begun before Redis went away, one while it was away: %s", l)
	}
	for _, l := range afresh {
		t.Logf("a fresh race after a complete one (its stored answer lost): %s", l)
	}
	for _, e := range otherErrs {
		t.Logf("other error: %s", e)
	}
	if len(holes) > 0 {
		t.Errorf("%d clean answers with a hole (complete, not one generation's whole text); first: %s", len(holes), holes[0])
	}
	if len(twoGens) > 0 {
		t.Errorf("%d keys with two complete generations on one route; first: %s", len(twoGens), twoGens[0])
	}
	if len(crossRoute) > 0 {
		t.Errorf("%d generations read through both routes (a replay from another route); first: %s", len(crossRoute), crossRoute[0])
	}
	if len(spliced)+len(foreign) > 0 {
		t.Errorf("%d broken answers not a prefix of one generation of their key; first: %v %v", len(spliced)+len(foreign), spliced, foreign)
	}
	if noRetryAfter > 0 {
		t.Errorf("%d of %d retryable 409/503 answers without Retry-After", noRetryAfter, retry409+retry503)
	}
	if complete < len(s.answers)/2 {
		t.Errorf("only %d of %d keyed requests complete: the faults, not the load, made the run", complete, len(s.answers))
	}
	if joined == 0 {
		t.Errorf("no key had two complete answers of one generation: no follower was ever served")
	}
}
