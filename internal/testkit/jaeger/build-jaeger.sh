#!/usr/bin/env bash
# Builds the real Jaeger v2 (./cmd/jaeger, an OpenTelemetry Collector
# distribution) from its Go module at a pinned version and caches the
# binary outside the checkout. Prints the binary's path as its last line.
#
# Modelled on examples/traefik/build-traefik.sh: the module is copied into a
# writable folder and built there with its own go.mod in force (its replace
# directives and pinned dependencies), not with `go install ...@VERSION`.
# The module carries no UI assets (cmd/query/app/ui/actual is empty), so the
# binary serves Jaeger's placeholder page at / ; the query API is complete.
set -euo pipefail
version="${JAEGER_VERSION:-v1.75.0}"
cache="${LLMHEDGE_CACHE:-$HOME/.cache/llmhedge}"
bin="$cache/jaeger-$version/jaeger"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$(dirname "$bin")"
# Test packages run in parallel and each may ask for the binary: one
# builds, the others wait on the lock and find it built, instead of
# compiling Jaeger twice on a cold cache.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$bin.lock"
  flock 9
  if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
  fi
fi
src_dir="$(cd "$cache" && GOFLAGS=-mod=mod go mod download -json "github.com/jaegertracing/jaeger@$version" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
if [ -z "$src_dir" ]; then
  echo "go mod download github.com/jaegertracing/jaeger@$version gave no module folder" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cp -r "$src_dir/." "$work/src"
chmod -R u+w "$work/src"
echo "building jaeger $version (takes several minutes on 2 cores)..." >&2
# A temporary name of this process's own and an atomic rename: without
# flock two builds may still race, and neither leaves a half-written binary.
(cd "$work/src" && GOFLAGS=-mod=mod go build -trimpath -o "$bin.tmp.$$" ./cmd/jaeger)
mv "$bin.tmp.$$" "$bin"
echo "$bin"
