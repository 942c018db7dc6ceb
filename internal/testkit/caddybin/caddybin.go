// Package caddybin builds the real Caddy binary with the llm_hedge module
// (caddymodule/cmd/caddy-llmhedge) and caches it outside the checkout, for
// end-to-end tests, benchmarks and demos.
//
// The cache path is $LLMHEDGE_CACHE (default $HOME/.cache/llmhedge) /
// caddy-<hash>/caddy, where hash covers the Go version, go.mod, go.sum and
// every non-test .go file under core/, caddymodule/, fleetredis/, oteltrace/ and
// metrics/ (the packages the module imports from this one): a fresh clone of the
// same source reuses the binary, any change to what goes into it rebuilds
// it. examples/caddy/build-caddy.sh computes the same hash.
package caddybin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/proc"
)

// ModulePath is the Go module the binary is built from.
const ModulePath = "github.com/llmhedge/llmhedge"

// mainPackage is the package of the Caddy main, relative to the module root.
const mainPackage = "./caddymodule/cmd/caddy-llmhedge"

var (
	once    sync.Once
	binPath string
	binErr  error
)

// Path returns the path of the cached Caddy binary, building it first if
// the cache has none for the current source. Safe for concurrent use; the
// build runs once per process.
func Path() (string, error) {
	once.Do(func() { binPath, binErr = build() })
	return binPath, binErr
}

// Binary is Path for a test: it skips t under -short (`make unit` builds
// and starts no proxy) and fails it when the build fails.
func Binary(t testing.TB) string {
	t.Helper()
	proc.SkipShort(t, "caddy (and go build of it)")
	bin, err := Path()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func build() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	hash, err := SourceHash(root)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(CacheDir(), "caddy-"+hash, "caddy")
	if info, err := os.Stat(bin); err == nil && info.Mode().IsRegular() {
		return bin, nil
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	// Test packages run as parallel processes and each may ask for the
	// binary: one builds under the lock, the others wait and find it.
	unlock, err := lockFile(bin + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if info, err := os.Stat(bin); err == nil && info.Mode().IsRegular() {
		return bin, nil
	}
	// Build next to the target and rename: a concurrent builder or an
	// interrupted build never leaves a half-written binary at the path.
	tmp := fmt.Sprintf("%s.tmp%d", bin, os.Getpid())
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp, mainPackage)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("building caddy: %v\n%s", err, out.String())
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// CacheDir is $LLMHEDGE_CACHE, or $HOME/.cache/llmhedge.
func CacheDir() string {
	if dir := os.Getenv("LLMHEDGE_CACHE"); dir != "" {
		return dir
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "llmhedge")
}

// RepoRoot finds the checkout's root: the nearest parent of the working
// directory whose go.mod declares ModulePath.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module "+ModulePath+"\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("caddybin: no go.mod of " + ModulePath + " above the working directory")
		}
		dir = parent
	}
}

// SourceHash returns the first 16 hex digits of the SHA-256 of the Go
// version line, then, for go.mod, go.sum and every non-test .go file under
// core/, caddymodule/, fleetredis/, metrics/ and oteltrace/ (testdata excluded; paths sorted bytewise),
// the slash path and a newline followed by the file's content.
func SourceHash(root string) (string, error) {
	version, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		return "", fmt.Errorf("caddybin: go env GOVERSION: %v", err)
	}
	var files []string
	for _, dir := range []string{"core", "caddymodule", "fleetredis", "metrics", "oteltrace"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
				rel, err := filepath.Rel(root, path)
				if err != nil {
					return err
				}
				files = append(files, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	sort.Strings(files)
	sum := sha256.New()
	sum.Write(version)
	for _, name := range append([]string{"go.mod", "go.sum"}, files...) {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err != nil {
			return "", err
		}
		sum.Write([]byte(name + "\n"))
		sum.Write(data)
	}
	return hex.EncodeToString(sum.Sum(nil))[:16], nil
}

// GoBuild builds the command pkg of this module (e.g. "./cmd/llmhedge-ctl")
// into a temporary folder of t and returns the binary's path.
func GoBuild(t testing.TB, pkg string) string {
	t.Helper()
	proc.SkipShort(t, "go build "+pkg)
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// ScriptBuild is a binary that a build script of this repository builds
// and caches (examples/traefik/build-traefik.sh, the Jaeger kit's
// build-jaeger.sh), built at most once per test process.
type ScriptBuild struct {
	Script string // the script, relative to the repository root
	What   string // what -short skips, e.g. "build-traefik.sh (go build of Traefik)"

	once sync.Once
	path string
	err  error
}

// Binary returns the built binary's path, running the script on the first
// call; -short skips t, a failed build fails it.
func (b *ScriptBuild) Binary(t testing.TB) string {
	t.Helper()
	proc.SkipShort(t, b.What)
	b.once.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			b.err = err
			return
		}
		b.path, b.err = proc.RunBuildScript(root, filepath.Join(root, filepath.FromSlash(b.Script)))
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}
