package traefikplugin

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
	"github.com/llmhedge/llmhedge/resp"
)

// replica builds a handler for cfg as a separate Traefik process would:
// with its own route-state registry and its own fleet registry, so two
// replicas share nothing but Redis. The engine is built here, while the
// replica's registries are in place.
func replica(t *testing.T, cfg *Config, name string) http.Handler {
	t.Helper()
	return loggedReplica(t, cfg, name, nil)
}

// loggedReplica is replica with its log lines in logs (nil: none).
func loggedReplica(t *testing.T, cfg *Config, name string, logs io.Writer) http.Handler {
	t.Helper()
	savedShared := shared
	savedFleets := fleets
	shared = newRegistry()
	fleets = newFleetRegistry()
	h := newHedge(t, cfg, name, nil, logs)
	_, err := h.(*Hedge).engine()
	shared = savedShared
	fleets = savedFleets
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func fleetConfig(upstreamURL, redisURL, route string) *Config {
	cfg := oneUpstream(upstreamURL, route)
	cfg.Fleet.URL = redisURL
	cfg.Fleet.Timeout = "500ms" // a loaded test machine, not the 50ms default
	return cfg
}

// keyedStream sends a streaming request with an idempotency key and body
// text to h and returns the status and the raw body.
func keyedStream(h http.Handler, key, text string) (int, string) {
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + text + `"}]}`
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Test-Request", "fleet")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

type streamResult struct {
	status int
	body   string
}

func sendKeyedStream(h http.Handler, key, text string, out chan streamResult) {
	st, body := keyedStream(h, key, text)
	out <- streamResult{status: st, body: body}
}

// Two replicas sharing one Redis: the same key at both at once is one
// generation, both clients get its bytes; a later request at either is a
// replay; another body under the key is a 422.
func TestFleetSharesOneGenerationAcrossReplicas(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	sharesOneGeneration(t, srv.URL(), func(n int) { waitBlockedReaders(t, srv, n) })
}

// The same on a Redis Cluster (3 masters) through redis+cluster://: the
// client follows the slots of the flight's keys.
func TestFleetSharesOneGenerationOnACluster(t *testing.T) {
	rc := redisproc.StartCluster(t, redisproc.ClusterOptions{Masters: 3})
	sharesOneGeneration(t, rc.URL(), func(n int) {
		deadline := time.Now().Add(5 * time.Second)
		for {
			blocked := 0
			for _, addr := range rc.Addrs() {
				info, err := rc.Do(addr, "INFO", "clients")
				if err != nil {
					t.Fatalf("INFO clients at %s: %v", addr, err)
				}
				for _, line := range strings.Split(info, "\r\n") {
					if v, ok := strings.CutPrefix(line, "blocked_clients:"); ok {
						k, _ := strconv.Atoi(v)
						blocked += k
					}
				}
			}
			if blocked == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cluster never had %d blocked clients (%d)", n, blocked)
			}
			time.Sleep(2 * time.Millisecond) // polling Redis, bounded by deadline
		}
	})
}

// sharesOneGeneration runs two replicas on the Redis at redisURL;
// waitBlocked(n) returns once Redis has n clients in a blocking read.
func sharesOneGeneration(t *testing.T, redisURL string, waitBlocked func(n int)) {
	gate := make(chan struct{})
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{tokens: 4, gate: gate} })
	// Runs before the upstream's Close (cleanups run last-in first-out):
	// a failed test must not leave the upstream waiting at the gate.
	t.Cleanup(func() { close(gate) })
	route := "fleet-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	one := replica(t, fleetConfig(a.srv.URL, redisURL, route), "one")
	two := replica(t, fleetConfig(a.srv.URL, redisURL, route), "two")

	results := make(chan streamResult, 2)
	go sendKeyedStream(one, "k-fleet", "hi", results)
	a.await(t, "the leader's upstream request", func() bool { served, _ := a.counts(); return served == 1 })
	go sendKeyedStream(two, "k-fleet", "hi", results)
	// The follower on the other replica waits in a blocking read of the
	// leader's stream before the answer goes on.
	waitBlocked(1)
	for i := 0; i < 3; i++ {
		gate <- struct{}{}
	}
	first := <-results
	second := <-results
	if first.status != 200 || second.status != 200 {
		t.Fatalf("statuses %d and %d, want 200 and 200", first.status, second.status)
	}
	if first.body != second.body {
		t.Fatalf("the two replicas' answers differ:\n%q\n%q", first.body, second.body)
	}
	if !strings.Contains(first.body, "data: [DONE]") {
		t.Fatalf("answer incomplete: %q", first.body)
	}
	if served, _ := a.counts(); served != 1 {
		t.Fatalf("upstream generations = %d, want 1", served)
	}
	for _, h := range []http.Handler{one, two} {
		st, body := keyedStream(h, "k-fleet", "hi")
		if st != 200 || body != first.body {
			t.Fatalf("replay: status %d, same bytes %v; want 200, true", st, body == first.body)
		}
	}
	if st, _ := keyedStream(two, "k-fleet", "another body"); st != http.StatusUnprocessableEntity {
		t.Fatalf("same key, another body on the other replica: status %d, want 422", st)
	}
	if served, _ := a.counts(); served != 1 {
		t.Fatalf("upstream generations after replays = %d, want 1", served)
	}
}

// waitBlockedReaders polls until Redis has n clients in a blocking read.
func waitBlockedReaders(t *testing.T, srv *redisproc.Server, n int) {
	t.Helper()
	c, err := resp.New(resp.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		v, err := c.Do(ctx, "INFO", "clients")
		cancel()
		if err == nil && strings.Contains(v.Str, "blocked_clients:"+strconv.Itoa(n)+"\r\n") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis never had %d blocked clients (err %v): %q", n, err, v.Str)
		}
		time.Sleep(2 * time.Millisecond) // polling Redis, bounded by deadline
	}
}

// New dials nothing and starts nothing with a fleet configured; routers
// and reloads naming one Redis share one client and one fleet.
func TestFleetIsSharedAcrossRoutersAndReloadsAndMadeLazily(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{nonStream: true} })
	saved := fleets
	fleets = newFleetRegistry()
	defer func() { fleets = saved }()
	route := "fleet-lazy-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	goroutinesBefore := goroutinesOfOurs()
	var handlers []http.Handler
	for i := 0; i < 20; i++ {
		cfg := fleetConfig(a.srv.URL, srv.URL(), route+"-"+strconv.Itoa(i%2))
		if i >= 10 {
			cfg.Delay = "3s" // a reload with another option
		}
		handlers = append(handlers, newHedge(t, cfg, "router"+strconv.Itoa(i%2), nil, nil))
	}
	if after := goroutinesOfOurs(); len(after) > len(goroutinesBefore) {
		t.Fatalf("New started goroutines: %d before, %d after:\n%s\nbefore:\n%s", len(goroutinesBefore), len(after), strings.Join(after, "\n"), strings.Join(goroutinesBefore, "\n"))
	}
	if n := len(fleets.clients); n != 0 {
		t.Fatalf("Redis clients after New = %d, want 0 (made on the first request)", n)
	}
	for i, h := range handlers {
		if st, _ := keyedPost(t, h, "k-lazy-"+strconv.Itoa(i)); st != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200", i, st)
		}
	}
	if len(fleets.clients) != 1 || len(fleets.fleets) != 1 {
		t.Fatalf("clients %d, fleets %d after 20 handlers of one Redis; want 1 and 1", len(fleets.clients), len(fleets.fleets))
	}
	for _, c := range fleets.clients {
		if s := c.Stats(); s.Open > 4 {
			t.Fatalf("open Redis connections after 20 sequential requests = %d, want a few", s.Open)
		}
	}
}

func TestFleetPasswordFromAnUnsetVariableFailsNew(t *testing.T) {
	cfg := oneUpstream("http://127.0.0.1:1", "fleet-env")
	cfg.Fleet.URL = "redis://:hunter2@127.0.0.1:1/0"
	cfg.Fleet.PasswordEnv = "LLMHEDGE_TEST_SURELY_UNSET_REDIS_PASSWORD"
	_, err := New(context.Background(), http.NotFoundHandler(), cfg, "env")
	if err == nil || !strings.Contains(err.Error(), "LLMHEDGE_TEST_SURELY_UNSET_REDIS_PASSWORD") {
		t.Fatalf("New with an unset password variable: err = %v, want one naming the variable", err)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error %q contains the URL's password", err.Error())
	}
}

// fleet.maxFollowers sizes the blocking reads' pool (its default too); each
// value is a client of its own (the pool's bound is the client's).
func TestFleetMaxFollowersSizesTheBlockingPool(t *testing.T) {
	if got := fleetClientOptions(config.FleetConfig{URL: "redis://h:1/0", MaxFollowers: 7}).MaxBlocking; got != 7 {
		t.Fatalf("client options' MaxBlocking = %d, want 7 (fleet.maxFollowers)", got)
	}
	if got := fleetClientOptions(config.FleetConfig{URL: "redis://h:1/0"}).MaxBlocking; got != 512 {
		t.Fatalf("client options' MaxBlocking = %d, want 512 (fleet.maxFollowers' default)", got)
	}
	srv := redisproc.Start(t, redisproc.Options{})
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{nonStream: true} })
	saved := fleets
	fleets = newFleetRegistry()
	defer func() { fleets = saved }()
	route := "fleet-mb-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	for i, bound := range []int{0, 3, 3} {
		cfg := fleetConfig(a.srv.URL, srv.URL(), route)
		cfg.Fleet.MaxFollowers = bound
		h := newHedge(t, cfg, "mb"+strconv.Itoa(i), nil, nil)
		if st, _ := keyedPost(t, h, "k-mb-"+strconv.Itoa(i)); st != http.StatusOK {
			t.Fatalf("request with fleet.maxFollowers %d: status %d, want 200", bound, st)
		}
	}
	if len(fleets.clients) != 2 || len(fleets.fleets) != 2 {
		t.Fatalf("clients %d, fleets %d for maxFollowers 0, 3, 3 on one Redis; want 2 and 2", len(fleets.clients), len(fleets.fleets))
	}
}

// Redis away: keyed requests are answered from this replica's own state,
// and the fleet logs going down once, without the URL's password.
func TestFleetDownRequestsStillSucceed(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{Password: "hunter2-fleet"})
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{nonStream: true} })
	route := "fleet-down-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	cfg := fleetConfig(a.srv.URL, srv.URL(), route)
	cfg.Fleet.Timeout = "100ms"
	logs := &lineBuffer{}
	h := loggedReplica(t, cfg, "down", logs)
	srv.Kill()
	for i := 0; i < 6; i++ {
		st, _ := keyedPost(t, h, "k-down-"+strconv.Itoa(i))
		if st != http.StatusOK {
			t.Fatalf("request %d with Redis down: status %d, want 200", i, st)
		}
	}
	down := 0
	for _, l := range logs.all() {
		if strings.Contains(l, "llmhedge fleet down") {
			down++
		}
	}
	if down != 1 {
		t.Fatalf("fleet down lines = %d, want 1; lines: %q", down, logs.all())
	}
	for _, l := range logs.all() {
		if strings.Contains(l, "hunter2") {
			t.Fatalf("a log line contains the Redis password: %s", l)
		}
	}
}

// A redis:// fleet URL that names a Redis Cluster node: the client refuses
// it on its first connection, the fleet goes down with one log line that
// says to use redis+cluster://, and keyed requests are answered from this
// replica's own state.
func TestFleetAtAClusterNodeThroughARedisURLIsTurnedOff(t *testing.T) {
	rc := redisproc.StartCluster(t, redisproc.ClusterOptions{Masters: 3})
	a := startUpstream(t, "A", func(_ *http.Request) script { return script{nonStream: true} })
	route := "fleet-cluster-node-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	node := rc.Nodes[0].Addr()
	cfg := fleetConfig(a.srv.URL, "redis://"+node+"/0", route)
	logs := &lineBuffer{}
	h := loggedReplica(t, cfg, "cluster-node", logs)
	for i := 0; i < 6; i++ {
		st, _ := keyedPost(t, h, "k-node-"+strconv.Itoa(i))
		if st != http.StatusOK {
			t.Fatalf("request %d with the fleet at a cluster node: status %d, want 200", i, st)
		}
	}
	var down []string
	for _, l := range logs.all() {
		if strings.Contains(l, "llmhedge fleet down") {
			down = append(down, l)
		}
	}
	if len(down) != 1 || !strings.Contains(down[0], "is a Redis Cluster node") || !strings.Contains(down[0], "redis+cluster://"+node) {
		t.Fatalf("fleet down lines %q, want one that names the cluster node and redis+cluster://%s", down, node)
	}
}
