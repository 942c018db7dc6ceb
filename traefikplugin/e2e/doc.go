// Package e2e runs the llmhedge Traefik plugin inside a real Traefik
// v3.6.12, built from its Go module by examples/traefik/build-traefik.sh and
// cached outside the checkout, with the repository loaded as a local plugin
// (experimental.localPlugins, interpreted by Yaegi exactly as in
// production). Clients are the official OpenAI Go SDK; upstreams are
// internal/testkit/llmsim servers and small scripted servers.
//
// Its tests are part of `go test ./...`. The long benchmarks (the reference
// workload, ≥ 2,000 requests; the truncation study; requests per second)
// run only with LLMHEDGE_BENCH=1 and print their numbers.
//
// This folder is compiled, never interpreted: `yaegi test ./traefikplugin`
// does not load it, so it may use the SDK and `select`.
package e2e
