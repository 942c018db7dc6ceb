package core

import (
	"testing"
	"time"
)

// A pass-through request (here opted out) to a half-open upstream is not
// its probe: while it streams, a hedged request still probes that
// upstream, and the probe's success closes the breaker.
func TestBreakerPassThroughDoesNotTakeProbe(t *testing.T) {
	hs := newHarness(t, breakerConfig(1))
	openBreakerOfA(t, hs)
	hs.clock.Advance(5 * time.Second)
	r := chatRequest("")
	r.Header.Set(HeaderHedge, "off")
	passOut := hs.serve(r)
	pass := hs.tr.next(t)
	if pass.req.URL.Host != "a.test" {
		t.Fatalf("pass-through went to %s, want a.test", pass.req.URL.Host)
	}
	pass.respond(200, "text/event-stream")
	pass.write(tokenChunk("x")) // streaming on
	out, probe := startOn(t, hs, "a.test")
	win(hs, probe, out)
	pass.end()
	<-passOut
	<-hs.reports
	// Closed: two requests at once both go to A.
	out1, c1 := startOn(t, hs, "a.test")
	out2, c2 := startOn(t, hs, "a.test")
	win(hs, c1, out1)
	win(hs, c2, out2)
}

// A 200 stream that ended cleanly without any event says nothing good
// about its upstream: as a probe it neither closes the breaker nor opens
// it again; the next attempt probes.
func TestBreakerEmptyAnswerProbeDoesNotClose(t *testing.T) {
	for _, c := range []struct{ name, body string }{
		{"ended", ""},
		{"done", "data: [DONE]\n\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			hs := newHarness(t, breakerConfig(1))
			openBreakerOfA(t, hs)
			hs.clock.Advance(5 * time.Second)
			out, probe := startOn(t, hs, "a.test")
			probe.respond(200, "text/event-stream")
			if c.body != "" {
				probe.write(c.body)
			}
			probe.end()
			<-out
			if rep := <-hs.reports; rep.Outcome != OutcomeUpstreamError {
				t.Fatalf("outcome %q, want %q", rep.Outcome, OutcomeUpstreamError)
			}
			// Still half-open: the next request is the probe, and while it
			// is in flight another goes to B.
			out, probe = startOn(t, hs, "a.test")
			out2, other := startOn(t, hs, "b.test")
			win(hs, other, out2)
			win(hs, probe, out)
		})
	}
}
