package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mitchellh/mapstructure"
	"github.com/traefik/paerser/file"
	"sigs.k8s.io/yaml"

	"github.com/llmhedge/llmhedge/traefikplugin"
)

// These tests follow a plugin option from the YAML a user writes to New,
// through the conversions Traefik v3.6.12 applies on the way, without
// starting Traefik (the chain has no process boundary worth testing).

// decodeLikeTraefik decodes a plugin's configuration map on top of
// CreateConfig as Traefik v3.6.12 does for Yaegi plugins
// (pkg/plugins/middlewareyaegi.go, yaegiMiddlewareBuilder.createConfig):
// mapstructure, weakly typed, with a comma-separated string-to-slice hook.
// Traefik pins mapstructure v1.5.1-0.20231216201459-8508981c8b6c; this
// module uses v1.5.0, which the rest of its build (Caddy's dependencies)
// already selects. The two differ only in wrapping errors with %w and in
// truncating an existing longer slice, neither of which these tests reach
// (weak bool and number to string is the same code).
func decodeLikeTraefik(t *testing.T, conf map[string]any) *traefikplugin.Config {
	t.Helper()
	cfg := traefikplugin.CreateConfig()
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		DecodeHook:       mapstructure.StringToSliceHookFunc(","),
		WeaklyTypedInput: true,
		Result:           cfg,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := dec.Decode(conf); err != nil {
		t.Fatalf("Traefik's decoder: %v", err)
	}
	return cfg
}

// kubernetesPluginConf is the map Traefik's Kubernetes CRD provider hands
// on for a Middleware manifest: kubectl converts the YAML to JSON with
// sigs.k8s.io/yaml (YAML 1.1: an unquoted off is false), the API server
// stores that JSON, and the provider (pkg/provider/kubernetes/crd,
// createPluginMiddleware) unmarshals spec.plugin into map[string]any.
func kubernetesPluginConf(t *testing.T, manifest string) map[string]any {
	t.Helper()
	raw, err := yaml.YAMLToJSON([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Spec struct {
			Plugin map[string]json.RawMessage `json:"plugin"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	if err := json.Unmarshal(doc.Spec.Plugin["llmhedge"], &conf); err != nil {
		t.Fatal(err)
	}
	return conf
}

// filePluginConf is the map Traefik's file provider hands on for a dynamic
// configuration file: pkg/provider/file decodes it with paerser's
// file.DecodeContent (YAML 1.2 through gopkg.in/yaml.v3, every leaf turned
// into a string) into the dynamic configuration, whose plugin sections are
// map[string]any (dynamic.PluginConf).
func filePluginConf(t *testing.T, content string) map[string]any {
	t.Helper()
	var dyn struct {
		HTTP *struct {
			Middlewares map[string]*struct {
				Plugin map[string]map[string]any `json:"plugin,omitempty" yaml:"plugin,omitempty"`
			} `json:"middlewares,omitempty" yaml:"middlewares,omitempty"`
		} `json:"http,omitempty" yaml:"http,omitempty"`
	}
	if err := file.DecodeContent(content, ".yml", &dyn); err != nil {
		t.Fatal(err)
	}
	if dyn.HTTP == nil {
		t.Fatalf("paerser found no middleware hedge: dyn.HTTP = nil, want non-nil")
	} else if dyn.HTTP.Middlewares["hedge"] == nil {
		t.Fatalf("paerser found no middleware hedge: dyn.HTTP.Middlewares[\"hedge\"] = nil, want non-nil")
	}
	return dyn.HTTP.Middlewares["hedge"].Plugin["llmhedge"]
}

// replayCounter is an upstream that counts the requests reaching it.
func replayCounter(t *testing.T) (*httptest.Server, *int32) {
	var served int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		atomic.AddInt32(&served, 1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &served
}

// twiceWithOneKey sends the same keyed request twice through h and
// returns how many reached the upstream, and what New logged on stdout.
func twiceWithOneKey(t *testing.T, cfg *traefikplugin.Config, served *int32) (upstreamCalls int32, stdout string) {
	t.Helper()
	// The plugin writes its log line to the os.Stdout it finds in New.
	out, err := os.CreateTemp(t.TempDir(), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = out
	h, err := traefikplugin.New(context.Background(), http.NotFoundHandler(), cfg, "default-hedge@kubernetescrd")
	os.Stdout = saved
	if err != nil {
		t.Errorf("New: %v", err)
		return 0, ""
	}
	for i := 0; i < 2; i++ {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("request %d: status %d", i, rec.Code)
		}
	}
	logged, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	return atomic.LoadInt32(served), string(logged)
}

func TestKubernetesOffReachesThePluginAsOff(t *testing.T) {
	upstream, served := replayCounter(t)
	manifest := func(route, option string) string {
		return `apiVersion: traefik.io/v1alpha1
kind: Middleware
metadata:
  name: hedge
spec:
  plugin:
    llmhedge:
      route: ` + route + `
      upstreams:
        - url: ` + upstream.URL + `
` + option
	}
	for i, off := range []string{`off`, `"off"`, `false`, `"false"`, `0`, `"0"`, `no`} {
		atomic.StoreInt32(served, 0)
		cfg := decodeLikeTraefik(t, kubernetesPluginConf(t, manifest("k8s-ttl-"+strconv.Itoa(i),
			"      log: \"off\"\n      idempotency:\n        ttl: "+off+"\n")))
		calls, _ := twiceWithOneKey(t, cfg, served)
		if calls != 2 {
			t.Errorf("ttl: %s (decoded as %q): %d of 2 requests with one key reached the upstream, want 2 (no replay)", off, cfg.Idempotency.TTL, calls)
		}
		cfg = decodeLikeTraefik(t, kubernetesPluginConf(t, manifest("k8s-log-"+strconv.Itoa(i), "      log: "+off+"\n")))
		if _, logged := twiceWithOneKey(t, cfg, served); logged != "" {
			t.Errorf("log: %s (decoded as %q): log lines written: %q", off, cfg.Log, logged)
		}
	}
}

func TestFileProviderOffReachesThePluginAsOff(t *testing.T) {
	upstream, served := replayCounter(t)
	content := func(route, option string) string {
		return `http:
  middlewares:
    hedge:
      plugin:
        llmhedge:
          route: ` + route + `
          upstreams:
            - url: ` + upstream.URL + `
` + option
	}
	for i, off := range []string{`off`, `false`, `0`, `"0s"`} {
		atomic.StoreInt32(served, 0)
		cfg := decodeLikeTraefik(t, filePluginConf(t, content("file-ttl-"+strconv.Itoa(i),
			"          log: off\n          idempotency:\n            ttl: "+off+"\n")))
		calls, _ := twiceWithOneKey(t, cfg, served)
		if calls != 2 {
			t.Errorf("ttl: %s (decoded as %q): %d of 2 requests with one key reached the upstream, want 2 (no replay)", off, cfg.Idempotency.TTL, calls)
		}
		if off == `"0s"` {
			continue // not a log destination
		}
		cfg = decodeLikeTraefik(t, filePluginConf(t, content("file-log-"+strconv.Itoa(i), "          log: "+off+"\n")))
		if _, logged := twiceWithOneKey(t, cfg, served); logged != "" {
			t.Errorf("log: %s (decoded as %q): log lines written: %q", off, cfg.Log, logged)
		}
	}
}

func TestKubernetesTTLOnIsRejectedWithTheFix(t *testing.T) {
	manifest := `spec:
  plugin:
    llmhedge:
      upstreams:
        - url: http://127.0.0.1:9
      idempotency:
        ttl: on
`
	cfg := decodeLikeTraefik(t, kubernetesPluginConf(t, manifest))
	_, err := traefikplugin.New(context.Background(), http.NotFoundHandler(), cfg, "on")
	if err == nil || !strings.Contains(err.Error(), "on/yes/true") {
		t.Fatalf("ttl: on (decoded as %q): New error %v, want one naming the YAML true", cfg.Idempotency.TTL, err)
	}
}
