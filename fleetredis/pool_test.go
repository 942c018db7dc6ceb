package fleetredis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/redis/go-redis/v9"

	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
)

// waitBlocked waits until srv counts want blocked clients (INFO clients),
// failing with the last count at the deadline.
func waitBlocked(t *testing.T, probe *Client, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		v, err := do(t, probe, "INFO", "clients")
		if err == nil {
			for _, line := range strings.Split(v.Str, "\n") {
				if strings.HasPrefix(line, "blocked_clients:") {
					last = strings.TrimSpace(strings.TrimPrefix(line, "blocked_clients:"))
				}
			}
			if last == strconv.Itoa(want) {
				return
			}
		}
		time.Sleep(5 * time.Millisecond) // polling interval, bounded by deadline
	}
	t.Fatalf("blocked_clients = %s, want %d", last, want)
}

// Followers' blocking reads fill their own pool, never the main one: with
// every blocking connection held by an XREAD BLOCK, a claim still runs at
// once, and one more blocking read waits for a connection until its
// deadline and then fails with fleetstore.ErrRedisBusy (not a Redis failure).
func TestBlockingReadsHaveTheirOwnPool(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	const blocking = 8
	c, err := NewWith(config.FleetConfig{URL: srv.URL()}, Settings{PoolSize: 2, BlockingPoolSize: blocking})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	probe, err := New(config.FleetConfig{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, blocking)
	for i := 0; i < blocking; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := c.Do(ctx, "XREAD", "COUNT", "10", "BLOCK", "25000", "STREAMS", "{f}:stream", "$")
			if err == nil && v.Kind != fleetstore.RedisArray {
				err = errors.New("XREAD returned kind " + strconv.Itoa(int(v.Kind)) + ", want the entry")
			}
			errs <- err
		}()
	}
	waitBlocked(t, probe, blocking)

	// A claim on the main pool: within 2 s, far under the reads' 25 s.
	claimCtx, claimCancel := context.WithTimeout(context.Background(), 2*time.Second)
	v, err := c.Do(claimCtx, "SET", "{f}:lease", "holder", "NX", "PX", "2000")
	claimCancel()
	if err != nil || v.Str != "OK" {
		t.Fatalf("claim with the blocking pool full: %+v, %v; want OK", v, err)
	}
	ps, err := c.Pipeline(ctx, [][]string{{"PEXPIRE", "{f}:lease", "2000"}, {"GET", "{f}:lease"}})
	if err != nil || len(ps) != 2 || ps[1].Str != "holder" {
		t.Fatalf("renewal pipeline with the blocking pool full: %+v, %v", ps, err)
	}

	// One read more: no connection free by its deadline.
	busyCtx, busyCancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err = c.Do(busyCtx, "XREAD", "BLOCK", "50", "STREAMS", "{f}:stream", "$")
	busyCancel()
	if !errors.Is(err, fleetstore.ErrRedisBusy) {
		t.Fatalf("blocking read with the pool full: %v, want an error wrapping fleetstore.ErrRedisBusy", err)
	}
	// A non-blocking read is no follower: the main pool.
	if _, err := c.Do(ctx, "XREAD", "COUNT", "1", "STREAMS", "{f}:stream", "0-0"); err != nil {
		t.Fatalf("non-blocking XREAD with the blocking pool full: %v", err)
	}

	if _, err := c.Do(ctx, "XADD", "{f}:stream", "*", "t", "d"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("blocked read: %v", err)
		}
	}
}

// The main pool is bounded too: commands past PoolSize wait, and one that
// finds none free by its deadline is ErrRedisBusy. A pool timeout inside
// go-redis maps to it as well.
func TestMainPoolBusy(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c, err := NewWith(config.FleetConfig{URL: srv.URL()}, Settings{PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := do(t, c, "PING"); err != nil { // the cluster check is done
		t.Fatal(err)
	}
	release, err := take(context.Background(), c.mainTurns, c.name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = c.Do(ctx, "GET", "k")
	cancel()
	release()
	if !errors.Is(err, fleetstore.ErrRedisBusy) || !strings.Contains(err.Error(), srv.Addr()) {
		t.Fatalf("command with no turn free: %v, want ErrRedisBusy naming %s", err, srv.Addr())
	}
	if _, err := do(t, c, "GET", "k"); err != nil {
		t.Fatalf("after the turn came back: %v", err)
	}
	if err := c.observe(context.Background(), c.main, redis.ErrPoolTimeout); !errors.Is(err, fleetstore.ErrRedisBusy) {
		t.Fatalf("go-redis pool timeout maps to %v, want ErrRedisBusy", err)
	}
	gone, cancelGone := context.WithCancel(context.Background())
	cancelGone()
	if _, err := take(gone, make(chan struct{}), "x"); errors.Is(err, fleetstore.ErrRedisBusy) || !errors.Is(err, context.Canceled) {
		t.Fatalf("a caller that left: %v, want context.Canceled, not busy", err)
	}
}

func TestIsBlockingRead(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"XREAD", "COUNT", "512", "BLOCK", "100", "STREAMS", "s", "0-0"}, true},
		{[]string{"xread", "block", "0", "streams", "s", "$"}, true},
		{[]string{"XREADGROUP", "GROUP", "g", "c", "BLOCK", "5", "STREAMS", "s", ">"}, true},
		{[]string{"XREAD", "COUNT", "512", "STREAMS", "s", "0-0"}, false},
		{[]string{"XREAD", "STREAMS", "BLOCK", "0-0"}, false}, // a stream named BLOCK
		{[]string{"GET", "BLOCK"}, false},
		{nil, false},
	} {
		if got := isBlockingRead(c.args); got != c.want {
			t.Errorf("isBlockingRead(%q) = %v, want %v", c.args, got, c.want)
		}
	}
}

// The blocking pool is as large as the fleet's max_followers (a replica's
// followers never wait for a connection), unless the settings say.
func TestBlockingPoolFollowsMaxFollowers(t *testing.T) {
	for _, c := range []struct {
		cfg  config.FleetConfig
		s    Settings
		want int
	}{
		{config.FleetConfig{URL: "redis://127.0.0.1:1/0"}, Settings{}, 512},
		{config.FleetConfig{URL: "redis://127.0.0.1:1/0", MaxFollowers: 40}, Settings{}, 40},
		{config.FleetConfig{URL: "redis+cluster://127.0.0.1:1/", MaxFollowers: 40}, Settings{BlockingPoolSize: 7}, 7},
	} {
		cl, err := NewWith(c.cfg, c.s)
		if err != nil {
			t.Fatal(err)
		}
		if got := cap(cl.blockTurns); got != c.want {
			t.Errorf("max_followers %d, settings %d: blocking pool %d, want %d", c.cfg.MaxFollowers, c.s.BlockingPoolSize, got, c.want)
		}
		cl.Close()
	}
}
