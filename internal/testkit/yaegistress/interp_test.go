package yaegistress

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/traefikbin"
	"github.com/traefik/yaegi/interp"
	"github.com/traefik/yaegi/stdlib"
)

// modulePath is the module the interpreter resolves imports under.
const modulePath = "github.com/llmhedge/llmhedge"

// helperPackages are this package's helpers that the tests interpret (the
// probes, the core handler, the naive select hedger), copied into the
// interpreter's GOPATH beside the code Traefik would run
// (traefikbin.PluginPackages). Only non-test .go files are copied, as
// Traefik's plugin loader would see them.
var helperPackages = []string{
	"internal/testkit/yaegistress/probe",
	"internal/testkit/yaegistress/respcheck",
	"internal/testkit/yaegistress/corehandler",
	"internal/testkit/yaegistress/selecthedger",
}

// repoRoot is the module root: three levels above this package.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.Contains(string(mod), "module "+modulePath+"\n") {
		t.Fatalf("%s is not the root of %s (go.mod: %v)", root, modulePath, err)
	}
	return root
}

// newGoPath lays out a GOPATH in a temporary folder, as Traefik's
// plugins-local does: src/github.com/llmhedge/llmhedge/{go.mod, packages}.
func newGoPath(t testing.TB) string {
	t.Helper()
	root := repoRoot(t)
	gopath := t.TempDir()
	dst := filepath.Join(gopath, "src", filepath.FromSlash(modulePath))
	copyFile(t, filepath.Join(root, "go.mod"), filepath.Join(dst, "go.mod"))
	pkgs, err := traefikbin.PluginPackages()
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range append(pkgs, helperPackages...) {
		files, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(pkg), "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			copyFile(t, f, filepath.Join(dst, filepath.FromSlash(pkg), filepath.Base(f)))
		}
	}
	return gopath
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// newInterpreter returns an interpreter over gopath with the standard
// library's symbols, configured as Traefik's plugin loader configures it,
// with pkg (a path under the module) imported.
func newInterpreter(t testing.TB, gopath, pkg string) *interp.Interpreter {
	t.Helper()
	i := interp.New(interp.Options{GoPath: gopath, Env: os.Environ()})
	if err := i.Use(stdlib.Symbols); err != nil {
		t.Fatal(err)
	}
	if _, err := i.Eval(`import "` + modulePath + "/" + pkg + `"`); err != nil {
		t.Fatalf("interpreting %s: %v", pkg, err)
	}
	return i
}

// evalAs evaluates expr in i and converts the result to T (a func type).
func evalAs[T any](t testing.TB, i *interp.Interpreter, expr string) T {
	t.Helper()
	v, err := i.Eval(expr)
	if err != nil {
		t.Fatalf("eval %s: %v", expr, err)
	}
	fn, ok := v.Interface().(T)
	if !ok {
		var want T
		t.Fatalf("eval %s: got %v, want %v", expr, v.Type(), reflect.TypeOf(want))
	}
	return fn
}
