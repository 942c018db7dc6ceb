package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// goldenSeparator splits a .caddyfiletest into its Caddyfile and the JSON
// `caddy adapt` must produce (see ../adapt_test.go).
const goldenSeparator = "----------\n"

// runCaddy runs the real binary with args and returns its combined output.
func runCaddy(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(caddyBinary, args...)
	dir := t.TempDir()
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	var out strings.Builder
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.String(), err
}

// TestBinaryAdaptGolden: the real binary's `caddy adapt --validate` gives
// the golden JSON for every testdata Caddyfile, and provisions it.
func TestBinaryAdaptGolden(t *testing.T) {
	files, err := filepath.Glob("../testdata/caddyfile_adapt/*.caddyfiletest")
	if err != nil {
		t.Fatalf("no golden files: %v", err)
	} else if len(files) == 0 {
		t.Fatalf("no golden files: len(files) = 0, want != 0")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			caddyfileText, want, ok := strings.Cut(string(data), goldenSeparator)
			if !ok {
				t.Fatalf("no separator in %s", file)
			}
			config := filepath.Join(t.TempDir(), "Caddyfile")
			if err := os.WriteFile(config, []byte(caddyfileText), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(caddyBinary, "adapt", "--config", config, "--adapter", "caddyfile", "--pretty", "--validate")
			cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("caddy adapt: %v", err)
			}
			if got := strings.TrimSpace(string(out)); got != strings.TrimSpace(want) {
				t.Fatalf("caddy adapt printed\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// TestBinaryRejectsBadConfig: bad Caddyfiles fail in the real binary with
// the error that says what to fix, from the parser (with the line) or from
// Provision/Validate.
func TestBinaryRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct{ name, directive, want string }{
		{"syntax", "llm_hedge http://127.0.0.1:9 {\n\t\tdelay soon\n\t}", `delay "soon": want a duration (e.g. 500ms) or adaptive: time: invalid duration "soon", at `},
		{"unknown option", "llm_hedge http://127.0.0.1:9 {\n\t\tretries 3\n\t}", `unrecognized llm_hedge option "retries", at `},
		{"no upstream", "llm_hedge {\n\t\tdelay 1s\n\t}", "at least one upstream is required"},
		{"bad quantile", "llm_hedge http://127.0.0.1:9 {\n\t\tdelay adaptive {\n\t\t\tquantile 2\n\t\t}\n\t}", "quantile 2 must be between 0 and 1"},
		{"bad scheme", "llm_hedge ws://127.0.0.1:9", "scheme must be http or https"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			config := filepath.Join(t.TempDir(), "Caddyfile")
			text := ":8080 {\n\t" + tc.directive + "\n}\n"
			if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := runCaddy(t, "validate", "--config", config, "--adapter", "caddyfile")
			if err == nil {
				t.Fatalf("caddy validate accepted\n%s", text)
			}
			out = strings.ReplaceAll(out, `\"`, `"`) // Caddy logs the error as JSON
			if !strings.Contains(out, tc.want) {
				t.Fatalf("caddy validate said\n%s\nwant it to mention %q", out, tc.want)
			}
		})
	}
}

// TestBinaryListsModule: the binary has the handler and the admin API
// module (the per-process switch) under their IDs.
func TestBinaryListsModule(t *testing.T) {
	out, err := runCaddy(t, "list-modules", "--skip-standard")
	if err != nil {
		t.Fatalf("list-modules: %v", err)
	}
	for _, id := range []string{"http.handlers.llm_hedge", "admin.api.llm_hedge"} {
		if !strings.Contains(out, id) {
			t.Errorf("list-modules: out = %q, want it to contain %q", out, id)
		}
	}
}
