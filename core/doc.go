// Package core is the transport-agnostic hedging engine of llmhedge.
//
// A Hedger takes an *http.Request and an http.ResponseWriter, sends the
// request to its first upstream, and if no model output has arrived when the
// hedge delay passes (or the attempt failed in a retryable way) sends the same
// request to the next upstream. The first attempt whose stream yields a real
// output event wins: its status, headers and bytes go to the client, the
// others are cancelled. Budgets ration the extra load; one idempotency key is
// sent on every attempt.
//
// Four packages below it own what it reads and writes, and import nothing
// of it: config (the options), stream (what counts as output), redact
// (credentials kept out of text) and fleetstore (the fleet's Redis side).
//
// The package uses the standard library only and runs under the Yaegi
// interpreter v0.16.1, which Traefik uses for plugins. Yaegi's select
// statement is not safe when one function runs concurrently (see
// CONTRIBUTING.md), so no code here uses select: each request has one event
// channel that attempts and timers post to, read with plain receives. The
// per-request path is written for what the interpreter charges for (CONTRIBUTING.md,
// "What Yaegi charges for"): functions rather than methods, rare
// branches in functions of their own, configuration behind pointers.
package core
