package core

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// recordingTracer keeps what the engine tells a Tracer, for the test to
// read once the request has ended.
type recordingTracer struct {
	traces chan *recordedTrace
}

type recordedTrace struct {
	parent   string // the client's traceparent
	attempts []time.Time
	ended    chan *Report
}

func (rt *recordingTracer) Start(r *http.Request, start time.Time) Trace {
	t := &recordedTrace{parent: r.Header.Get("Traceparent"), ended: make(chan *Report, 1)}
	rt.traces <- t
	return t
}

// Attempt names attempt i's span 00000000000000a<i>.
func (t *recordedTrace) Attempt(index int, start time.Time) (string, string) {
	t.attempts = append(t.attempts, start)
	return "00-0af7651916cd43dd8448eb211c80319c-00000000000000a" + strconv.Itoa(index) + "-01", "vendor=kept"
}

func (t *recordedTrace) End(r *Report) { t.ended <- r }

func newTracedHarness(t *testing.T) (*harness, *recordingTracer) {
	rt := &recordingTracer{traces: make(chan *recordedTrace, 4)}
	hs := &harness{t: t, tr: newScriptTransport(), clock: newFakeClock(), reports: make(chan *Report, 64)}
	cfg := testConfig()
	cfg.Upstreams = append(cfg.Upstreams, testConfig().Upstreams[0])
	cfg.Upstreams[2].Name = "C"
	cfg.Upstreams[2].URL = "https://api.openai.com"
	cfg.Upstreams[1].Model = "b-model"
	cfg.MaxAttempts = 3
	h, err := New(cfg, Options{Transport: hs.tr, Clock: hs.clock, Tracer: rt})
	if err != nil {
		t.Fatal(err)
	}
	hs.h = h
	return hs, rt
}

// Each attempt carries its own span as the traceparent's parent (and the
// caller's tracestate), and the report handed to End describes every
// attempt: why it started, how it ended, when, and against what.
func TestTraceGivesEachAttemptItsOwnContext(t *testing.T) {
	hs, rt := newTracedHarness(t)
	req := chatRequest("")
	req.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	req.Header.Set("Tracestate", "vendor=client")
	out := hs.serve(req)
	a := hs.tr.next(t)
	a.respond(503, "application/json")
	a.end()
	b := hs.tr.next(t) // a retry at once: the primary failed
	b.respond(200, "text/event-stream")
	b.write(roleChunk)
	hs.clock.waitArmed(t, 2) // attempt 0's hedge timer, then the retry's
	hs.clock.Advance(100 * time.Millisecond)
	c := hs.tr.next(t) // a hedge after the delay
	c.respond(200, "text/event-stream")
	c.write(roleChunk + tokenChunk("C1") + "data: [DONE]\n\n")
	c.end()
	b.waitCancelled()
	if res := <-out; res.rec.Code != 200 {
		t.Fatalf("status %d, want 200", res.rec.Code)
	}
	for i, call := range []*call{a, b, c} {
		want := "00-0af7651916cd43dd8448eb211c80319c-00000000000000a" + strconv.Itoa(i) + "-01"
		if got := call.req.Header.Get("Traceparent"); got != want {
			t.Errorf("attempt %d sent traceparent %q, want %q (its own span as parent)", i, got, want)
		}
		if got := call.req.Header.Get("Tracestate"); got != "vendor=kept" {
			t.Errorf("attempt %d sent tracestate %q, want the Trace's %q", i, got, "vendor=kept")
		}
	}
	tr := <-rt.traces
	if tr.parent != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Errorf("Start saw traceparent %q, want the client's", tr.parent)
	}
	rep := <-tr.ended
	if len(tr.attempts) != 3 || len(rep.Attempts) != 3 {
		t.Fatalf("Attempt called %d times, %d attempts reported, want 3 and 3", len(tr.attempts), len(rep.Attempts))
	}
	if rep.Model != "gpt-x" {
		t.Errorf("rep.Model = %q, want \"gpt-x\"", rep.Model)
	}
	wantRoles := []string{RolePrimary, RoleRetry, RoleHedge}
	wantResults := []string{ResultFailed, ResultLost, ResultWon}
	for i, ar := range rep.Attempts {
		if ar.Role != wantRoles[i] || ar.Result != wantResults[i] {
			t.Errorf("attempt %d: role %q result %q, want %q %q", i, ar.Role, ar.Result, wantRoles[i], wantResults[i])
		}
		if ar.Ended < ar.Started {
			t.Errorf("attempt %d ended at %v, before it started at %v", i, ar.Ended, ar.Started)
		}
	}
	if got := rep.Attempts[0].ErrorType; got != "503" {
		t.Errorf("failed attempt's ErrorType = %q, want \"503\"", got)
	}
	if got := rep.Attempts[2].Ended; got != rep.Total {
		t.Errorf("winner's span ends at %v, want the request's end %v", got, rep.Total)
	}
	if rep.Attempts[1].Ended != 100*time.Millisecond {
		t.Errorf("loser's span ends at %v, want its cancellation at 100ms", rep.Attempts[1].Ended)
	}

	failed := AttemptSpanOf(rep, 0)
	if !failed.Failed || failed.Kind != SpanKindClient || failed.Name != SpanAttempt {
		t.Errorf("failed attempt's span: %+v, want a failed client span %q", failed, SpanAttempt)
	}
	attrs := attributeMap(failed.Attributes)
	for key, want := range map[string]string{"llmhedge.attempt.upstream": "A", "llmhedge.attempt.role": RolePrimary,
		"llmhedge.attempt.result": ResultFailed, "error.type": "503", "server.address": "a.test",
		"gen_ai.request.model": "gpt-x", "gen_ai.operation.name": "chat"} {
		if attrs[key] != want {
			t.Errorf("attempt 0 attribute %s = %v, want %q", key, attrs[key], want)
		}
	}
	if _, ok := attrs["gen_ai.provider.name"]; ok {
		t.Errorf("attempt 0 names provider %v for host a.test, want none", attrs["gen_ai.provider.name"])
	}
	won := attributeMap(AttemptSpanOf(rep, 2).Attributes)
	if won["gen_ai.provider.name"] != "openai" || won["server.port"] != int64(443) {
		t.Errorf("winner on api.openai.com: provider %v port %v, want openai 443", won["gen_ai.provider.name"], won["server.port"])
	}
	if lost := attributeMap(AttemptSpanOf(rep, 1).Attributes); lost["gen_ai.request.model"] != "b-model" {
		t.Errorf("attempt 1 model %v, want its upstream's rewrite b-model", lost["gen_ai.request.model"])
	}
	if AttemptSpanOf(rep, 1).Failed {
		t.Error("a lost attempt's span has an error status, want none: losing is not failing")
	}
	race := SpanOf(rep)
	ra := attributeMap(race.Attributes)
	if race.Failed || race.Kind != SpanKindInternal || race.Name != SpanRequest {
		t.Errorf("request span: %+v, want an ok internal span %q", race, SpanRequest)
	}
	if ra["llmhedge.winner_attempt"] != int64(2) || ra["llmhedge.attempts"] != int64(3) || ra["llmhedge.outcome"] != OutcomeOK {
		t.Errorf("request span winner %v attempts %v outcome %v, want 2, 3, ok", ra["llmhedge.winner_attempt"], ra["llmhedge.attempts"], ra["llmhedge.outcome"])
	}
	if !race.End.Equal(rep.Start.Add(rep.Total)) {
		t.Errorf("request span ends %v, want start+total %v", race.End, rep.Start.Add(rep.Total))
	}
}

// An untraced request sends the client's trace headers unchanged.
func TestUntracedAttemptsKeepTheClientsTraceHeaders(t *testing.T) {
	hs := newHarness(t, testConfig())
	req := chatRequest("")
	req.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	out := hs.serve(req)
	a := hs.tr.next(t)
	if got := a.req.Header.Get("Traceparent"); got != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Errorf("traceparent %q, want the client's", got)
	}
	a.fail(errors.New("refused"))
	b := hs.tr.next(t)
	b.respond(200, "text/event-stream")
	b.write(roleChunk + tokenChunk("B1"))
	b.end()
	<-out
}

// A replayed key's request span says so, with the key's hash, never the key.
func TestTraceOfAReplayedKey(t *testing.T) {
	hs, rt := newTracedHarness(t)
	send := func(upstreamAnswers bool) *Report {
		req := chatRequest("")
		req.Header.Set("Idempotency-Key", "secret-key-1")
		out := hs.serve(req)
		if upstreamAnswers {
			a := hs.tr.next(t)
			a.respond(200, "text/event-stream")
			a.write(roleChunk + tokenChunk("A1") + "data: [DONE]\n\n")
			a.end()
		}
		<-out
		tr := <-rt.traces
		rep := <-tr.ended
		return rep
	}
	first := send(true)
	second := send(false)
	if n := hs.tr.count(); n != 1 {
		t.Fatalf("%d upstream attempts for a key sent twice, want 1 (the second replayed)", n)
	}
	a1, a2 := attributeMap(SpanOf(first).Attributes), attributeMap(SpanOf(second).Attributes)
	if a1["llmhedge.idempotency"] != IdempotencyLed || a2["llmhedge.idempotency"] != IdempotencyReplayed {
		t.Errorf("idempotency %v then %v, want led then replayed", a1["llmhedge.idempotency"], a2["llmhedge.idempotency"])
	}
	if a2["llmhedge.idempotency_key_hash"] != KeyHash("secret-key-1") {
		t.Errorf("key hash %v, want KeyHash of the key", a2["llmhedge.idempotency_key_hash"])
	}
	for _, f := range SpanOf(second).Attributes {
		if strings.Contains(f.Str, "secret-key-1") || strings.Contains(strings.Join(f.Strs, " "), "secret-key-1") {
			t.Errorf("attribute %s carries the idempotency key itself", f.Key)
		}
	}
}

// attributeMap reads span attributes as key -> value.
func attributeMap(fields []LogField) map[string]interface{} {
	m := make(map[string]interface{})
	for _, f := range fields {
		switch f.Kind {
		case LogString:
			m[f.Key] = f.Str
		case LogInt:
			m[f.Key] = f.Int
		case LogBool:
			m[f.Key] = f.Bool
		case LogMillis:
			m[f.Key] = f.Millis
		case LogStrings:
			m[f.Key] = f.Strs
		}
	}
	return m
}

// With idempotency off a client's key is passed on but not kept: the
// report names no idempotency outcome (it would say "led" otherwise).
func TestNoIdempotencyOutcomeWhenIdempotencyIsOff(t *testing.T) {
	cfg := testConfig()
	cfg.Idempotency.TTL = config.Duration(-1)
	hs := newHarness(t, cfg)
	req := chatRequest("")
	req.Header.Set("Idempotency-Key", "k-off")
	out := hs.serve(req)
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(roleChunk + tokenChunk("A1") + "data: [DONE]\n\n")
	a.end()
	<-out
	rep := <-hs.reports
	if rep.Idempotency != "" {
		t.Errorf("rep.Idempotency = %q with idempotency off, want none", rep.Idempotency)
	}
	for _, f := range ReportLogFields(rep) {
		if f.Key == "idempotency" {
			t.Errorf("log field idempotency = %q with idempotency off, want none", f.Str)
		}
	}
}

// panickingWriter panics on the first body write, as a handler's abort
// does.
type panickingWriter struct{ http.ResponseWriter }

func (w panickingWriter) Write([]byte) (int, error) { panic(http.ErrAbortHandler) }

// A request whose handler panics still ends its spans, marked cut.
func TestTraceEndsWhenTheHandlerPanics(t *testing.T) {
	hs, rt := newTracedHarness(t)
	done := make(chan interface{}, 1)
	go func() {
		defer func() { done <- recover() }()
		hs.h.Handle(panickingWriter{httptest.NewRecorder()}, chatRequest(""))
	}()
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(roleChunk + tokenChunk("A1"))
	if got := <-done; got == nil {
		t.Fatal("Handle returned, want the writer's panic") // (under Yaegi recover's value is the interpreter's)
	}
	a.end()
	tr := <-rt.traces
	rep := <-tr.ended
	if d := SpanOf(rep); !d.Failed || d.ErrorMessage != OutcomeCut {
		t.Errorf("request span after a panic: failed %v, message %q, want failed %q", d.Failed, d.ErrorMessage, OutcomeCut)
	}
	if len(tr.attempts) != 1 {
		t.Errorf("Attempt called %d times, want 1", len(tr.attempts))
	}
}
