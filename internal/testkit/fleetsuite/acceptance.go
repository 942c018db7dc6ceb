package fleetsuite

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
	"github.com/llmhedge/llmhedge/resp"
)

// The acceptance scenarios of fleet mode part 2 (the fleet-wide budget,
// shared cool-downs, the kill switch, the spend cap, the overhead) run
// through real replicas of different proxies sharing one real Redis. The
// suite owns the simulated upstreams and says which routes every replica
// must serve (Routes); the adapter's test starts the replicas from those
// specs and hands them back (Attach).

// ReplicaHeader is the header every replica adds to its upstream requests
// with its own name, so that an upstream's request log says which replica
// sent each attempt.
const ReplicaHeader = "X-Fleet-Replica"

// FleetPrefix is the key prefix of the acceptance fleet.
const FleetPrefix = "llmhedge:"

// SimUpstream is one simulated upstream of a route: its name in the route
// and its server.
type SimUpstream struct {
	Name string
	Sim  *llmsim.Running
}

// RouteSpec is a route every replica serves, in neutral form: each adapter
// renders it in its own configuration syntax.
type RouteSpec struct {
	// Name is the route's name (the same on every replica: the fleet's keys
	// carry it).
	Name      string
	Upstreams []SimUpstream
	// Delay is the fixed hedge delay.
	Delay       time.Duration
	MaxAttempts int
	// BudgetRatio and BudgetBurst are the hedge budget; a negative ratio
	// turns the budget off.
	BudgetRatio float64
	BudgetBurst int
	// SpendCapTokens is the hourly spend cap on estimated extra prompt
	// tokens (0: none).
	SpendCapTokens int64
	// Fleet joins the route to the fleet's Redis; without it the route is
	// today's per-replica behaviour.
	Fleet bool
	// RouteKey: the upstreams get the route's own Authorization (a 429 then
	// answers the route, not the caller: it cools the upstream for all).
	RouteKey bool
	// Caddy and Traefik are extra option lines of the route in each syntax;
	// CaddyFleet and TraefikFleet extra lines of its fleet block.
	Caddy, Traefik           []string
	CaddyFleet, TraefikFleet []string
}

// RouteAuthorization is the route's own key of a RouteKey route.
const RouteAuthorization = "Bearer sk-route"

// Replica is one running proxy as the scenarios reach it.
type Replica struct {
	// Name is also what the replica sends in ReplicaHeader.
	Name string
	// Kind is "caddy" or "traefik".
	Kind string
	// URL is the base URL of route (requests go to URL(route)+"/v1/...").
	URL func(route string) string
	// PID is the replica's process id (its CPU time is read from /proc).
	PID func() int
	// Metrics returns the replica's llm_hedge_* metrics text.
	Metrics func() (string, error)
	// Reload replaces the replica's configuration by an equivalent one the
	// way an operator does (Caddy: POST /load; Traefik: a rewritten
	// dynamic configuration, which re-creates the plugin instances), and
	// returns once the new one serves.
	Reload func() error
}

// Acceptance is the suite's state: the Redis, the upstreams of every
// route, and (after Attach) the replicas.
type Acceptance struct {
	Redis    *redisproc.Server
	routes   []RouteSpec
	byName   map[string]RouteSpec
	Replicas []Replica
	client   *http.Client
}

// The routes of the acceptance suite.
const (
	RouteBudget      = "budget"       // fleet on: the fleet-wide budget
	RouteBudgetLocal = "budget-local" // the same without the fleet
	RouteCool        = "cool"         // fleet on: shared cool-downs
	RouteCoolLocal   = "cool-local"   // the same without the fleet
	RouteSwitch      = "switch"       // fleet on: the kill switch
	RouteSpend       = "spend"        // fleet on: the spend cap
	RouteFast        = "fast"         // fleet on: overhead
	RouteFastLocal   = "fast-local"   // the same without the fleet
)

// Budget route numbers: the acceptance settings.
const (
	budgetRatio = 0.05
	budgetBurst = 5
)

// NewAcceptance starts the suite's Redis and upstreams for t.
func NewAcceptance(t *testing.T) *Acceptance {
	t.Helper()
	s := &Acceptance{Redis: redisproc.Start(t, redisproc.Options{}), byName: map[string]RouteSpec{},
		client: &http.Client{Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}}}
	t.Cleanup(s.client.CloseIdleConnections)
	sim := func(name string, w llmsim.Workload) SimUpstream {
		r := llmsim.Start(name, w)
		t.Cleanup(r.Close)
		return SimUpstream{Name: name, Sim: r}
	}
	// Every request wants a hedge: A answers long after the delay; B is the
	// hedges' upstream (B gets nothing else: no request fails).
	slow := llmsim.Workload{MedianTTFT: 150 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 2, TokenGap: time.Millisecond, PingEvery: 50 * time.Millisecond}
	quick := llmsim.Workload{MedianTTFT: 2 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 2, TokenGap: time.Millisecond, PingEvery: -1}
	for _, fleet := range []bool{true, false} {
		name, suffix := RouteBudget, ""
		if !fleet {
			name, suffix = RouteBudgetLocal, "-local"
		}
		s.add(RouteSpec{Name: name, Upstreams: []SimUpstream{sim("A", slow), sim("B", slow)}, Delay: 20 * time.Millisecond,
			MaxAttempts: 2, BudgetRatio: budgetRatio, BudgetBurst: budgetBurst, Fleet: fleet})
		// No hedge (delay 10s); a 429 from A is retried on B.
		cool := RouteCool + suffix
		s.add(RouteSpec{Name: cool, Upstreams: []SimUpstream{sim("A", quick), sim("B", quick)}, Delay: 10 * time.Second,
			MaxAttempts: 2, BudgetRatio: -1, Fleet: fleet, RouteKey: true})
		fast := RouteFast + suffix
		s.add(RouteSpec{Name: fast, Upstreams: []SimUpstream{sim("A", llmsim.Fast()), sim("B", llmsim.Fast())}, Delay: 10 * time.Second,
			MaxAttempts: 2, Fleet: fleet})
	}
	// The kill switch: every request hedges as long as hedging is on.
	s.add(RouteSpec{Name: RouteSwitch, Upstreams: []SimUpstream{sim("A", slow), sim("B", slow)}, Delay: 20 * time.Millisecond,
		MaxAttempts: 2, BudgetRatio: -1, Fleet: true})
	// The spend cap: every request wants a hedge, the bucket never runs
	// dry, the cap stops them.
	s.add(RouteSpec{Name: RouteSpend, Upstreams: []SimUpstream{sim("A", slow), sim("B", slow)}, Delay: 20 * time.Millisecond,
		MaxAttempts: 2, BudgetRatio: 1, BudgetBurst: 1000, SpendCapTokens: spendCapTokens, Fleet: true})
	return s
}

func (s *Acceptance) add(r RouteSpec) {
	s.routes = append(s.routes, r)
	s.byName[r.Name] = r
}

// Routes are the routes every replica must serve.
func (s *Acceptance) Routes() []RouteSpec { return s.routes }

// RedisURL is the fleet's Redis.
func (s *Acceptance) RedisURL() string { return s.Redis.URL() }

// Attach gives the suite the running replicas.
func (s *Acceptance) Attach(replicas []Replica) { s.Replicas = replicas }

// upstream is route's upstream named name.
func (s *Acceptance) upstream(route, name string) *llmsim.Running {
	for _, u := range s.byName[route].Upstreams {
		if u.Name == name {
			return u.Sim
		}
	}
	panic("fleetsuite: no upstream " + name + " on route " + route)
}

// post sends one streaming chat request with request id id (and an
// X-Sim-Behavior value, "" for none) to route on replica r, reads the
// answer to its end and returns its status.
func (s *Acceptance) post(ctx context.Context, r Replica, route, id, behavior string) (int, error) {
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL(route)+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-fleet")
	req.Header.Set(llmsim.HeaderRequest, id)
	if behavior != "" {
		req.Header.Set(llmsim.HeaderBehavior, behavior)
	}
	res, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	_, err = io.Copy(io.Discard, res.Body)
	return res.StatusCode, err
}

// redis is a client of the fleet's Redis for the test itself.
func (s *Acceptance) redis(t *testing.T) *resp.Client {
	t.Helper()
	c, err := resp.New(resp.Options{URL: s.Redis.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// redisDo runs one command against the fleet's Redis.
func redisDo(t *testing.T, c *resp.Client, args ...string) fleetstore.RedisValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := c.Do(ctx, args...)
	if err != nil {
		t.Fatalf("redis %s: %v", args[0], err)
	}
	return v
}

// byReplica counts requests in reqs by the replica that sent them.
func byReplica(reqs []llmsim.Request) map[string]int {
	out := map[string]int{}
	for _, r := range reqs {
		out[r.Header.Get(ReplicaHeader)]++
	}
	return out
}

// countsLine renders per-replica counts in replica order: "caddy-1=3 ...".
func (s *Acceptance) countsLine(counts map[string]int) string {
	parts := make([]string, 0, len(s.Replicas))
	for _, r := range s.Replicas {
		parts = append(parts, fmt.Sprintf("%s=%d", r.Name, counts[r.Name]))
	}
	return strings.Join(parts, " ")
}

// quantile is the q-quantile (nearest rank) of ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(q*float64(len(s)-1)+0.5)]
}

// roundRobin sends n requests to route through the replicas in turn (request
// i to replica i mod len), c at a time, with ids prefix-i, and returns how
// many did not end 200.
func (s *Acceptance) roundRobin(ctx context.Context, route, prefix string, n, c int) (failed int, firstErr string) {
	var mu sync.Mutex
	next := 0
	var wg sync.WaitGroup
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				r := s.Replicas[i%len(s.Replicas)]
				id := fmt.Sprintf("%s-%d", prefix, i)
				status, err := s.post(ctx, r, route, id, "")
				if err != nil || status != http.StatusOK {
					mu.Lock()
					failed++
					if firstErr == "" {
						firstErr = fmt.Sprintf("%s on %s: status %d, %v", id, r.Name, status, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return failed, firstErr
}
