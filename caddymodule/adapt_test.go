package caddymodule

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile" // the caddyfile adapter
	_ "github.com/caddyserver/caddy/v2/modules/standard"          // directives used beside llm_hedge
)

// update rewrites the golden JSON of testdata/caddyfile_adapt.
var update = flag.Bool("update", false, "rewrite the golden files of testdata/caddyfile_adapt")

// goldenSeparator splits a .caddyfiletest into its Caddyfile and the JSON
// that `caddy adapt` must produce, as in Caddy's own adapt tests.
const goldenSeparator = "----------"

// TestCaddyfileAdaptGolden adapts each testdata/caddyfile_adapt file and
// compares the pretty JSON with the golden part (run with -update to
// rewrite it). The e2e tests run the same files through the real binary's
// `caddy adapt`.
func TestCaddyfileAdaptGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/caddyfile_adapt/*.caddyfiletest")
	if err != nil {
		t.Fatalf("no golden files: %v", err)
	} else if len(files) == 0 {
		t.Fatalf("no golden files: len(files) = 0, want != 0")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			caddyfileText, want := readGolden(t, file)
			got := adaptCaddyfile(t, caddyfileText)
			if *update {
				out := caddyfileText + goldenSeparator + "\n" + got + "\n"
				if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if got != want {
				t.Fatalf("adapted JSON differs from the golden file (run go test -run Golden -update to accept)\ngot:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// readGolden returns a golden file's Caddyfile and JSON parts.
func readGolden(t *testing.T, file string) (caddyfileText, jsonText string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cf, js, ok := strings.Cut(string(data), goldenSeparator+"\n")
	if !ok {
		t.Fatalf("%s has no %s line", file, goldenSeparator)
	}
	return cf, strings.TrimSpace(js)
}

// adaptCaddyfile runs the caddyfile adapter and returns tab-indented JSON.
func adaptCaddyfile(t *testing.T, text string) string {
	t.Helper()
	adapter := caddyconfig.GetAdapter("caddyfile")
	result, warnings, err := adapter.Adapt([]byte(text), nil)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	for _, w := range warnings {
		t.Errorf("adapt warning: %s:%d: %s", w.File, w.Line, w.Message)
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, result, "", "\t"); err != nil {
		t.Fatal(err)
	}
	return pretty.String()
}
