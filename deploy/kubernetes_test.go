package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/traefikplugin"
)

// The Kubernetes types are checked in deploy/kubernetes/validate (a module
// of its own); these tests check what those types carry opaquely: the
// plugin's configuration in the Middleware and the server's configuration
// in the ConfigMap, with the adapters' own decoders.

// manifestDocs returns the documents of a manifest file as JSON.
func manifestDocs(t *testing.T, path string) [][]byte {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs [][]byte
	for _, doc := range bytes.Split(raw, []byte("\n---\n")) {
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		docs = append(docs, j)
	}
	return docs
}

// k8sObject is the part of an object these tests read.
type k8sObject struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Plugin map[string]json.RawMessage `json:"plugin"`
	} `json:"spec"`
	Data map[string]string `json:"data"`
}

func TestKubernetesMiddlewarePluginConfigIsValid(t *testing.T) {
	var found int
	for _, doc := range manifestDocs(t, "kubernetes/traefik-llmhedge.yaml") {
		var o k8sObject
		if err := json.Unmarshal(doc, &o); err != nil {
			t.Fatal(err)
		}
		raw, ok := o.Spec.Plugin["llmhedge"]
		if o.Kind != "Middleware" || !ok {
			continue
		}
		found++
		// Traefik puts the secret's value in place of urn:k8s:secret:…
		// before the plugin sees it.
		raw = []byte(strings.ReplaceAll(string(raw), `"urn:k8s:secret:`, `"Bearer from-secret:`))
		c := traefikplugin.CreateConfig()
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(c); err != nil {
			t.Fatalf("Middleware %s: plugin llmhedge: %v", o.Metadata.Name, err)
		}
		if c.MetricsPath == "" {
			t.Errorf("Middleware %s has no metricsPath: the metrics IngressRoute would scrape nothing", o.Metadata.Name)
		}
		if _, err := traefikplugin.New(context.Background(), http.NotFoundHandler(), c, o.Metadata.Name+"@kubernetescrd"); err != nil {
			t.Fatalf("Middleware %s: %v", o.Metadata.Name, err)
		}
	}
	if found != 1 {
		t.Fatalf("llmhedge Middlewares = %d, want 1", found)
	}
}

func TestKubernetesExtprocConfigIsValid(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-test")
	t.Setenv("OPENAI_BACKUP_API_KEY", "sk-test-2")
	var found int
	for _, doc := range manifestDocs(t, "kubernetes/llmhedge-extproc.yaml") {
		var o k8sObject
		if err := json.Unmarshal(doc, &o); err != nil {
			t.Fatal(err)
		}
		text, ok := o.Data["llmhedge-extproc.yaml"]
		if o.Kind != "ConfigMap" || !ok {
			continue
		}
		found++
		cfg, err := envoyfilter.ParseConfig([]byte(text))
		if err != nil {
			t.Fatalf("ConfigMap %s: %v", o.Metadata.Name, err)
		}
		// The Deployment's ports and probes assume these.
		if cfg.GRPC.Listen != "0.0.0.0:50051" || cfg.Metrics.Listen != "0.0.0.0:9464" {
			t.Errorf("grpc.listen = %q, metrics.listen = %q, want 0.0.0.0:50051 and 0.0.0.0:9464 (the Deployment's ports)", cfg.GRPC.Listen, cfg.Metrics.Listen)
		}
		// Two replicas: a fleet, else idempotency is per pod.
		if cfg.Fleet.URL == "" || cfg.Routes[0].Fleet.URL != cfg.Fleet.URL {
			t.Errorf("fleet.url = %q (route %s: %q), want the fleet's Redis for every route", cfg.Fleet.URL, cfg.Routes[0].Name, cfg.Routes[0].Fleet.URL)
		}
	}
	if found != 1 {
		t.Fatalf("llmhedge-extproc ConfigMaps = %d, want 1", found)
	}
}
