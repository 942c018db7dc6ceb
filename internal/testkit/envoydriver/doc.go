// Package envoydriver is an HTTP front end that speaks to an ext_proc
// server the way Envoy's ext_proc HTTP filter does, over real gRPC, so the
// server can be tested end to end without an Envoy binary.
//
// A Driver is an http.Handler. Per request it opens one
// ExternalProcessor.Process stream and plays the filter's part, as read from
// Envoy's source (source/extensions/filters/http/ext_proc/ext_proc.cc,
// processor_state.cc, config.cc, mutation_utils.cc and
// filters/common/mutation_rules):
//
// Reproduced:
//   - Message order and content: request_headers first, with
//     protocol_config (the body modes) on that first message only; header
//     names lower-case, values in raw_value; the pseudo-headers :method,
//     :scheme, :authority, :path; x-forwarded-proto and x-request-id added
//     as the connection manager does; end_of_stream on the headers when the
//     request has no body.
//   - FULL_DUPLEX_STREAMED request bodies (with request_trailer_mode SEND):
//     chunks are sent as they arrive, without waiting for the headers
//     reply; the last chunk carries end_of_stream, or request_trailers
//     follow when the request has trailers; no message timer runs. Chunks
//     handed to the server are gone from the proxy: only the server's
//     streamed_response replies carry the body on.
//   - BUFFERED request bodies: the body is held until the headers are
//     answered, then sent whole in one request_body; message_timeout
//     (default 200ms) runs on every message and gives 504 when it expires;
//     override_message_timeout restarts it once per message, if within
//     max_message_timeout (off by default, as in Envoy).
//   - StreamedImmediateResponse: accepted only as the reply owed to
//     request_headers (also after body chunks went out), only in
//     FULL_DUPLEX_STREAMED (or NONE) body mode; headers_response needs an
//     integer :status >= 200; body_response chunks are written and flushed
//     to the client at the server's pace; end_of_stream or
//     trailers_response ends the response. After it started the rest of
//     the request body is still sent to the server, and any reply to it is
//     spurious.
//   - ImmediateResponse in any state before the response started; a status
//     below 200 becomes 200; header mutations that touch x-envoy-* or
//     pseudo-headers are ignored; content-type defaults to text/plain.
//   - Spurious or invalid messages and gRPC errors: status_on_error (500)
//     before the response started, a reset of the client's response after
//     (failure_mode_allow is false, as config.cc requires with
//     FULL_DUPLEX_STREAMED).
//   - A clean close by the server before it answered the headers continues
//     the request upstream untouched, minus the body chunks the server
//     already received in FULL_DUPLEX_STREAMED mode (counted in
//     Stats.LostBodyBytes).
//   - The continue path: headers continued (with header mutations) and body
//     chunks echoed in streamed_response go to the configured upstream.
//   - Stream close: when the response is complete the driver half-closes
//     the stream and waits up to RemoteCloseTimeout (1s, Envoy's runtime
//     default) for the server to close it, then resets it. When the client
//     goes away it does the same (or resets at once with ResetOnClientGone):
//     no message announces it.
//
// Not reproduced: response-path processing (response_header_mode SEND,
// response bodies), observability mode, mode_override and
// allowed_override_modes, CONTINUE_AND_REPLACE, per-route ExtProcPerRoute
// settings, dynamic metadata and attributes, route cache clearing, body
// size limits and watermarks (413s), HTTP/2 flow control between Envoy and
// the server beyond what gRPC does, the graceful-close runtime flags,
// deferred close, failure_mode_allow, local_reply_config rewriting of
// local replies, and header-count/size limits. A local response the server
// leaves open (a clean close after headers_response without end_of_stream)
// hangs in Envoy until a stream timeout; the driver resets it at once and
// counts it in Stats.Spurious.
package envoydriver
