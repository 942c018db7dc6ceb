package core

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// gateClient answers each command when the test sends its outcome on the
// gate named by the command's first argument (nil: an OK reply); entered
// gets each command as it arrives.
type gateClient struct {
	gates   map[string]chan error
	entered chan string
}

func (c *gateClient) Do(ctx context.Context, args ...string) (fleetstore.RedisValue, error) {
	c.entered <- args[0]
	if err := <-c.gates[args[0]]; err != nil {
		return fleetstore.RedisValue{}, err
	}
	return fleetstore.RedisValue{Kind: fleetstore.RedisString, Str: "OK"}, nil
}

func (c *gateClient) Pipeline(ctx context.Context, cmds [][]string) ([]fleetstore.RedisValue, error) {
	return nil, errors.New("gateClient: no pipelines")
}

// The breaker opens on Redis' silence, not on a burst of timeouts: three
// operations that time out after Redis answered another one sent after
// them (a replica too busy to read their replies in time) leave the fleet
// up; three failures with no reply since each was sent take it down.
func TestFleetBreakerOpensOnSilenceOnly(t *testing.T) {
	c := &gateClient{gates: map[string]chan error{"LOST": make(chan error), "OK": make(chan error)}, entered: make(chan string, 10)}
	f := NewFleet(c, config.FleetConfig{URL: "redis://127.0.0.1:1/0"}, FleetOptions{})
	timeout := context.DeadlineExceeded
	var wg sync.WaitGroup
	for i := 0; i < fleetFailuresToOpen; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fleetDo(f, context.Background(), fleetOpClaim, 0, "LOST")
		}()
		<-c.entered
	}
	go func() { c.gates["OK"] <- nil }()
	if _, err := fleetDo(f, context.Background(), fleetOpRenew, 0, "OK"); err != nil {
		t.Fatal(err)
	}
	<-c.entered
	for i := 0; i < fleetFailuresToOpen; i++ {
		c.gates["LOST"] <- timeout
	}
	wg.Wait()
	if !f.Up() {
		t.Fatalf("fleet down after %d timeouts of operations sent before Redis answered another, want up", fleetFailuresToOpen)
	}
	for i := 0; i < fleetFailuresToOpen; i++ {
		go func() { c.gates["LOST"] <- timeout }()
		fleetDo(f, context.Background(), fleetOpClaim, 0, "LOST")
		<-c.entered
	}
	if f.Up() {
		t.Errorf("fleet up after %d failures with no reply from Redis since each was sent, want down", fleetFailuresToOpen)
	}
}
