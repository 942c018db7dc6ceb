package core

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// schemaRequest is a non-streaming Chat request that asks for {"city": string}.
// answerSchema is the schema of the validity tests' answers.
const answerSchema = `{"type":"object","required":["city"],"properties":{"city":{"type":"string"}},"additionalProperties":false}`

func schemaRequest(stream bool) *http.Request {
	body := `{"model":"m","stream":` + map[bool]string{true: "true", false: "false"}[stream] +
		`,"messages":[],"response_format":{"type":"json_schema","json_schema":{"name":"c","schema":` + answerSchema + `}}}`
	return chatRequest(body)
}

func chatAnswer(content, finish string) string {
	b, _ := json.Marshal(content)
	return `{"choices":[{"index":0,"message":{"role":"assistant","content":` + string(b) + `},"finish_reason":"` + finish + `"}]}`
}

const finishChunk = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"

func validatedConfig(checks ...string) config.Config {
	cfg := testConfig()
	cfg.ValidateChecks = checks
	return cfg
}

// A fast answer that breaks the request's schema does not win: the next
// attempt starts at once (no hedge delay), its valid answer wins, and the
// invalid one counts as invalid in the report, without opening the breaker.
func TestInvalidAnswerRetriedAtOnce(t *testing.T) {
	cfg := validatedConfig(config.ValidateJSONSchema)
	cfg.Budget.BreakerFailures = 1
	hs := newHarness(t, cfg)
	out := hs.serve(schemaRequest(false))
	a := hs.tr.next(t)
	a.respond(200, "application/json")
	a.write(chatAnswer(`{"city":42}`, "stop"))
	a.end()
	b := hs.tr.next(t) // no clock advance: started at once
	if b.req.URL.Host != "b.test" {
		t.Fatalf("second attempt went to %q, want b.test", b.req.URL.Host)
	}
	valid := chatAnswer(`{"city":"Paris"}`, "stop")
	b.respond(200, "application/json")
	b.write(valid)
	b.end()
	res := <-out
	if got := bodyOf(res); got != valid {
		t.Fatalf("body = %q, want B's %q", got, valid)
	} else if h := res.rec.Header().Get(HeaderValidation); h != "" {
		t.Fatalf("%s = %q on a valid answer, want none", HeaderValidation, h)
	}
	rep := <-hs.reports
	if rep.Winner != 1 {
		t.Fatalf("rep.Winner = %d, want 1", rep.Winner)
	} else if rep.Attempts[0].Result != ResultInvalid {
		t.Fatalf("attempt 0 result = %q, want %q", rep.Attempts[0].Result, ResultInvalid)
	} else if rep.Attempts[0].Invalid != config.ValidateJSONSchema {
		t.Fatalf("attempt 0 invalid check = %q, want %q", rep.Attempts[0].Invalid, config.ValidateJSONSchema)
	} else if !strings.Contains(rep.Attempts[0].Error, "$.city: got number 42, want string") {
		t.Fatalf("attempt 0 error = %q, want the wrong value named", rep.Attempts[0].Error)
	} else if rep.Attempts[1].Role != RoleRetry {
		t.Fatalf("attempt 1 role = %q, want %q", rep.Attempts[1].Role, RoleRetry)
	} else if rep.Validation != ValidationPassed {
		t.Fatalf("rep.Validation = %q, want %q", rep.Validation, ValidationPassed)
	}
	// One failure opens the breaker on this route; an invalid answer is none.
	if open := upstreamOpen(hs.h, 0); open {
		t.Fatal("upstream A's breaker opened after an invalid answer")
	}
	sink := &recordingSink{}
	ReportMetrics(rep, sink)
	if got := sink.count(MetricInvalid, "default", "A", config.ValidateJSONSchema); got != 1 {
		t.Fatalf("llm_hedge_invalid_answers_total{A,json_schema} = %v, want 1", got)
	}
	fields := ReportLogFields(rep)
	if got := logString(fields, "validation"); got != ValidationPassed {
		t.Fatalf("log validation = %q, want %q", got, ValidationPassed)
	}
}

// upstreamOpen reports whether upstream i is unavailable now (open or
// cooling down).
func upstreamOpen(h *Hedger, i int) bool {
	return !healthy(h.state.health[i], h.now())
}

type recordingSink struct {
	mu      sync.Mutex
	samples map[string]float64
}

func (s *recordingSink) Record(metric int, labels []string, v float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.samples == nil {
		s.samples = make(map[string]float64)
	}
	s.samples[metricKey(metric, labels...)] += v
}

func (s *recordingSink) count(metric int, labels ...string) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples[metricKey(metric, labels...)]
}

func metricKey(metric int, labels ...string) string {
	return metricDefs[metric].Name + "{" + strings.Join(labels, ",") + "}"
}

func logString(fields []LogField, key string) string {
	for _, f := range fields {
		if f.Key == key {
			return f.Str
		}
	}
	return ""
}

// Without validate, today's behaviour: the first complete answer wins,
// valid or not.
func TestWithoutValidateInvalidAnswerWins(t *testing.T) {
	hs := newHarness(t, testConfig())
	out := hs.serve(schemaRequest(false))
	a := hs.tr.next(t)
	invalid := chatAnswer(`{"city":42}`, "stop")
	a.respond(200, "application/json")
	a.write(invalid)
	a.end()
	res := <-out
	if got := bodyOf(res); got != invalid {
		t.Fatalf("body = %q, want A's %q", got, invalid)
	}
	if rep := <-hs.reports; rep.Validation != "" {
		t.Fatalf("rep.Validation = %q, want none", rep.Validation)
	}
}

// heldWriter records a response and says whether anything was sent yet.
type heldWriter struct {
	mu   sync.Mutex
	rec  *httptest.ResponseRecorder
	sent bool
}

func newHeldWriter() *heldWriter { return &heldWriter{rec: httptest.NewRecorder()} }

func (w *heldWriter) Header() http.Header { return w.rec.Header() }

func (w *heldWriter) WriteHeader(status int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sent = true
	w.rec.WriteHeader(status)
}

func (w *heldWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sent = true
	n, err := w.rec.Write(p)
	return n, err
}

func (w *heldWriter) Flush() {}

func (w *heldWriter) anythingSent() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent
}

// serveHeld runs one request with a heldWriter.
func serveHeld(hs *harness, r *http.Request) (*heldWriter, chan error) {
	w := newHeldWriter()
	done := make(chan error, 1)
	go func() {
		done <- hs.h.Handle(w, r)
	}()
	return w, done
}

// A streamed answer is held until it is complete: nothing reaches the
// client while it streams, the hedge delay passing meanwhile starts no
// hedge (output has come), and the complete valid answer is released whole.
func TestStreamHeldAndReleased(t *testing.T) {
	hs := newHarness(t, validatedConfig(config.ValidateJSONSchema, config.ValidateFinish))
	w, done := serveHeld(hs, schemaRequest(true))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(roleChunk + tokenChunk(`{\"city\":`))
	a.write(tokenChunk(`\"Rome\"}`)) // read by the held stream: holding for sure
	if w.anythingSent() {
		t.Fatal("the client got bytes of an answer still held for validation")
	}
	hs.clock.drainArmed()
	hs.clock.Advance(100 * time.Millisecond) // the hedge delay passes while A is held
	a.write(finishChunk + "data: [DONE]\n\n")
	if w.anythingSent() {
		t.Fatal("the client got bytes before the held stream ended")
	}
	a.end()
	if err := <-done; err != nil {
		t.Fatalf("Handle = %v, want nil", err)
	}
	want := roleChunk + tokenChunk(`{\"city\":`) + tokenChunk(`\"Rome\"}`) + finishChunk + "data: [DONE]\n\n"
	if got := w.rec.Body.String(); got != want {
		t.Fatalf("body\n got %q\nwant %q", got, want)
	}
	rep := <-hs.reports
	if len(rep.Attempts) != 1 {
		t.Fatalf("attempts = %d, want 1 (no hedge while output was held)", len(rep.Attempts))
	} else if rep.Validation != ValidationPassed {
		t.Fatalf("rep.Validation = %q, want %q", rep.Validation, ValidationPassed)
	} else if rep.TTFT != 100*time.Millisecond {
		t.Fatalf("rep.TTFT = %v, want 100ms (the client's first byte is the commit)", rep.TTFT)
	}
}

// A held stream that turns out invalid (cut off by max_tokens) is never
// sent: the next attempt starts at once and its valid stream wins.
func TestHeldStreamInvalidStartsNextAttempt(t *testing.T) {
	hs := newHarness(t, validatedConfig(config.ValidateFinish))
	w, done := serveHeld(hs, chatRequest(""))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("par") + "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
	a.end()
	b := hs.tr.next(t) // no clock advance
	b.respond(200, "text/event-stream")
	valid := tokenChunk("Paris") + finishChunk + "data: [DONE]\n\n"
	b.write(valid)
	b.end()
	if err := <-done; err != nil {
		t.Fatalf("Handle = %v, want nil", err)
	}
	if got := w.rec.Body.String(); got != valid {
		t.Fatalf("body\n got %q\nwant B's %q", got, valid)
	}
	rep := <-hs.reports
	if rep.Attempts[0].Invalid != config.ValidateFinish {
		t.Fatalf("attempt 0 invalid = %q, want %q", rep.Attempts[0].Invalid, config.ValidateFinish)
	} else if !strings.Contains(rep.Attempts[0].Error, `"length"`) {
		t.Fatalf("attempt 0 error = %q, want it to name \"length\"", rep.Attempts[0].Error)
	}
}

// A streamed answer that outgrows max_prefix while held goes out unchecked,
// whole, and the report says so.
func TestHeldStreamBeyondMaxPrefixUnchecked(t *testing.T) {
	cfg := validatedConfig(config.ValidateJSON)
	cfg.MaxPrefix = 1024
	hs := newHarness(t, cfg)
	w, done := serveHeld(hs, chatRequest(""))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	var sent strings.Builder
	first := tokenChunk("not json")
	a.write(first)
	sent.WriteString(first)
	for sent.Len() <= 1024 {
		chunk := tokenChunk(strings.Repeat("x", 100))
		a.write(chunk)
		sent.WriteString(chunk)
	}
	rest := finishChunk + "data: [DONE]\n\n"
	a.write(rest) // streamed through: the answer was committed unchecked
	sent.WriteString(rest)
	a.end()
	if err := <-done; err != nil {
		t.Fatalf("Handle = %v, want nil", err)
	}
	if got := w.rec.Body.String(); got != sent.String() {
		t.Fatalf("body has %d bytes, want all %d sent", len(got), sent.Len())
	}
	rep := <-hs.reports
	if rep.Validation != ValidationUnchecked {
		t.Fatalf("rep.Validation = %q, want %q", rep.Validation, ValidationUnchecked)
	} else if rep.Winner != 0 {
		t.Fatalf("rep.Winner = %d, want 0", rep.Winner)
	}
}

// When every answer is invalid the client gets the most complete one,
// marked; with validate_failure 502, an error.
func TestEveryAnswerInvalid(t *testing.T) {
	for _, mode := range []string{"", config.ValidateFailure502} {
		t.Run("failure="+mode, func(t *testing.T) {
			cfg := validatedConfig(config.ValidateJSONSchema)
			cfg.ValidateFailure = config.FailureMode(mode)
			hs := newHarness(t, cfg)
			out := hs.serve(schemaRequest(false))
			a := hs.tr.next(t)
			a.respond(200, "application/json")
			a.write(chatAnswer(`{}`, "stop"))
			a.end()
			b := hs.tr.next(t)
			longer := chatAnswer(`{"town":"Paris, the capital"}`, "stop")
			b.respond(200, "application/json")
			b.write(longer)
			b.end()
			res := <-out
			rep := <-hs.reports
			if got := res.rec.Header().Get(HeaderValidation); got != "failed; check=json_schema" {
				t.Fatalf("%s = %q, want \"failed; check=json_schema\"", HeaderValidation, got)
			} else if rep.Outcome != OutcomeInvalid {
				t.Fatalf("rep.Outcome = %q, want %q", rep.Outcome, OutcomeInvalid)
			} else if rep.Validation != ValidationFailed {
				t.Fatalf("rep.Validation = %q, want %q", rep.Validation, ValidationFailed)
			}
			if mode == config.ValidateFailure502 {
				if res.rec.Code != 502 {
					t.Fatalf("status = %d, want 502", res.rec.Code)
				} else if !strings.Contains(bodyOf(res), codeUpstreamInvalid) {
					t.Fatalf("body = %q, want code %s", bodyOf(res), codeUpstreamInvalid)
				}
				return
			}
			if res.rec.Code != 200 {
				t.Fatalf("status = %d, want 200", res.rec.Code)
			} else if got := bodyOf(res); got != longer {
				t.Fatalf("body = %q, want the more complete %q", got, longer)
			}
		})
	}
}

// A client opts in per request with X-LLM-Hedge-Validate on a route
// without checks; the header is not forwarded, and an unknown check is a 400.
func TestValidateHeaderOptsIn(t *testing.T) {
	hs := newHarness(t, testConfig())
	r := chatRequest(`{"model":"m","stream":false,"messages":[]}`)
	r.Header.Set(HeaderValidate, "json, finish")
	out := hs.serve(r)
	a := hs.tr.next(t)
	if v := a.req.Header.Get(HeaderValidate); v != "" {
		t.Fatalf("upstream got %s = %q, want it removed", HeaderValidate, v)
	}
	a.respond(200, "application/json")
	a.write(chatAnswer("not json", "stop"))
	a.end()
	b := hs.tr.next(t)
	valid := chatAnswer(`[1]`, "stop")
	b.respond(200, "application/json")
	b.write(valid)
	b.end()
	if got := bodyOf(<-out); got != valid {
		t.Fatalf("body = %q, want %q", got, valid)
	}
	if rep := <-hs.reports; rep.Attempts[0].Invalid != config.ValidateJSON {
		t.Fatalf("attempt 0 invalid = %q, want %q", rep.Attempts[0].Invalid, config.ValidateJSON)
	}

	bad := chatRequest("")
	bad.Header.Set(HeaderValidate, "off")
	res := <-hs.serve(bad)
	if res.rec.Code != 400 {
		t.Fatalf("status = %d for %s: off, want 400", res.rec.Code, HeaderValidate)
	} else if !strings.Contains(bodyOf(res), `\"off\"`) {
		t.Fatalf("body = %q, want it to name \"off\"", bodyOf(res))
	}
}

// The configured schema applies when the request sends none.
func TestConfiguredSchema(t *testing.T) {
	cfg := validatedConfig(config.ValidateJSONSchema)
	cfg.ValidateSchema = config.SchemaText(answerSchema)
	hs := newHarness(t, cfg)
	out := hs.serve(chatRequest(`{"model":"m","messages":[]}`))
	a := hs.tr.next(t)
	a.respond(200, "application/json")
	a.write(chatAnswer(`{"city":1}`, "stop"))
	a.end()
	b := hs.tr.next(t)
	b.respond(200, "application/json")
	b.write(chatAnswer(`{"city":"x"}`, "stop"))
	b.end()
	<-out
	if rep := <-hs.reports; rep.Winner != 1 {
		t.Fatalf("rep.Winner = %d, want 1", rep.Winner)
	}
}

// The options decode from their JSON forms (by the methods directly: under
// Yaegi encoding/json does not see an interpreted type's UnmarshalJSON) and
// are checked, naming the wrong value.
func TestValidateOptions(t *testing.T) {
	var mode config.FailureMode
	if err := mode.UnmarshalJSON([]byte(`502`)); err != nil {
		t.Fatalf("validate_failure 502: %v", err)
	} else if mode != config.ValidateFailure502 {
		t.Fatalf("validate_failure = %q, want \"502\"", mode)
	}
	var schema config.SchemaText
	if err := schema.UnmarshalJSON([]byte(` {"type":"object"}`)); err != nil {
		t.Fatalf("validate_schema object: %v", err)
	} else if schema != `{"type":"object"}` {
		t.Fatalf("validate_schema = %q, want the schema's text", schema)
	}
	if err := schema.UnmarshalJSON([]byte(`"{\"type\":\"array\"}"`)); err != nil {
		t.Fatalf("validate_schema string: %v", err)
	} else if schema != `{"type":"array"}` {
		t.Fatalf("validate_schema = %q, want the string's text", schema)
	}
	c := config.Config{Upstreams: []config.UpstreamConfig{{URL: "http://a"}}, ValidateChecks: []string{"json_schema", "finish"},
		ValidateFailure: mode, ValidateSchema: schema}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate = %v, want nil", err)
	}
	c.ValidateChecks = []string{"json,schema"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `"schema"`) {
		t.Fatalf("Validate = %v, want it to name \"schema\"", err)
	}
	c.ValidateChecks = nil
	c.ValidateFailure = "503"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `"503"`) {
		t.Fatalf("Validate = %v, want it to name \"503\"", err)
	}
	c.ValidateFailure = ""
	c.ValidateSchema = "{"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "validate_schema") {
		t.Fatalf("Validate = %v, want a validate_schema error", err)
	}
}

// Held and released in every streamed format: A's stream fails a check and
// is never sent, B's valid stream is released whole.
func TestHeldStreamsEveryFormat(t *testing.T) {
	for _, f := range []struct{ name, path, invalid, valid string }{
		{"responses", "/v1/responses",
			"data: {\"type\":\"response.output_text.delta\",\"delta\":\"{\"}\n\n" +
				"data: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\"}}\n\n",
			"data: {\"type\":\"response.output_text.delta\",\"delta\":\"{}\"}\n\n" +
				"data: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"{}\"}]}]}}\n\n"},
		{"anthropic", "/v1/messages",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"{\"}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
	} {
		t.Run(f.name, func(t *testing.T) {
			hs := newHarness(t, validatedConfig(config.ValidateFinish, config.ValidateJSON))
			r := httptest.NewRequest("POST", f.path, strings.NewReader(`{"model":"m","stream":true,"store":false}`))
			r.Header.Set("Content-Type", "application/json")
			w, done := serveHeld(hs, r)
			a := hs.tr.next(t)
			a.respond(200, "text/event-stream")
			a.write(f.invalid)
			if w.anythingSent() {
				t.Fatal("the client got bytes of a held answer")
			}
			a.end()
			b := hs.tr.next(t) // at once
			b.respond(200, "text/event-stream")
			b.write(f.valid)
			b.end()
			if err := <-done; err != nil {
				t.Fatalf("Handle = %v, want nil", err)
			}
			if got := w.rec.Body.String(); got != f.valid {
				t.Fatalf("body\n got %q\nwant B's %q", got, f.valid)
			}
			if rep := <-hs.reports; rep.Attempts[0].Invalid != config.ValidateFinish {
				t.Fatalf("attempt 0 invalid = %q (%s), want %q", rep.Attempts[0].Invalid, rep.Attempts[0].Error, config.ValidateFinish)
			}
		})
	}
}

// A held stream that the upstream breaks off fails like any stream
// before commit: retried, never delivered.
func TestHeldStreamBrokenIsRetried(t *testing.T) {
	hs := newHarness(t, validatedConfig(config.ValidateJSON))
	w, done := serveHeld(hs, chatRequest(""))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(tokenChunk("{"))
	a.reset()
	b := hs.tr.next(t)
	b.respond(200, "text/event-stream")
	valid := tokenChunk("{}") + finishChunk + "data: [DONE]\n\n"
	b.write(valid)
	b.end()
	<-done
	if got := w.rec.Body.String(); got != valid {
		t.Fatalf("body\n got %q\nwant B's %q", got, valid)
	}
	if rep := <-hs.reports; rep.Attempts[0].Result != ResultFailed {
		t.Fatalf("attempt 0 result = %q, want %q", rep.Attempts[0].Result, ResultFailed)
	}
}

// Held answers behind early headers: the status and keep-alives go out
// while the answers are held (none of their bytes), and when every answer
// is invalid the client gets an error event, or, when it accepts trailers,
// the most complete invalid stream with the mark as a trailer.
func TestEarlyHeadersWithHeldInvalidAnswers(t *testing.T) {
	cut := "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n"
	for _, trailers := range []bool{false, true} {
		t.Run(map[bool]string{false: "error event", true: "trailer"}[trailers], func(t *testing.T) {
			cfg := validatedConfig(config.ValidateFinish)
			cfg.EarlyHeaders = config.Duration(time.Second)
			hs := newHarness(t, cfg)
			pw := newPipeWriter()
			r := chatRequest("")
			if trailers {
				r.Header.Set("TE", "trailers")
			}
			done := hs.serveVia(pw, r)
			a := hs.tr.next(t)
			hs.clock.waitArmed(t, 2) // the hedge timer and the grace timer
			a.respond(200, "text/event-stream")
			a.write(tokenChunk("x"))
			a.write(tokenChunk("y")) // read while held
			hs.clock.Advance(time.Second)
			if got := <-pw.writes; got != ": keep-alive\n\n" {
				t.Fatalf("first write = %q, want a keep-alive comment (no held bytes)", got)
			}
			a.write(cut)
			a.end()
			b := hs.tr.next(t) // at once: A was invalid
			b.respond(200, "text/event-stream")
			longer := tokenChunk(strings.Repeat("a longer answer ", 8)) + cut
			b.write(longer)
			b.end()
			got := <-pw.writes
			if err := <-done; err != nil {
				t.Fatalf("Handle = %v, want nil", err)
			}
			rep := <-hs.reports
			if rep.Outcome != OutcomeInvalid {
				t.Fatalf("rep.Outcome = %q, want %q", rep.Outcome, OutcomeInvalid)
			}
			if !trailers {
				if !strings.Contains(got, codeUpstreamInvalid) || !strings.HasPrefix(got, "data: ") {
					t.Fatalf("last write = %q, want an error event with %s", got, codeUpstreamInvalid)
				}
				return
			}
			if got != longer {
				t.Fatalf("last write = %q, want B's more complete answer %q", got, longer)
			} else if mark := strings.Join(pw.h[http.TrailerPrefix+http.CanonicalHeaderKey(HeaderValidation)], ","); mark != "failed; check=finish" {
				t.Fatalf("trailer %s = %q, want \"failed; check=finish\"", HeaderValidation, mark)
			}
		})
	}
}
