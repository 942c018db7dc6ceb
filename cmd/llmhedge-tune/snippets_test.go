package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"sigs.k8s.io/yaml"

	_ "github.com/llmhedge/llmhedge/caddymodule" // registers llm_hedge
	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/traefikplugin"
)

// testSnippets are the snippets for a primary, a secondary with another
// key and model, a third endpoint of the same format and one of another.
func testSnippets(t *testing.T) *snippets {
	t.Helper()
	eps := []endpoint{
		{Name: "openai", Base: "https://api.openai.com", KeyEnv: "TUNE_SNIP_OPENAI", Format: formatOpenAI, Model: "gpt-4o-mini"},
		{Name: "claude", Base: "https://api.anthropic.com", KeyEnv: "TUNE_SNIP_ANTHROPIC", Format: formatAnthropic},
		{Name: "backup", Base: "http://10.0.0.7:8000/openai", KeyEnv: "TUNE_SNIP_BACKUP", Format: formatOpenAI, Model: "llama 3.1"},
		{Name: "local", Base: "http://127.0.0.1:11434", Format: formatOpenAI},
	}
	rec := &recommendation{TargetExtra: 0.05, Quantile: 0.95, Delay: "1.234s", delay: 1234 * time.Millisecond, Primary: "openai", Secondary: "backup", Pairs: 500, ExpectedExtra: 0.05}
	return makeSnippets(eps, pickSecondary(eps), rec)
}

func TestSnippetsListTheRightUpstreams(t *testing.T) {
	s := testSnippets(t)
	for name, text := range map[string]string{"caddy": s.Caddyfile, "traefik": s.Traefik, "envoy": s.Envoy} {
		iOpenAI, iBackup, iLocal := strings.Index(text, "openai\""), strings.Index(text, "backup"), strings.Index(text, "local")
		if name == "caddy" {
			iOpenAI = strings.Index(text, "name openai")
		}
		if iOpenAI < 0 || !(iOpenAI < iBackup && iBackup < iLocal) {
			t.Errorf("%s: want openai, backup, local in order:\n%s", name, text)
		}
		if !strings.Contains(text, "Not listed (another API format; one body cannot go to both): claude.") {
			t.Errorf("%s does not say why claude is left out", name)
		}
		if strings.Contains(text, "api.anthropic.com") || strings.Contains(text, "TUNE_SNIP_ANTHROPIC") {
			t.Errorf("%s lists the anthropic endpoint", name)
		}
	}
}

// TestSnippetsAreAcceptedByTheAdapters parses each snippet with the real
// adapter code: Caddy's Caddyfile adapter with the llm_hedge module, the
// Traefik plugin's New after the file provider's templating, and the Envoy
// server's configuration loader.
func TestSnippetsAreAcceptedByTheAdapters(t *testing.T) {
	t.Setenv("TUNE_SNIP_OPENAI", "sk-o")
	t.Setenv("TUNE_SNIP_BACKUP", "sk-b")
	s := testSnippets(t)

	t.Run("caddy", func(t *testing.T) {
		adapted, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(s.Caddyfile), nil)
		if err != nil || len(warnings) > 0 {
			t.Fatalf("adapt: %v %v\n%s", err, warnings, s.Caddyfile)
		}
		text := string(adapted)
		for _, want := range []string{`"handler":"llm_hedge"`, `"fixed":1234000000`, `"Authorization":"Bearer {env.TUNE_SNIP_OPENAI}"`,
			`"model":"llama 3.1"`, `"url":"http://10.0.0.7:8000/openai"`, `"ratio":0.1`} {
			if !strings.Contains(text, want) {
				t.Errorf("adapted JSON lacks %s:\n%s", want, text)
			}
		}
	})

	t.Run("traefik", func(t *testing.T) {
		// Traefik's file provider renders the file as a Go template with
		// the env function before decoding it.
		tmpl, err := template.New("dynamic").Funcs(template.FuncMap{"env": func(name string) string {
			return map[string]string{"TUNE_SNIP_OPENAI": "sk-o", "TUNE_SNIP_BACKUP": "sk-b"}[name]
		}}).Parse(s.Traefik)
		if err != nil {
			t.Fatal(err)
		}
		var rendered strings.Builder
		if err := tmpl.Execute(&rendered, nil); err != nil {
			t.Fatal(err)
		}
		var dynamic struct {
			HTTP struct {
				Middlewares map[string]struct {
					Plugin map[string]json.RawMessage `json:"plugin"`
				} `json:"middlewares"`
			} `json:"http"`
		}
		if err := yaml.UnmarshalStrict([]byte(rendered.String()), &dynamic); err != nil {
			t.Fatalf("%v\n%s", err, rendered.String())
		}
		raw := dynamic.HTTP.Middlewares["llm-hedge"].Plugin["llmhedge"]
		cfg := traefikplugin.CreateConfig()
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(cfg); err != nil {
			t.Fatalf("%v\n%s", err, raw)
		}
		if cfg.Delay != "1.234s" || len(cfg.Upstreams) != 3 || cfg.Upstreams[0].SetHeaders["Authorization"] != "Bearer sk-o" || cfg.Upstreams[2].Model != "" {
			t.Errorf("decoded %+v", cfg)
		}
		if _, err := traefikplugin.New(context.Background(), http.NotFoundHandler(), cfg, "llm-hedge@file"); err != nil {
			t.Errorf("plugin rejects the snippet: %v", err)
		}
	})

	t.Run("envoy", func(t *testing.T) {
		cfg, err := envoyfilter.ParseConfig([]byte(s.Envoy))
		if err != nil {
			t.Fatalf("%v\n%s", err, s.Envoy)
		}
		r := cfg.Routes[0]
		if time.Duration(r.Delay.Fixed) != 1234*time.Millisecond || len(r.Upstreams) != 3 || r.Match.PathPrefixes[0] != "/v1/chat/completions" {
			t.Errorf("route %+v", r)
		}
		core, err := r.CoreConfig()
		if err != nil {
			t.Fatal(err)
		}
		if core.Upstreams[1].SetHeaders["Authorization"] != "Bearer sk-b" || core.Budget.Ratio != 0.1 {
			t.Errorf("core config %+v", core)
		}
	})
}

func TestSnippetsForAnthropicAndSelfHedge(t *testing.T) {
	eps := []endpoint{{Name: "claude", Base: "https://api.anthropic.com", KeyEnv: "ANTHROPIC_API_KEY", Format: formatAnthropic, Model: "claude-haiku"}}
	rec := &recommendation{TargetExtra: 0.1, Quantile: 0.9, Delay: "800ms", delay: 800 * time.Millisecond, Primary: "claude", Secondary: "claude", SelfPaired: true}
	s := makeSnippets(eps, 0, rec)
	for _, want := range []string{"name claude\n", "name claude-hedge\n", "header_up x-api-key {env.ANTHROPIC_API_KEY}", "delay 800ms", "quantile 0.9", "ratio 0.2", "p90 of claude"} {
		if !strings.Contains(s.Caddyfile, want) {
			t.Errorf("Caddyfile lacks %q:\n%s", want, s.Caddyfile)
		}
	}
	if !strings.Contains(s.Envoy, `path_prefixes: ["/v1/messages"]`) || !strings.Contains(s.Envoy, `x-api-key: "${ANTHROPIC_API_KEY}"`) {
		t.Errorf("envoy snippet:\n%s", s.Envoy)
	}
	if !strings.Contains(s.Traefik, `x-api-key: '{{ env "ANTHROPIC_API_KEY" }}'`) {
		t.Errorf("traefik snippet:\n%s", s.Traefik)
	}
}

func TestCaddyToken(t *testing.T) {
	for in, want := range map[string]string{"plain": "plain", "a b": `"a b"`, `q"x`: `"q\"x"`, "{env.X}": "{env.X}", "{": `"{"`, "#x": `"#x"`, "": `""`} {
		if got := caddyToken(in); got != want {
			t.Errorf("caddyToken(%q) = %s, want %s", in, got, want)
		}
	}
}
