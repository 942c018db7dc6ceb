package core

import (
	"context"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// A probe cancelled because its client left frees the probe slot: the
// next request probes again.
func TestBreakerProbeCancelledByClientFreesSlot(t *testing.T) {
	hs := newHarness(t, breakerConfig(1))
	openBreakerOfA(t, hs)
	hs.clock.Advance(5 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	out := hs.serve(chatRequest("").WithContext(ctx))
	probe := hs.tr.next(t)
	if probe.req.URL.Host != "a.test" {
		t.Fatalf("probe went to %s, want a.test", probe.req.URL.Host)
	}
	cancel()
	probe.waitCancelled()
	<-out
	if rep := <-hs.reports; rep.Outcome != OutcomeClientGone {
		t.Fatalf("outcome %q, want %q", rep.Outcome, OutcomeClientGone)
	}
	out, probe = startOn(t, hs, "a.test")
	win(hs, probe, out)
}

// A probe that loses to a hedge on another upstream frees the probe slot.
func TestBreakerProbeLostToHedgeFreesSlot(t *testing.T) {
	hs := newHarness(t, breakerConfig(2))
	openBreakerOfA(t, hs)
	hs.clock.Advance(5 * time.Second)
	hs.clock.drainArmed()
	out, probe := startOn(t, hs, "a.test")
	hs.clock.waitArmed(t, 1)
	hs.clock.Advance(hs.h.CurrentDelay())
	hedge := hs.tr.next(t)
	if hedge.req.URL.Host != "b.test" {
		t.Fatalf("hedge went to %s, want b.test", hedge.req.URL.Host)
	}
	win(hs, hedge, out)
	probe.waitCancelled()
	out, probe = startOn(t, hs, "a.test")
	win(hs, probe, out)
}

// Each failed probe doubles the open time, up to five minutes, or the
// configured open time when that is longer.
func TestBreakerOpenTimeDoublesUpToCap(t *testing.T) {
	cases := []struct {
		open time.Duration
		want []time.Duration // open time after each failed probe
	}{
		{time.Minute, []time.Duration{2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute}},
		{10 * time.Minute, []time.Duration{10 * time.Minute, 10 * time.Minute}},
	}
	for _, c := range cases {
		cfg := &config.BudgetConfig{BreakerFailures: 1, BreakerOpen: config.Duration(c.open)}
		u := &upstreamHealth{}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		recordFailure(u, now, 0, 0, cfg)
		openFor := c.open
		for i, want := range c.want {
			if _, ok := admit(u, now.Add(openFor-time.Nanosecond)); ok {
				t.Fatalf("open %v, probe %d: admitted before the open time %v passed", c.open, i, openFor)
			}
			now = now.Add(openFor)
			probe, ok := admit(u, now)
			if !ok || probe == 0 {
				t.Fatalf("open %v, probe %d: admitted %v with ticket %d, want a probe", c.open, i, ok, probe)
			}
			if _, ok := admit(u, now); ok {
				t.Fatalf("open %v, probe %d: a second attempt was admitted while the probe is in flight", c.open, i)
			}
			recordFailure(u, now, 0, probe, cfg)
			if _, ok := admit(u, now.Add(want-time.Nanosecond)); ok {
				t.Fatalf("open %v, failed probe %d: open for less than %v", c.open, i, want)
			}
			openFor = want
		}
	}
}

// Releasing a probe frees its slot once; an old ticket can neither free
// the slot of a newer probe nor close the breaker.
func TestBreakerReleaseProbeOnce(t *testing.T) {
	cfg := &config.BudgetConfig{BreakerFailures: 1, BreakerOpen: config.Duration(time.Second)}
	u := &upstreamHealth{}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	recordFailure(u, now, 0, 0, cfg)
	now = now.Add(time.Second)
	first, _ := admit(u, now)
	releaseProbe(u, first)
	second, ok := admit(u, now)
	if !ok {
		t.Fatalf("after the release: admitted %v with ticket %d, want a new probe", ok, second)
	} else if second == 0 {
		t.Fatalf("after the release: second = 0, want != 0")
	} else if second == first {
		t.Fatalf("after the release: second = %v, want a value other than first", second)
	}
	releaseProbe(u, first)
	if healthy(u, now) {
		t.Fatal("an old ticket freed the slot of the probe in flight")
	}
	recordSuccess(u, first)
	if healthy(u, now) {
		t.Fatal("an old probe's success closed the breaker while a newer probe is in flight")
	}
	recordSuccess(u, second)
	if p, ok := admit(u, now); !ok {
		t.Fatalf("after the probe's success: admitted %v with ticket %d, want an ordinary attempt", ok, p)
	} else if p != 0 {
		t.Fatalf("after the probe's success: p = %v, want 0", p)
	}
}

// While the breaker is open, the success of an attempt sent before it
// opened does not close it: only a probe does.
func TestBreakerOpenIgnoresOrdinarySuccess(t *testing.T) {
	cfg := &config.BudgetConfig{BreakerFailures: 2, BreakerOpen: config.Duration(time.Second)}
	u := &upstreamHealth{}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	recordFailure(u, now, 0, 0, cfg)
	recordFailure(u, now, 0, 0, cfg)
	recordSuccess(u, 0)
	if healthy(u, now) {
		t.Fatal("an ordinary attempt's success closed the open breaker")
	}
	probe, ok := admit(u, now.Add(time.Second))
	if !ok {
		t.Fatalf("after the open time: admitted %v with ticket %d, want a probe", ok, probe)
	} else if probe == 0 {
		t.Fatalf("after the open time: probe = 0, want != 0")
	}
}
