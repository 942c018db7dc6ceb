#!/usr/bin/env bash
# Builds the real Traefik from its Go module at a pinned version and caches
# the binary outside the checkout. Prints the binary's path.
#
# `go install github.com/traefik/traefik/v3/cmd/traefik@VERSION` fails because
# Traefik's go.mod has replace directives, so the module is copied into a
# writable folder and built there, with its own go.mod in force.
set -euo pipefail
version="${TRAEFIK_VERSION:-v3.6.12}"
cache="${LLMHEDGE_CACHE:-$HOME/.cache/llmhedge}"
bin="$cache/traefik-$version/traefik"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$(dirname "$bin")"
# Test packages run in parallel (traefikplugin/e2e, deploy, internal/fleete2e)
# and each may ask for the binary: one builds, the others wait on the lock
# and find it built, instead of compiling Traefik twice on a cold cache.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$bin.lock"
  flock 9
  if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
  fi
fi
src_dir="$(cd "$cache" && GOFLAGS=-mod=mod go mod download -json "github.com/traefik/traefik/v3@$version" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cp -r "$src_dir/." "$work/src"
chmod -R u+w "$work/src"
echo "building traefik $version (takes a few minutes on 2 cores)..." >&2
# A temporary name of this process's own and an atomic rename: without
# flock two builds may still race, and neither leaves a half-written binary.
(cd "$work/src" && GOFLAGS=-mod=mod go build -trimpath -o "$bin.tmp.$$" ./cmd/traefik)
mv "$bin.tmp.$$" "$bin"
echo "$bin"
