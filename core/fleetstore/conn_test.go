package fleetstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// gateClient answers each command when the test sends its outcome on the
// gate named by the command's first argument (nil: an OK reply); entered
// gets each command as it arrives.
type gateClient struct {
	gates   map[string]chan error
	entered chan string
}

func (c *gateClient) Do(ctx context.Context, args ...string) (RedisValue, error) {
	c.entered <- args[0]
	if err := <-c.gates[args[0]]; err != nil {
		return RedisValue{}, err
	}
	return RedisValue{Kind: RedisString, Str: "OK"}, nil
}

func (c *gateClient) Pipeline(ctx context.Context, cmds [][]string) ([]RedisValue, error) {
	return nil, errors.New("gateClient: no pipelines")
}

// The breaker opens on Redis' silence, not on a burst of timeouts: three
// operations that time out after Redis answered another one sent after
// them (a replica too busy to read their replies in time) leave the fleet
// up; three failures with no reply since each was sent take it down.
func TestFleetBreakerOpensOnSilenceOnly(t *testing.T) {
	c := &gateClient{gates: map[string]chan error{"LOST": make(chan error), "OK": make(chan error)}, entered: make(chan string, 10)}
	f := NewConn(c, ConnOptions{Timeout: time.Second, RetryInterval: time.Second})
	timeout := context.DeadlineExceeded
	var wg sync.WaitGroup
	for i := 0; i < FailuresToOpen; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			Do(f, context.Background(), OpClaim, 0, "LOST")
		}()
		<-c.entered
	}
	go func() { c.gates["OK"] <- nil }()
	if _, err := Do(f, context.Background(), OpRenew, 0, "OK"); err != nil {
		t.Fatal(err)
	}
	<-c.entered
	for i := 0; i < FailuresToOpen; i++ {
		c.gates["LOST"] <- timeout
	}
	wg.Wait()
	if !Up(f) {
		t.Fatalf("fleet down after %d timeouts of operations sent before Redis answered another, want up", FailuresToOpen)
	}
	for i := 0; i < FailuresToOpen; i++ {
		go func() { c.gates["LOST"] <- timeout }()
		Do(f, context.Background(), OpClaim, 0, "LOST")
		<-c.entered
	}
	if Up(f) {
		t.Errorf("fleet up after %d failures with no reply from Redis since each was sent, want down", FailuresToOpen)
	}
}
