// Package fleetsuite holds the fleet-mode scenarios that every adapter runs
// through its own real replicas sharing one real redis-server: each adapter
// passes a Rig that starts nothing itself, only reaches what its test set up.
package fleetsuite

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/loadloop"
)

// Count is n in CI and full under LLMHEDGE_FLEET=full (the acceptance counts).
func Count(n, full int) int {
	if os.Getenv("LLMHEDGE_FLEET") == "full" {
		return full
	}
	return n
}

// Rig is what a scenario needs of an adapter's fleet.
type Rig struct {
	// Replicas is how many replicas Stream can reach (indexes 0..Replicas-1).
	Replicas int
	// Stream sends one keyed streaming chat request with apiKey through
	// replica i and returns the text it got and its error.
	Stream func(ctx context.Context, replica int, apiKey, key string) (string, error)
	// Attempts is how many generations the simulated upstream ran for key.
	Attempts func(key string) int
	// Expected is the one complete answer of key (tokens long).
	Expected func(key string, tokens int) string
	// KillRedis and RestartRedis stop and bring back the shared redis-server.
	KillRedis, RestartRedis func()
}

// RedisKilledUnderLoad runs 20 concurrent streams (answers of 10 tokens)
// across the replicas for total; Redis is killed after a third and
// restarted after two thirds. It fails on any failed request, and unless
// joins across replicas 0 and 1 work again within 2s of Redis' return.
func RedisKilledUnderLoad(t *testing.T, ctx context.Context, total time.Duration, rig Rig) {
	t.Helper()
	var done, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	wait := loadloop.Workers(20, stop, func(g, i int) {
		key := fmt.Sprintf("load-%d-%d", g, i)
		text, err := rig.Stream(ctx, (g+i)%rig.Replicas, "sk-alice", key)
		if err != nil || text != rig.Expected(key, 10) {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, fmt.Sprintf("%s: %q, %v", key, text, err))
		}
		done.Add(1)
	})
	timer := time.NewTimer(total / 3)
	<-timer.C
	rig.KillRedis()
	timer.Reset(total / 3)
	<-timer.C
	rig.RestartRedis()
	back := time.Now()
	joined := time.Duration(-1)
	for i := 0; time.Since(back) < 10*time.Second; i++ {
		key := "rejoin-" + strconv.Itoa(i)
		var pair sync.WaitGroup
		for j := 0; j < 2; j++ {
			j := j
			pair.Add(1)
			go func() {
				defer pair.Done()
				_, _ = rig.Stream(ctx, j, "sk-carol", key)
			}()
		}
		pair.Wait()
		if rig.Attempts(key) == 1 {
			joined = time.Since(back)
			break
		}
	}
	timer.Reset(total / 3)
	<-timer.C
	close(stop)
	wait()
	t.Logf("%d requests under load, %d failed; joins again %v after Redis' return", done.Load(), failed.Load(), joined)
	if failed.Load() != 0 {
		t.Errorf("%d of %d requests failed while Redis was killed and restarted; first: %v", failed.Load(), done.Load(), firstErr.Load())
	}
	if joined < 0 || joined > 2*time.Second {
		t.Errorf("joins worked again %v after Redis' return, want within 2s", joined)
	}
}
