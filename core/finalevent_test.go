package core

import (
	"testing"
	"time"
)

// Streams whose only answer is a final event, with no visible output: a
// reasoning model that spent its budget on hidden reasoning, or a content
// filter. Each is a complete answer.
var finalOnlyStreams = []struct{ name, contentType, stream string }{
	{"chat length", "text/event-stream", roleChunk +
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n" + "data: [DONE]\n\n"},
	{"chat content filter", "text/event-stream", roleChunk +
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"content_filter\"}]}\n\n" + "data: [DONE]\n\n"},
	{"responses incomplete", "text/event-stream",
		"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n\n" +
			"event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"}}}\n\n"},
	{"responses completed", "text/event-stream",
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\"}}\n\n"},
	{"anthropic max_tokens", "text/event-stream",
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":0}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
	{"ollama done", "application/x-ndjson",
		"{\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"length\"}\n"},
}

// A final event decides the race as output does: the answer goes to the
// client at once, from the first attempt, and its upstream counts as
// healthy. (One attempt allowed: a retry would be a failure of the test,
// not a hang.)
func TestFinalEventWithoutOutputWins(t *testing.T) {
	for _, c := range finalOnlyStreams {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.MaxAttempts = 1
			cfg.Budget.BreakerFailures = 1
			hs := newHarness(t, cfg)
			out := hs.serve(chatRequest(""))
			a := hs.tr.next(t)
			a.respond(200, c.contentType)
			a.write(c.stream)
			a.end()
			res := <-out
			if res.rec.Code != 200 {
				t.Fatalf("status = %d, want 200 (body %q)", res.rec.Code, bodyOf(res))
			}
			if got := bodyOf(res); got != c.stream {
				t.Fatalf("body = %q, want the upstream's %q", got, c.stream)
			}
			rep := <-hs.reports
			if rep.Winner != 0 {
				t.Fatalf("rep.Winner = %v, want 0", rep.Winner)
			} else if rep.Outcome != OutcomeOK {
				t.Fatalf("rep.Outcome = %v, want %v", rep.Outcome, OutcomeOK)
			}
			if !healthy(hs.h.state.health[0], hs.clock.Now()) {
				t.Fatal("the answering upstream's breaker opened")
			}
		})
	}
}

// A stream that ends (or sends [DONE]) with neither output nor a final
// event loses the race and a retry starts; but when every attempt fails,
// that complete 2xx answer goes to the client rather than another
// upstream's error, and it does not count against its upstream's breaker.
func TestCompleteAnswerOutranksErrors(t *testing.T) {
	for name, empty := range map[string]string{
		"[DONE]":        roleChunk + ping + "data: [DONE]\n\n",
		"ended":         roleChunk,
		"empty body":    "",
		"after a fatal": roleChunk + "data: [DONE]\n\n",
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Budget.BreakerFailures = 1
			hs := newHarness(t, cfg)
			out := hs.serve(chatRequest(""))
			a := hs.tr.next(t)
			if name == "after a fatal" {
				// The primary's 401 is held while the hedge runs.
				hs.clock.waitArmed(t, 1)
				hs.clock.Advance(100 * time.Millisecond)
			}
			var b *call
			if name == "after a fatal" {
				b = hs.tr.next(t)
				a.respond(401, "application/json")
				a.write(`{"error":{"message":"bad key"}}`)
				a.end()
				a, b = b, a
			}
			a.respond(200, "text/event-stream", "X-Upstream", "a")
			if empty != "" {
				a.write(empty)
			}
			a.end()
			if name != "after a fatal" {
				b = hs.tr.next(t) // the retry, at once
				b.respond(503, "application/json", "Retry-After", "1")
				b.write(`{"error":{"message":"overloaded"}}`)
				b.end()
			}
			res := <-out
			if res.rec.Code != 200 {
				t.Fatalf("status = %d, want 200 (body %q)", res.rec.Code, bodyOf(res))
			}
			if got := bodyOf(res); got != empty {
				t.Fatalf("body = %q, want the complete answer %q", got, empty)
			}
			if got := res.rec.Header().Get("X-Upstream"); got != "a" {
				t.Fatalf("X-Upstream = %q, want a (the complete answer's headers)", got)
			}
			if got := res.rec.Header().Get("Content-Type"); got != "text/event-stream" {
				t.Fatalf("Content-Type = %q, want text/event-stream", got)
			}
			rep := <-hs.reports
			if rep.Status != 200 {
				t.Fatalf("report Status = %d, want 200", rep.Status)
			}
			up := 0
			if name == "after a fatal" {
				up = 1
			}
			if !healthy(hs.h.state.health[up], hs.clock.Now()) {
				t.Fatal("the complete answer opened its upstream's breaker")
			}
		})
	}
}
