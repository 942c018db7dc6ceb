// Package envoyfilter is llmhedge's Envoy adapter: an ext_proc
// (envoy.service.ext_proc.v3.ExternalProcessor) gRPC server that hedges
// LLM requests on their first output token behind Envoy.
//
// Envoy cannot send one request to two upstreams and pick the first real
// token, so the server makes the upstream attempts itself (through core)
// and hands the winner back to Envoy as a local response. Envoy keeps the
// edge: TLS, authentication, rate limits and routing happen before the
// filter.
//
// Per request (one ext_proc stream):
//
//   - A request no route matches continues untouched: the stream is closed
//     cleanly at once when Envoy still holds the body, or every message is
//     answered "continue, unchanged" when the filter already handed the
//     body over (FULL_DUPLEX_STREAMED).
//   - A matched request in FULL_DUPLEX_STREAMED mode (Envoy >= 1.37) is
//     hedged while its body streams in; the reply to request_headers is
//     held until the winner commits (that mode runs no message timer), then
//     sent as a StreamedImmediateResponse: headers with the winner's
//     status, body chunks as they come, end_of_stream. A non-streaming
//     answer goes back as one ImmediateResponse.
//   - A matched request in BUFFERED mode (Envoy < 1.37) is hedged once its
//     whole body arrives and answered with one ImmediateResponse, after
//     extending Envoy's message timer with override_message_timeout.
//
// With a tracing section (TracingConfig) every hedged request gets an
// OpenTelemetry span, and each upstream attempt a span under it whose
// context the attempt's upstream receives as its traceparent, exported
// over OTLP. The parent is the context of Envoy's ext_proc span, which
// Envoy sends in the stream's gRPC metadata, else the traceparent of the
// request headers (tracing.go).
//
// The rules each step relies on were read from Envoy's ext_proc filter
// (source/extensions/filters/http/ext_proc/ext_proc.cc, processor_state.cc,
// config.cc, mutation_utils.cc) and are cited where they are used. The
// package internal/testkit/envoydriver speaks to this server the way that filter does, for
// tests; README.md says what was and was not run against a real Envoy.
package envoyfilter
