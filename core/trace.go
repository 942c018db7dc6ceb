package core

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Tracer links the engine to a tracing back end: OpenTelemetry's SDK in
// Caddy and the Envoy server, a standard-library exporter under Traefik
// (package lighttrace). With no Tracer (Options.Tracer nil) there is no
// span and every attempt carries the client's trace headers unchanged.
type Tracer interface {
	// Start begins the request's span at start, as a child of the trace
	// context r carries (the proxy's span in r's context, or r's
	// traceparent header). nil: this request is not traced.
	Start(r *http.Request, start time.Time) Trace
}

// Trace is one request's spans. Its methods are called on the request's
// goroutine: Attempt as each attempt starts, then End once.
type Trace interface {
	// Attempt begins attempt index's span at start, a child of the
	// request's span, and returns the trace headers its upstream gets: a
	// traceparent whose parent is the attempt's own span, and the
	// tracestate (the caller's, kept).
	Attempt(index int, start time.Time) (traceparent, tracestate string)
	// End ends the attempt spans and the request's span with r: names,
	// kinds, attributes, times and status come from SpanOf and
	// AttemptSpanOf, so that every adapter's spans read the same.
	End(r *Report)
}

// Span names and kinds: the request's race is an internal span of the
// proxy's request span; each attempt is a client span under it.
const (
	SpanRequest = "llm_hedge"
	SpanAttempt = "llm_hedge.attempt"

	SpanKindInternal = 1 // OTLP's SPAN_KIND_INTERNAL
	SpanKindClient   = 3 // OTLP's SPAN_KIND_CLIENT
)

// AttributePrefix starts every engine attribute's key: the attribute for
// the log line's field "outcome" is "llmhedge.outcome", for an attempt's
// field "result" "llmhedge.attempt.result". One vocabulary for log lines
// and spans (the metrics' labels use the same words).
const AttributePrefix = "llmhedge."

// SpanData is what an adapter needs to end one span: every adapter's
// spans are built from it, so they carry the same names and values.
type SpanData struct {
	Name       string
	Kind       int // SpanKindInternal or SpanKindClient
	End        time.Time
	Attributes []LogField // LogString, LogInt, LogBool, LogMillis (a float) or LogStrings
	// Failed: the span's status is an error, with ErrorMessage (a
	// redacted reason: no credential) as its description.
	Failed       bool
	ErrorMessage string
}

// SpanOf describes the request's span: the log line's fields (but the
// attempt list) under AttributePrefix, plus the request's model as
// gen_ai.request.model. It fails when no answer was delivered in full.
func SpanOf(r *Report) SpanData {
	attrs := requestFields(r, 1)
	for i := range attrs {
		attrs[i].Key = AttributePrefix + attrs[i].Key
	}
	if r.Model != "" {
		attrs = append(attrs, stringField("gen_ai.request.model", r.Model))
	}
	d := SpanData{Name: SpanRequest, Kind: SpanKindInternal, End: r.Start.Add(r.Total), Attributes: attrs}
	switch {
	case r.Outcome == OutcomeOK || r.Outcome == OutcomeReplayed:
	case r.Outcome == OutcomeJoined && r.Status < 400:
	default:
		d.Failed = true
		d.ErrorMessage = r.Outcome
	}
	return d
}

// AttemptSpanOf describes attempt i's span: its log fields under
// AttributePrefix+"attempt.", and the names OpenTelemetry's conventions
// give (gen_ai.operation.name, gen_ai.provider.name, gen_ai.request.model,
// gen_ai.response.time_to_first_chunk, server.address, server.port,
// http.response.status_code, error.type). It fails when the
// attempt failed on its own (not when it lost or was cancelled).
func AttemptSpanOf(r *Report, i int) SpanData {
	a := &r.Attempts[i]
	attrs := attemptFields(a, 8)
	for i := range attrs {
		attrs[i].Key = AttributePrefix + "attempt." + attrs[i].Key
	}
	attrs = append(attrs, stringField("gen_ai.operation.name", operationName(r.Request)))
	if a.Provider != "" {
		attrs = append(attrs, stringField("gen_ai.provider.name", a.Provider))
	}
	if a.Model != "" {
		attrs = append(attrs, stringField("gen_ai.request.model", a.Model))
	} else if r.Model != "" {
		attrs = append(attrs, stringField("gen_ai.request.model", r.Model))
	}
	if a.ServerAddress != "" {
		attrs = append(attrs, stringField("server.address", a.ServerAddress))
		attrs = append(attrs, intField("server.port", int64(a.ServerPort)))
	}
	if a.Status != 0 {
		attrs = append(attrs, intField("http.response.status_code", int64(a.Status)))
	}
	if a.TTFT > 0 {
		// In seconds, as the convention says (a LogMillis field is a plain
		// float to a span).
		attrs = append(attrs, LogField{Key: "gen_ai.response.time_to_first_chunk", Kind: LogMillis, Millis: a.TTFT.Seconds()})
	}
	d := SpanData{Name: SpanAttempt, Kind: SpanKindClient, End: r.Start.Add(a.Ended), Attributes: attrs}
	if a.Result == ResultFailed || a.Result == ResultInvalid {
		d.Failed = true
		d.ErrorMessage = a.Error
		attrs = append(attrs, stringField("error.type", a.ErrorType))
		d.Attributes = attrs
	}
	return d
}

// operationName is the GenAI operation a request's path names.
func operationName(r *http.Request) string {
	if r == nil || r.URL == nil {
		return "chat"
	}
	p := r.URL.Path
	switch {
	case strings.HasSuffix(p, "/embeddings"):
		return "embeddings"
	case strings.HasSuffix(p, "/completions") && !strings.HasSuffix(p, "/chat/completions"):
		return "text_completion"
	case strings.HasSuffix(p, "/responses"):
		return "generate_content"
	}
	return "chat"
}

// startTrace begins the request's trace (handle's rare branch: its own
// function, as under Yaegi every slot of a frame is allocated per call).
func startTrace(h *Hedger, r *http.Request, rep *Report, start time.Time) {
	rep.trace = h.opts.Tracer.Start(r, start)
}

// startAttemptSpan begins attempt a's span and keeps the trace headers
// its upstream gets.
func startAttemptSpan(rc *race, a *attempt) {
	parent, state := rc.rep.trace.Attempt(a.index, a.started)
	a.traceparent = parent
	a.tracestate = state
}

// setTraceHeaders puts an attempt's own trace context on its request, in
// place of the client's.
func setTraceHeaders(hdr http.Header, a *attempt) {
	hdr["Traceparent"] = []string{a.traceparent}
	if a.tracestate != "" {
		hdr["Tracestate"] = []string{a.tracestate}
	} else {
		delete(hdr, "Tracestate")
	}
}

// endTrace ends the request's spans with its report.
func endTrace(h *Hedger, p *preparedRequest, rep *Report) {
	if rep.Total == 0 {
		rep.Total = h.now().Sub(rep.Start)
	}
	if p != nil && rep.Model == "" {
		rep.Model = requestModel(p.body)
	}
	t := rep.trace
	rep.trace = nil // ended: endTraceCut has nothing left to do
	t.End(rep)
}

// endTraceCut ends the spans of a request that did not reach its end (its
// goroutine is panicking): the report holds what was known, no attempt
// list; the request span says so.
func endTraceCut(h *Hedger, rep *Report) {
	if rep.trace == nil {
		return
	}
	t := rep.trace
	rep.trace = nil
	rep.Outcome = OutcomeCut
	rep.Attempts = nil
	rep.Total = h.now().Sub(rep.Start)
	t.End(rep)
}

// requestModel is the top-level "model" of a JSON body, "" when it has
// none (or the body is not JSON). Read only for traced requests, by
// encoding/json: compiled under Yaegi, where a scan of our own would be an
// interpreted loop over the body. (prepare has refused a body with two
// "model" keys, so this one is the model every upstream reads.)
func requestModel(body []byte) string {
	body = bytes.TrimLeft(body, " \t\r\n")
	if len(body) == 0 || body[0] != '{' {
		return ""
	}
	var v modelOnly
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	return v.Model
}

// modelOnly is what requestModel decodes.
type modelOnly struct {
	Model string `json:"model"`
}

// upstreamSpan is what an attempt's span says of its upstream, worked out
// once per upstream (New) rather than per traced attempt.
type upstreamSpan struct {
	address  string
	port     int
	provider string
}

// upstreamSpans describes each upstream of bases for the spans.
func upstreamSpans(bases []*url.URL) []upstreamSpan {
	out := make([]upstreamSpan, len(bases))
	for i, base := range bases {
		host := base.Hostname()
		out[i] = upstreamSpan{address: host, port: portOf(base), provider: providerOf(host)}
	}
	return out
}

// describeUpstream fills what a span says of upstream up: its address, the
// provider its host names, and the model it asks for.
func describeUpstream(h *Hedger, ar *AttemptReport, up int) {
	u := &h.upstreamSpans[up]
	ar.ServerAddress = u.address
	ar.ServerPort = u.port
	ar.Provider = u.provider
	ar.Model = h.cfg.Upstreams[up].Model
}

// portOf is u's port, or its scheme's.
func portOf(u *url.URL) int {
	if p := u.Port(); p != "" {
		n, _ := strconv.Atoi(p)
		return n
	}
	if u.Scheme == "https" {
		return 443
	}
	return 80
}

// providerOf names the provider behind a host, in OpenTelemetry's
// gen_ai.provider.name values; "" for a host it does not know (a
// self-hosted model, a simulator).
func providerOf(host string) string {
	switch {
	case host == "api.openai.com":
		return "openai"
	case host == "api.anthropic.com":
		return "anthropic"
	case strings.HasSuffix(host, ".openai.azure.com"):
		return "azure.ai.openai"
	case host == "generativelanguage.googleapis.com":
		return "gcp.gemini"
	case strings.HasSuffix(host, "aiplatform.googleapis.com"):
		return "gcp.vertex_ai"
	case strings.HasPrefix(host, "bedrock-runtime."):
		return "aws.bedrock"
	case host == "api.mistral.ai":
		return "mistral_ai"
	case host == "api.groq.com":
		return "groq"
	case host == "api.deepseek.com":
		return "deepseek"
	case host == "api.x.ai":
		return "x_ai"
	case host == "api.cohere.com" || host == "api.cohere.ai":
		return "cohere"
	}
	return ""
}

// errorType classes attempt a's failure for AttemptReport.ErrorType.
func errorType(a *attempt) string {
	switch {
	case a.status >= 400:
		return strconv.Itoa(a.status)
	case a.code != "":
		return a.code
	case a.invalid != "":
		return codeUpstreamBadResponse
	}
	return codeUpstreamError
}

// attemptEnded is when attempt a's span ends, since the request's start:
// the winner's when its answer has gone out, a loser's when its connection
// was closed after the commit, a failure's when it failed.
func attemptEnded(rc *race, a *attempt, total time.Duration) time.Duration {
	switch {
	case a == rc.winner:
		return total
	case a.result == ResultLost && a.cancelLatency > 0:
		return rc.commitAt.Add(a.cancelLatency).Sub(rc.start)
	case a.result == ResultLost && a.endedAt.Before(rc.commitAt):
		// Ready before the commit (a late winner): closed at the commit.
		return rc.commitAt.Sub(rc.start)
	}
	return a.endedAt.Sub(rc.start)
}
