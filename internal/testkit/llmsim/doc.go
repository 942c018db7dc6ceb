// Package llmsim is a simulated LLM upstream that behaves like real
// providers, for the tests, benchmarks, adapters' end-to-end tests and the
// demo of llmhedge.
//
// A Workload draws a time to first token (TTFT) per upstream and request from
// a seeded distribution (lognormal around a median, with rare long
// stalls), so every run is reproducible and the ideal hedged result can be
// computed from the same draws (NoHedge, IdealHedge, Sequential, RaceAll).
// A request that reaches the same Server again (a hedge sent back to the
// same provider) draws anew, as a provider's second request would.
//
// A Server serves OpenAI Chat Completions, OpenAI Responses, Anthropic
// Messages and Ollama chat, streaming or not. Streams are the hard, realistic
// case: status 200, headers and a preamble without model output (a role-only
// chunk, response.created, message_start, ...) are sent at once, then ": ping"
// comments while the server "thinks", then the tokens. Every answer is
// deterministic from the request id and names the upstream that produced it,
// so a test can check byte for byte that a whole answer came from exactly one
// upstream (see Call.Body and StripPings).
//
// Behaviors script failures per request (error statuses, resets mid-stream,
// error events, early [DONE], stalls, slow headers), chosen by a Go function
// or, through real proxies, by the X-Sim-Behavior request header.
//
// The package uses the standard library only. Unlike core it is
// not run under Yaegi, so it uses select freely. Every wait watches the
// request's context: a cancelled request ends its handler at once, and no
// goroutine outlives its request.
package llmsim
