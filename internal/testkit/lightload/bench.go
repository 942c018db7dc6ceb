package lightload

import (
	"context"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// ChatStreamBody is the request body of the overhead benchmarks: a
// streaming Chat Completions call.
const ChatStreamBody = `{"model":"bench","stream":true,"messages":[{"role":"user","content":"Say something."}]}`

// StreamTarget is the Target of an overhead benchmark: ChatStreamBody
// posted to path on addr (tagged for the simulators' logs), n requests over
// conns connections, each answer a whole SSE stream, the proxy's CPU read
// from process pid.
func StreamTarget(name, addr, path string, pid, conns, n int) Target {
	return Target{Name: name,
		CPU: func() (time.Duration, error) { return ProcessCPU(pid) },
		Options: Options{Addr: addr, Conns: conns, N: n, WantSuffix: []byte("data: [DONE]\n\n"),
			Request: NewRequest("POST", addr, path, ChatStreamBody,
				"Content-Type: application/json", llmsim.HeaderRequest+": light")}}
}

// Bench runs an overhead benchmark: one warm-up round of warmUp requests
// per target (connections, pools, the runtimes and interpreters on both
// sides), then rounds of perRound requests per target. targets builds the
// targets for a number of requests. It returns the warm-up's Comparison
// too, for benchmarks that count what the upstreams served.
func Bench(ctx context.Context, rounds, warmUp, perRound int, targets func(n int) []Target) (warm, measured *Comparison, err error) {
	if warm, err = Compare(ctx, 1, targets(warmUp)); err != nil {
		return warm, nil, err
	}
	measured, err = Compare(ctx, rounds, targets(perRound))
	return warm, measured, err
}

// Sent is the number of requests sent to every target: answered or failed.
func (c *Comparison) Sent() int64 {
	var n int64
	for i := range c.Names {
		n += int64(c.Requests[i] + c.Failed[i])
	}
	return n
}

// CheckNoFailureNoHedge fails t for every target whose requests failed, and
// when the spare upstream served a request: on the fast upstream no hedge
// may fire.
func (c *Comparison) CheckNoFailureNoHedge(t testing.TB, spare *llmsim.Running) {
	t.Helper()
	for _, f := range c.Failures() {
		t.Error(f)
	}
	if spare.Served() != 0 {
		t.Errorf("a hedge fired on the fast upstream (%d requests to the spare)", spare.Served())
	}
}
