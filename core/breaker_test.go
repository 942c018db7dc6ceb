package core

import (
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// breakerConfig opens upstream A's breaker after 2 failures for 5 s; one
// attempt per request unless the test says otherwise.
func breakerConfig(attempts int) config.Config {
	cfg := testConfig()
	cfg.Budget.BreakerFailures = 2
	cfg.Budget.BreakerOpen = config.Duration(5 * time.Second)
	cfg.MaxAttempts = attempts
	return cfg
}

// startOn starts a request and returns its first attempt, which must go
// to host.
func startOn(t *testing.T, hs *harness, host string) (chan served, *call) {
	t.Helper()
	out := hs.serve(chatRequest(""))
	c := hs.tr.next(t)
	if c.req.URL.Host != host {
		t.Fatalf("attempt went to %s, want %s", c.req.URL.Host, host)
	}
	return out, c
}

// win answers c with a streamed token and waits for its request's end.
func win(hs *harness, c *call, out chan served) {
	c.respond(200, "text/event-stream")
	c.write(tokenChunk("x"))
	c.end()
	<-out
	<-hs.reports
}

// failWith500 answers c with a 500. When the request has another attempt
// left, its retry must go to B, and wins.
func failWith500(t *testing.T, hs *harness, c *call, out chan served) {
	t.Helper()
	c.respond(500, "application/json")
	c.end()
	if hs.h.cfg.MaxAttempts > 1 {
		retry := hs.tr.next(t)
		if retry.req.URL.Host != "b.test" {
			t.Fatalf("retry went to %s, want b.test", retry.req.URL.Host)
		}
		win(hs, retry, out)
		return
	}
	<-out
	<-hs.reports
}

// openBreakerOfA fails two requests on A, which opens its breaker.
func openBreakerOfA(t *testing.T, hs *harness) {
	t.Helper()
	for i := 0; i < 2; i++ {
		out, c := startOn(t, hs, "a.test")
		failWith500(t, hs, c, out)
	}
	out, c := startOn(t, hs, "b.test")
	win(hs, c, out)
}

// After the open time one attempt probes the failed upstream; while it is
// in flight every other request goes elsewhere. Its success closes the
// breaker for everyone.
func TestBreakerHalfOpenSendsOneProbe(t *testing.T) {
	hs := newHarness(t, breakerConfig(1))
	openBreakerOfA(t, hs)
	hs.clock.Advance(5 * time.Second)
	probeOut, probe := startOn(t, hs, "a.test")
	toA := 0
	for i := 0; i < 20; i++ {
		out := hs.serve(chatRequest(""))
		c := hs.tr.next(t)
		if c.req.URL.Host == "a.test" {
			toA++
		}
		win(hs, c, out)
	}
	if toA != 0 {
		t.Fatalf("%d of 20 requests went to A while its probe was in flight, want 0", toA)
	}
	win(hs, probe, probeOut)
	// Closed: two requests at once both go to A.
	out1, c1 := startOn(t, hs, "a.test")
	out2, c2 := startOn(t, hs, "a.test")
	win(hs, c1, out1)
	win(hs, c2, out2)
}

// A failed probe opens the breaker again for twice as long as before.
func TestBreakerFailedProbeDoublesOpenTime(t *testing.T) {
	hs := newHarness(t, breakerConfig(1))
	openBreakerOfA(t, hs)
	hs.clock.Advance(5 * time.Second)
	out, probe := startOn(t, hs, "a.test")
	failWith500(t, hs, probe, out)
	// Open for 10 s now.
	hs.clock.Advance(5 * time.Second)
	out, c := startOn(t, hs, "b.test")
	win(hs, c, out)
	hs.clock.Advance(5 * time.Second)
	out, probe = startOn(t, hs, "a.test")
	failWith500(t, hs, probe, out)
	// Open for 20 s now.
	hs.clock.Advance(19 * time.Second)
	out, c = startOn(t, hs, "b.test")
	win(hs, c, out)
	hs.clock.Advance(time.Second)
	out, probe = startOn(t, hs, "a.test")
	win(hs, probe, out)
	// The success closed it: the next failure alone does not open it.
	out, c = startOn(t, hs, "a.test")
	failWith500(t, hs, c, out)
	out, c = startOn(t, hs, "a.test")
	win(hs, c, out)
}
