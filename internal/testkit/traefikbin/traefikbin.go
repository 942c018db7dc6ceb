// Package traefikbin gives end-to-end tests the real Traefik v3.6.12 and
// this checkout laid out as its local plugin, so every test that runs
// Traefik builds and copies them the same way.
package traefikbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/caddybin"
)

// ModulePath is the plugin's module: the moduleName of Traefik's
// experimental.localPlugins entry.
const ModulePath = caddybin.ModulePath

// build is the binary's build script.
var build = caddybin.ScriptBuild{Script: "examples/traefik/build-traefik.sh", What: "build-traefik.sh (go build of Traefik)"}

// Binary returns the cached Traefik v3.6.12 binary, building it once per
// test process with examples/traefik/build-traefik.sh (minutes on a cold
// cache; the script keys its cache by version).
func Binary(t testing.TB) string {
	t.Helper()
	return build.Binary(t)
}

// PluginPackages are the folders of this module that Traefik interprets:
// the plugin and every package of the module it imports, as `go list -deps`
// finds them (so a new package of the core is laid out without a list to
// keep).
func PluginPackages() ([]string, error) {
	root, err := caddybin.RepoRoot()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./traefikplugin")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -deps ./traefikplugin: %v", err)
	}
	var pkgs []string
	for _, line := range strings.Fields(string(out)) {
		if rel, ok := strings.CutPrefix(line, ModulePath+"/"); ok {
			pkgs = append(pkgs, rel)
		} else {
			return nil, fmt.Errorf("the plugin imports %s, outside its module: Traefik's loader has only the standard library", line)
		}
	}
	return pkgs, nil
}

// LayoutPlugin copies what Traefik interprets of this checkout into
// dir/plugins-local/src/<ModulePath>: the manifest, go.mod and the non-test
// Go files of PluginPackages. Traefik's working directory must then be dir.
func LayoutPlugin(t testing.TB, dir string) {
	t.Helper()
	root, err := caddybin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "plugins-local", "src", filepath.FromSlash(ModulePath))
	files := []string{".traefik.yml", "go.mod"}
	pkgs, err := PluginPackages()
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range pkgs {
		matches, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(pkg), "*.go"))
		if err != nil || len(matches) == 0 {
			t.Fatalf("no Go files in %s: %v", pkg, err)
		}
		for _, m := range matches {
			if !strings.HasSuffix(m, "_test.go") {
				files = append(files, filepath.Join(pkg, filepath.Base(m)))
			}
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		to := filepath.Join(dst, f)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
