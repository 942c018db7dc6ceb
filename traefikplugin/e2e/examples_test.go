package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
	"github.com/llmhedge/llmhedge/internal/testkit/traefikbin"
	"github.com/llmhedge/llmhedge/traefikplugin"
)

// pluginSections returns the llmhedge plugin configurations of a dynamic
// configuration file, by middleware name, as JSON.
func pluginSections(t *testing.T, path string) map[string][]byte {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		HTTP struct {
			Middlewares map[string]struct {
				Plugin map[string]json.RawMessage `json:"plugin"`
			} `json:"middlewares"`
		} `json:"http"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out := map[string][]byte{}
	for name, m := range doc.HTTP.Middlewares {
		if cfg, ok := m.Plugin["llmhedge"]; ok {
			out[name] = cfg
		}
	}
	return out
}

// decodeStrict decodes a plugin configuration on top of the defaults, as
// Traefik does, refusing unknown keys (a misspelt option would otherwise be
// silently ignored).
func decodeStrict(t *testing.T, what string, cfg []byte) *traefikplugin.Config {
	c := traefikplugin.CreateConfig()
	dec := json.NewDecoder(bytes.NewReader(cfg))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return c
}

func TestExampleConfigurationsAreValid(t *testing.T) {
	root := repoRoot(t)
	for _, file := range []string{"dynamic.yml", "dynamic-full.yml"} {
		path := filepath.Join(root, "examples", "traefik", file)
		sections := pluginSections(t, path)
		if len(sections) == 0 {
			t.Fatalf("%s has no llmhedge middleware", file)
		}
		for name, raw := range sections {
			cfg := decodeStrict(t, file+" "+name, raw)
			if _, err := traefikplugin.New(context.Background(), http.NotFoundHandler(), cfg, name+"@file"); err != nil {
				t.Fatalf("%s %s: %v", file, name, err)
			}
		}
	}
	// The manifest's testData is what Traefik's catalog checks New with.
	raw, err := os.ReadFile(filepath.Join(root, ".traefik.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var manifest struct {
		Import   string          `json:"import"`
		Type     string          `json:"type"`
		TestData json.RawMessage `json:"testData"`
	}
	if err := yaml.Unmarshal(raw, &manifest); err != nil {
		t.Fatal(err)
	}
	if manifest.Import != moduleName+"/traefikplugin" {
		t.Fatalf(".traefik.yml: manifest.Import = %q, want %q", manifest.Import, moduleName+"/traefikplugin")
	} else if manifest.Type != "middleware" {
		t.Fatalf(".traefik.yml: manifest.Type = %q, want \"middleware\"", manifest.Type)
	}
	if _, err := traefikplugin.New(context.Background(), http.NotFoundHandler(), decodeStrict(t, "testData", manifest.TestData), "testdata"); err != nil {
		t.Fatalf(".traefik.yml testData: %v", err)
	}
}

// runExample runs examples/traefik/traefik-local.yml with the dynamic
// configuration file dynamicFile, as they are but for the replacements
// (listening port, file path, upstream addresses), and returns once the
// route answers through the plugin.
func runExample(t *testing.T, dynamicFile string, replace []string, env ...string) *traefik {
	root := repoRoot(t)
	read := func(name string) string {
		raw, err := os.ReadFile(filepath.Join(root, "examples", "traefik", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	bin := traefikbin.Binary(t)
	dir := t.TempDir()
	traefikbin.LayoutPlugin(t, dir)
	web := proc.FreePort(t)
	tr := &traefik{t: t, dir: dir, dynPath: filepath.Join(dir, "dynamic.yml"),
		URL: fmt.Sprintf("http://127.0.0.1:%d", web), logs: &proc.Buffer{}, exited: make(chan struct{})}
	dyn := strings.NewReplacer(replace...).Replace(read(dynamicFile))
	static := strings.NewReplacer(`":8082"`, fmt.Sprintf(`"127.0.0.1:%d"`, web),
		"filename: dynamic.yml", fmt.Sprintf("filename: %q", tr.dynPath)).Replace(read("traefik-local.yml"))
	if dyn == read(dynamicFile) {
		t.Fatalf("the examples changed: the replacements left %s as it was; update them", dynamicFile)
	} else if static == read("traefik-local.yml") {
		t.Fatalf("the examples changed: the replacements left traefik-local.yml as it was; update them")
	}
	if err := os.WriteFile(tr.dynPath, []byte(dyn), 0o644); err != nil {
		t.Fatal(err)
	}
	tr.run(bin, static, env...)
	// Ready when the router answers through the plugin: a small
	// non-streaming request gets 200.
	routeAnswers := func() error {
		req, _ := http.NewRequest(http.MethodPost, tr.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		req.Header.Set(llmsim.HeaderRequest, "ready")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("the example route answered %s", resp.Status)
		}
		return nil
	}
	if err := proc.WaitReady(tr.cmd.Args, tr.exited, tr.logs.String, routeAnswers); err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestExampleRunsInTraefik(t *testing.T) {
	wl := functionalWorkload()
	a, b := llmsim.Start("A", wl), llmsim.Start("B", wl)
	defer a.Close()
	defer b.Close()
	tr := runExample(t, "dynamic.yml", []string{"http://127.0.0.1:9001", a.URL, "http://127.0.0.1:9002", b.URL})
	// A stalls (pings, never a token): only the hedge to B can answer, and
	// no TTFT of A has to outlast it on a loaded machine.
	r := streamChat(context.Background(), sdk(tr.URL+"/v1/"), "ex-1", "A=stall", nil)
	if up, ok := r.whole("ex-1", wl.WithDefaults().Tokens); !ok {
		t.Fatalf("through the example configuration: %s", r.notWhole("ex-1", wl.WithDefaults().Tokens))
	} else if up != "B" {
		t.Fatalf("through the example configuration: answered by %q, want B (A stalls; the example hedges after 50ms)", up)
	}
}

func TestFullExampleRunsInTraefik(t *testing.T) {
	// Every option, through Traefik's own decoding (file provider, Go
	// templates for the keys, mapstructure into the interpreted Config).
	wl := functionalWorkload()
	a, b := llmsim.Start("A", wl), llmsim.Start("B", wl)
	defer a.Close()
	defer b.Close()
	tr := runExample(t, "dynamic-full.yml", []string{"https://api.openai.com", a.URL, "https://openrouter.ai/api", b.URL},
		"OPENAI_API_KEY=sk-test-openai", "OPENROUTER_API_KEY=sk-test-openrouter")
	// A stalls: B answers after the 1s delay, whatever the machine's load.
	r := streamChat(context.Background(), sdk(tr.URL+"/v1/"), "full-1", "A=stall", nil)
	if up, ok := r.whole("full-1", wl.WithDefaults().Tokens); !ok {
		t.Fatalf("full-1: %s", r.notWhole("full-1", wl.WithDefaults().Tokens))
	} else if up != "B" {
		t.Fatalf("full-1 answered by %q, want B (A stalls; the example hedges after 1s)", up)
	}
	if st := r.header.Get("Server-Timing"); !strings.Contains(st, "upstream=openrouter") {
		t.Fatalf("Server-Timing %q", st)
	}
	for _, c := range []struct {
		s           *llmsim.Running
		auth, model string
	}{{a, "Bearer sk-test-openai", llmsim.DefaultModel}, {b, "Bearer sk-test-openrouter", "openai/gpt-4o-mini"}} {
		var seen *llmsim.Request
		for _, req := range c.s.Requests() {
			if req.RequestID == "full-1" {
				req := req
				seen = &req
			}
		}
		if seen == nil {
			t.Fatalf("%s: seen = nil, want non-nil", c.s.Name)
		} else if seen.Authorization != c.auth {
			t.Fatalf("%s: seen.Authorization = %v, want %v", c.s.Name, seen.Authorization, c.auth)
		} else if seen.Model != c.model {
			t.Fatalf("%s: seen.Model = %v, want %v", c.s.Name, seen.Model, c.model)
		} else if seen.Header.Get("Cookie") != "" {
			t.Fatalf("%s: seen.Header.Get(\"Cookie\") = %q, want \"\"", c.s.Name, seen.Header.Get("Cookie"))
		}
	}
	// Not eligible (GET): passed through to the router's service (Traefik's
	// load balancer to the same host here), once, so without the attempt
	// header the plugin would have set.
	resp, err := http.Get(tr.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var models []llmsim.Request
	for _, req := range append(a.Requests(), b.Requests()...) {
		if req.Path == "/v1/models" {
			models = append(models, req)
		}
	}
	if len(models) != 1 {
		t.Fatalf("len(models) = %v, want 1", len(models))
	} else if models[0].Attempt != "" {
		t.Fatalf("models[0].Attempt = %q, want \"\"", models[0].Attempt)
	} else if models[0].Method != http.MethodGet {
		t.Fatalf("models[0].Method = %v, want http.MethodGet", models[0].Method)
	}
}
