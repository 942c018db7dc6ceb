#!/usr/bin/env bash
# Builds the real Caddy with the llm_hedge module (caddymodule/cmd/caddy-llmhedge)
# and caches it outside the checkout. Prints the binary's path.
#
# The cache key is the same as internal/testkit/caddybin's (used by the e2e tests):
# the Go version, go.mod, go.sum and every non-test .go file under core/,
# caddymodule/, fleetredis/, metrics/ and oteltrace/, so the tests, the demo and CI's fresh clone share one build.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${LLMHEDGE_CACHE:-$HOME/.cache/llmhedge}"
cd "$root"
hash="$(
  {
    go env GOVERSION
    for f in go.mod go.sum $(find core caddymodule fleetredis metrics oteltrace -name '*.go' ! -name '*_test.go' ! -path '*/testdata/*' | LC_ALL=C sort); do
      printf '%s\n' "$f"
      cat "$f"
    done
  } | sha256sum | cut -c1-16
)"
bin="$cache/caddy-$hash/caddy"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$(dirname "$bin")"
# The same lock file internal/testkit/caddybin takes: one build at a time,
# the waiters find the binary built.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$bin.lock"
  flock 9
  if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
  fi
fi
echo "building caddy with llm_hedge (a minute or two on 2 cores)..." >&2
go build -trimpath -o "$bin.tmp$$" ./caddymodule/cmd/caddy-llmhedge
mv "$bin.tmp$$" "$bin"
echo "$bin"
