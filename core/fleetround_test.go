package core

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// heldPublishes answers every command at once, except a publish of health
// events (a script whose first key is a health key): that one posts its
// release channel on held and waits for it to be closed.
type heldPublishes struct {
	held chan chan struct{}
}

func (c *heldPublishes) Do(ctx context.Context, args ...string) (fleetstore.RedisValue, error) {
	if len(args) > 3 && (args[0] == "EVALSHA" || args[0] == "EVAL") && strings.HasSuffix(args[3], ":health") {
		release := make(chan struct{})
		c.held <- release
		<-release
		return fleetstore.RedisValue{Kind: fleetstore.RedisInt, Int: 1}, nil
	}
	return fleetstore.RedisValue{Kind: fleetstore.RedisNil}, nil
}

func (c *heldPublishes) Pipeline(ctx context.Context, cmds [][]string) ([]fleetstore.RedisValue, error) {
	return make([]fleetstore.RedisValue, len(cmds)), nil
}

// A round of the sync loop waits for the publisher's batch on the wire,
// never for the publisher to run dry: while 429s keep coming (here a new
// health event before each publish is let through, so the publisher never
// runs dry) the round still ends. A round that waited for the publisher to
// stop would wait until the feeder gives up (maxBatches), and the switch,
// the budget and the heartbeat would stall with it.
func TestFleetRoundWaitsForOneBatchOnly(t *testing.T) {
	const maxBatches = 100000
	client := &heldPublishes{held: make(chan chan struct{})}
	f := NewFleet(client, config.FleetConfig{URL: "redis://redis:6379/0"}, FleetOptions{})
	key := fleetstore.HealthKey(f.cfg.Prefix, "r")
	fleetPublish(f, key, "cool:A", time.Second)
	first := <-client.held // the publisher's batch is on the wire
	fleetPublish(f, key, "cool:B", time.Second)

	var roundDone, gaveUp atomic.Bool
	fed := make(chan int)
	go func() {
		// The feeder: before each publish is let through, another event,
		// until the round is done (or maxBatches, a bound on a failure).
		n := 0
		release := first
		for {
			if !roundDone.Load() && n < maxBatches {
				fleetPublish(f, key, "cool:C", time.Second)
			} else if n >= maxBatches {
				gaveUp.Store(true)
			}
			close(release)
			n++
			next, ok := <-client.held
			if !ok {
				fed <- n
				return
			}
			release = next
		}
	}()
	fleetRound(f)
	roundDone.Store(true)
	if gaveUp.Load() {
		t.Errorf("the round ended only after the publisher ran dry (%d batches fed), want it to end after the batch on the wire and its own", maxBatches)
	}
	// The feeder stops feeding: the publisher runs dry and the fleet stops.
	f.Close()
	close(client.held)
	<-fed
}
