package coretest

import (
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
)

// A follower on another replica and a replay from the fleet made no
// attempts, and their report header says so, not the leader's race.
func TestFleetReportHeaders(t *testing.T) {
	rig := newFleetRig(t, 3, func(c *config.Config) { c.ReportHeader = "Server-Timing" })
	a, b, c := rig.replicas[0], rig.replicas[1], rig.replicas[2]
	release := rig.upstream.hold("k-report", true)
	first := a.sendAsync(t, "k-report", "alice", chatBody)
	rig.upstream.waitStarted(t, "k-report")
	second := b.sendAsync(t, "k-report", "alice", chatBody)
	b.sink.waitClaim(t)
	release()
	ra, rb := recvAnswer(t, first), recvAnswer(t, second)
	if got := ra.header.Get("Server-Timing"); got == "" || got == `llmhedge;desc="joined attempts=0"` {
		t.Errorf("leader's Server-Timing = %q, want its race's report", got)
	}
	if got := rb.header.Get("Server-Timing"); got != `llmhedge;desc="joined attempts=0"` {
		t.Errorf("follower's Server-Timing = %q, want joined attempts=0", got)
	}
	rc := c.send(t, "k-report", "alice", chatBody)
	if rc.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("third replica: Idempotent-Replayed = %q, want true", rc.header.Get("Idempotent-Replayed"))
	}
	if got := rc.header.Get("Server-Timing"); got != `llmhedge;desc="replayed attempts=0"` {
		t.Errorf("replay's Server-Timing = %q, want replayed attempts=0", got)
	}
}
