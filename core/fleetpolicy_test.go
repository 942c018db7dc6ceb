package core

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// policyClient answers CONFIG GET maxmemory-policy with what answer
// returns, and counts the calls.
type policyClient struct {
	mu     sync.Mutex
	calls  int
	answer func() (fleetstore.RedisValue, error)
}

func (c *policyClient) Do(ctx context.Context, args ...string) (fleetstore.RedisValue, error) {
	c.mu.Lock()
	c.calls++
	answer := c.answer
	c.mu.Unlock()
	return answer()
}

func (c *policyClient) Pipeline(ctx context.Context, cmds [][]string) ([]fleetstore.RedisValue, error) {
	return nil, errors.New("policyClient: no pipelines")
}

func policyIs(p string) func() (fleetstore.RedisValue, error) {
	return func() (fleetstore.RedisValue, error) {
		return fleetstore.RedisValue{Kind: fleetstore.RedisArray, Array: []fleetstore.RedisValue{{Kind: fleetstore.RedisString, Str: "maxmemory-policy"}, {Kind: fleetstore.RedisString, Str: p}}}, nil
	}
}

func policyFails(msg string) func() (fleetstore.RedisValue, error) {
	return func() (fleetstore.RedisValue, error) { return fleetstore.RedisValue{}, errors.New(msg) }
}

// policySink keeps the eviction gauge's samples.
type policySink struct {
	mu      sync.Mutex
	samples []float64
}

func (s *policySink) Record(metric int, labels []string, v float64) {
	if metric != MetricFleetEvictionSafe {
		return
	}
	s.mu.Lock()
	s.samples = append(s.samples, v)
	s.mu.Unlock()
}

func (s *policySink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.samples))
	for _, v := range s.samples {
		if v == 1 {
			out = append(out, "1")
		} else {
			out = append(out, "0")
		}
	}
	return strings.Join(out, " ")
}

// policyLines keeps the fleet's log lines as "level msg".
type policyLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *policyLines) log(fields []LogField) {
	level, msg := "warn", ""
	for _, f := range fields {
		switch f.Key {
		case "level":
			level = f.Str
		case "msg":
			msg = f.Str
		}
	}
	l.mu.Lock()
	l.lines = append(l.lines, level+" "+msg)
	l.mu.Unlock()
}

func (l *policyLines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

func newPolicyFleet(answer func() (fleetstore.RedisValue, error)) (*Fleet, *policyClient, *policySink, *policyLines) {
	client := &policyClient{answer: answer}
	sink, lines := &policySink{}, &policyLines{}
	f := NewFleet(client, config.FleetConfig{URL: "redis://redis:6379/0"}, FleetOptions{Metrics: sink, Log: lines.log})
	return f, client, sink, lines
}

// An evicting policy: one warning and one gauge sample at 0, however many
// rounds follow; read again only after the fleet was down and is back,
// warned again only when the policy differs.
func TestFleetPolicyWarnsOnce(t *testing.T) {
	f, client, sink, lines := newPolicyFleet(policyIs("volatile-lru"))
	for i := 0; i < 3; i++ {
		fleetCheckPolicy(f)
	}
	if client.calls != 1 {
		t.Errorf("CONFIG GET sent %d times in 3 rounds, want 1", client.calls)
	}
	got := lines.all()
	if len(got) != 1 || !strings.HasPrefix(got[0], "warn ") || !strings.Contains(got[0], "maxmemory-policy is volatile-lru, not noeviction") {
		t.Fatalf("log lines %q, want one warning naming volatile-lru", got)
	}
	if s := sink.String(); s != "0" {
		t.Errorf("eviction gauge samples %q, want one 0", s)
	}
	for i := 0; i < fleetstore.FailuresToOpen; i++ {
		fleetstore.Result(f.conn, errors.New("dial: refused"), false, fleetstore.Replies(f.conn))
	}
	fleetCheckPolicy(f) // down: not read
	if client.calls != 1 {
		t.Errorf("CONFIG GET sent while the fleet is down (%d calls), want none", client.calls)
	}
	fleetstore.Result(f.conn, nil, true, fleetstore.Replies(f.conn)) // back up: read at the next round
	fleetCheckPolicy(f)
	if client.calls != 2 {
		t.Errorf("%d CONFIG GET after the fleet came back, want 2 in all", client.calls)
	}
	if n := len(lines.all()); n != 3 { // down, up, no new warning
		t.Errorf("log lines %q after a down and up with the same policy, want the two state lines only", lines.all()[1:])
	}
	client.answer = policyIs("allkeys-lfu")
	fleetPolicyDue(f)
	fleetCheckPolicy(f)
	if got := lines.all(); !strings.Contains(got[len(got)-1], "allkeys-lfu") {
		t.Errorf("last line %q after the policy changed, want a warning naming allkeys-lfu", got[len(got)-1])
	}
}

// noeviction: no line, the gauge at 1.
func TestFleetPolicyNoEvictionIsQuiet(t *testing.T) {
	f, _, sink, lines := newPolicyFleet(policyIs("noeviction"))
	fleetCheckPolicy(f)
	fleetCheckPolicy(f)
	if got := lines.all(); len(got) != 0 {
		t.Errorf("log lines %q with noeviction, want none", got)
	}
	if s := sink.String(); s != "1" {
		t.Errorf("eviction gauge samples %q, want one 1", s)
	}
}

// CONFIG refused (an error reply): one info line, no gauge, not asked
// again. No reply at all (a timeout) or a "not now" reply: asked again at
// the next round, nothing said.
func TestFleetPolicyRefusedOrUnanswered(t *testing.T) {
	f, client, sink, lines := newPolicyFleet(policyFails("NOPERM User default has no permissions to run the 'config|get' command"))
	fleetCheckPolicy(f)
	fleetCheckPolicy(f)
	got := lines.all()
	if len(got) != 1 || !strings.HasPrefix(got[0], "info ") || !strings.Contains(got[0], "cannot read Redis maxmemory-policy") {
		t.Errorf("log lines %q, want one info line saying the policy cannot be read", got)
	}
	if client.calls != 1 || sink.String() != "" {
		t.Errorf("%d CONFIG GET, gauge samples %q, want 1 and none", client.calls, sink.String())
	}
	if !f.Up() {
		t.Error("fleet down after a refused CONFIG GET, want up (an error reply is no Redis failure)")
	}

	for _, msg := range []string{"context deadline exceeded", "EOF", "dial tcp 127.0.0.1:6379: connect: connection refused",
		"LOADING Redis is loading the dataset in memory"} {
		f, client, sink, lines := newPolicyFleet(policyFails(msg))
		fleetCheckPolicy(f)
		client.answer = policyIs("allkeys-random")
		fleetCheckPolicy(f)
		if client.calls != 2 || len(lines.all()) != 1 || sink.String() != "0" {
			t.Errorf("%q, then allkeys-random: %d CONFIG GET, lines %q, gauge %q, want 2, one warning, 0", msg, client.calls, lines.all(), sink.String())
		}
	}
}
