package docscheck

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestTryItPorts checks the "try it" set-ups of the three proxies against
// what the docs say: each listens on a port of its own (Caddy 8081, Traefik
// 8082, the Envoy server's stand-in and envoy.yaml 8083), so that they can
// run side by side, and every curl of a doc or example names one of them
// for the set-up it goes with.
func TestTryItPorts(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ file, text string }{
		{"README.md", ":8081 {\n\tllm_hedge {"},
		{"caddymodule/README.md", ":8081 {\n\tllm_hedge {"},
		{"examples/caddy/Caddyfile", "{$LLMHEDGE_LISTEN::8081}"},
		{"examples/traefik/traefik-local.yml", `address: ":8082"`},
		{"examples/traefik/traefik.yml", `address: ":8082"`},
		{"examples/envoy-standin/main.go", `"listen", "127.0.0.1:8083"`},
		{"examples/envoy/envoy.yaml", "port_value: 8083}"},
	}
	for _, w := range want {
		if !strings.Contains(readFile(t, filepath.Join(root, w.file)), w.text) {
			t.Errorf("%s: no %q", w.file, w.text)
		}
	}
	// Every port a try-it curl or listener names is one of the three.
	port := regexp.MustCompile(`(?:localhost|127\.0\.0\.1|address: "|^):(80[0-9][0-9])\b`)
	for _, f := range []string{"README.md", "caddymodule/README.md", "examples/caddy/README.md", "examples/caddy/Caddyfile",
		"traefikplugin/README.md", "envoyfilter/README.md", "examples/envoy/envoy.yaml", "examples/envoy/llmhedge-extproc-sim.yaml"} {
		for _, line := range strings.Split(readFile(t, filepath.Join(root, f)), "\n") {
			for _, m := range port.FindAllStringSubmatch(line, -1) {
				if m[1] != "8081" && m[1] != "8082" && m[1] != "8083" {
					t.Errorf("%s: port %s in %q, want 8081 (Caddy), 8082 (Traefik) or 8083 (Envoy)", f, m[1], strings.TrimSpace(line))
				}
			}
		}
	}
}

// TestTraefikExamplesStayOffline fails when an example static configuration
// of Traefik leaves the version check or the anonymous usage report on
// (Traefik would reach the internet at start).
func TestTraefikExamplesStayOffline(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"examples/traefik/traefik-local.yml", "examples/traefik/traefik.yml"} {
		var static struct {
			Global *struct {
				CheckNewVersion    *bool `json:"checkNewVersion"`
				SendAnonymousUsage *bool `json:"sendAnonymousUsage"`
			} `json:"global"`
		}
		if err := yaml.Unmarshal([]byte(readFile(t, filepath.Join(root, f))), &static); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		g := static.Global
		if g == nil || g.CheckNewVersion == nil || *g.CheckNewVersion || g.SendAnonymousUsage == nil || *g.SendAnonymousUsage {
			t.Errorf("%s: global %+v, want checkNewVersion: false and sendAnonymousUsage: false", f, g)
		}
	}
}
