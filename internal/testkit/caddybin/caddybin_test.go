package caddybin

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/proc"
)

// TestShellScriptSharesTheCache: examples/caddy/build-caddy.sh must compute
// the same cache key, so the demo and the tests share one build. A fake
// binary at SourceHash's path must be found by the script without a build.
func TestShellScriptSharesTheCache(t *testing.T) {
	proc.SkipShort(t, "build-caddy.sh")
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Skip("sha256sum not installed")
	}
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	hash, err := SourceHash(root)
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	fake := filepath.Join(cache, "caddy-"+hash, "caddy")
	if err := os.MkdirAll(filepath.Dir(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "examples", "caddy", "build-caddy.sh"))
	cmd.Env = append(os.Environ(), "LLMHEDGE_CACHE="+cache)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("build-caddy.sh: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != fake {
		t.Fatalf("script printed %q, want the cached %q (hashes differ)", got, fake)
	}
}
