// Package validate decodes the Kubernetes examples of deploy/kubernetes
// strictly (unknown or duplicate fields are errors) into the types the API
// server and Traefik's CRD provider decode them into, and checks that the
// objects refer to each other consistently.
package validate

import (
	"bytes"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	traefikv1alpha1 "github.com/traefik/traefik/v3/pkg/provider/kubernetes/crd/traefikio/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// objects are the decoded objects of the examples, by kind and name.
type objects struct {
	middlewares   map[string]*traefikv1alpha1.Middleware
	ingressRoutes map[string]*traefikv1alpha1.IngressRoute
	deployments   map[string]*appsv1.Deployment
	services      map[string]*corev1.Service
	configMaps    map[string]*corev1.ConfigMap
	secrets       map[string]*corev1.Secret
}

// decodeFile decodes every document of a manifest file into objs, strictly.
func decodeFile(t *testing.T, objs *objects, path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, doc := range bytes.Split(raw, []byte("\n---\n")) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("%s document %d: %v", path, i, err)
		}
		where := filepath.Base(path) + " " + head.Kind
		strict := func(v interface{}) {
			if err := yaml.UnmarshalStrict(doc, v); err != nil {
				t.Fatalf("%s (document %d): %v", where, i, err)
			}
		}
		switch head.APIVersion + " " + head.Kind {
		case "traefik.io/v1alpha1 Middleware":
			o := &traefikv1alpha1.Middleware{}
			strict(o)
			objs.middlewares[o.Name] = o
		case "traefik.io/v1alpha1 IngressRoute":
			o := &traefikv1alpha1.IngressRoute{}
			strict(o)
			objs.ingressRoutes[o.Name] = o
		case "apps/v1 Deployment":
			o := &appsv1.Deployment{}
			strict(o)
			objs.deployments[o.Name] = o
		case "v1 Service":
			o := &corev1.Service{}
			strict(o)
			objs.services[o.Name] = o
		case "v1 ConfigMap":
			o := &corev1.ConfigMap{}
			strict(o)
			objs.configMaps[o.Name] = o
		case "v1 Secret":
			o := &corev1.Secret{}
			strict(o)
			objs.secrets[o.Name] = o
		default:
			t.Fatalf("%s document %d: apiVersion %q kind %q is not one this test knows", path, i, head.APIVersion, head.Kind)
		}
	}
}

func load(t *testing.T) *objects {
	objs := &objects{
		middlewares:   map[string]*traefikv1alpha1.Middleware{},
		ingressRoutes: map[string]*traefikv1alpha1.IngressRoute{},
		deployments:   map[string]*appsv1.Deployment{},
		services:      map[string]*corev1.Service{},
		configMaps:    map[string]*corev1.ConfigMap{},
		secrets:       map[string]*corev1.Secret{},
	}
	files, err := filepath.Glob(filepath.Join("..", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes: %v", err)
	}
	for _, f := range files {
		decodeFile(t, objs, f)
	}
	return objs
}

func TestTraefikMiddlewareAndIngressRoutes(t *testing.T) {
	objs := load(t)
	mw := objs.middlewares["llm-hedge"]
	if mw == nil {
		t.Fatal("no Middleware llm-hedge")
	}
	if _, ok := mw.Spec.Plugin["llmhedge"]; !ok {
		t.Fatalf("Middleware llm-hedge has no plugin llmhedge (plugins: %d)", len(mw.Spec.Plugin))
	}
	if len(objs.ingressRoutes) != 2 {
		t.Fatalf("IngressRoutes = %d, want 2 (traffic and metrics)", len(objs.ingressRoutes))
	}
	for name, ir := range objs.ingressRoutes {
		if len(ir.Spec.Routes) == 0 {
			t.Errorf("IngressRoute %s has no route", name)
		}
		for _, r := range ir.Spec.Routes {
			for _, ref := range r.Middlewares {
				if objs.middlewares[ref.Name] == nil {
					t.Errorf("IngressRoute %s refers to Middleware %q, which is not in the examples", name, ref.Name)
				}
			}
			if len(r.Middlewares) == 0 {
				t.Errorf("IngressRoute %s route %q has no middleware", name, r.Match)
			}
		}
	}
}

func TestExtprocDeploymentAndService(t *testing.T) {
	objs := load(t)
	d := objs.deployments["llmhedge-extproc"]
	if d == nil {
		t.Fatal("no Deployment llmhedge-extproc")
	}
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("containers = %d, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["grpc"] == 0 || ports["metrics"] == 0 {
		t.Fatalf("container ports = %v, want grpc and metrics", ports)
	}
	for what, probe := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
		if probe == nil || probe.GRPC == nil {
			t.Errorf("%s is not a gRPC probe", what)
			continue
		}
		if probe.GRPC.Port != ports["grpc"] {
			t.Errorf("%s port = %d, want the grpc port %d", what, probe.GRPC.Port, ports["grpc"])
		}
	}
	sel := d.Spec.Selector.MatchLabels
	for k, v := range sel {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("pod label %s = %q, want the selector's %q", k, d.Spec.Template.Labels[k], v)
		}
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && objs.configMaps[v.ConfigMap.Name] == nil {
			t.Errorf("volume %s refers to ConfigMap %q, which is not in the examples", v.Name, v.ConfigMap.Name)
		}
	}
	for _, e := range c.EnvFrom {
		if e.SecretRef != nil && objs.secrets[e.SecretRef.Name] == nil {
			t.Errorf("envFrom refers to Secret %q, which is not in the examples", e.SecretRef.Name)
		}
	}
	svc := objs.services["llmhedge-extproc"]
	if svc == nil {
		t.Fatal("no Service llmhedge-extproc")
	}
	for k, v := range svc.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("Service selector %s=%q matches no pod label (pod has %q)", k, v, d.Spec.Template.Labels[k])
		}
	}
	for _, p := range svc.Spec.Ports {
		if p.TargetPort.Type != intstr.String || ports[p.TargetPort.StrVal] == 0 {
			t.Errorf("Service port %s targets %q, not a named container port", p.Name, p.TargetPort.String())
		}
	}
	// Headless: Envoy's STRICT_DNS cluster sees every pod as a host (per-host
	// health checks and drain).
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service llmhedge-extproc clusterIP = %q, want %q (headless)", svc.Spec.ClusterIP, corev1.ClusterIPNone)
	}
	checkFleet(t, objs, d)
}

// checkFleet fails when d runs more than one replica without a fleet, or
// when its fleet's Redis (fleet.url, fleet.password_env) is not one of the
// examples' Services and Secrets.
func checkFleet(t *testing.T, objs *objects, d *appsv1.Deployment) {
	cm := objs.configMaps[d.Name]
	if cm == nil {
		t.Fatalf("no ConfigMap %s", d.Name)
	}
	var cfg struct {
		Fleet struct {
			URL         string `json:"url"`
			PasswordEnv string `json:"password_env"`
		} `json:"fleet"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data[d.Name+".yaml"]), &cfg); err != nil {
		t.Fatalf("ConfigMap %s: %v", cm.Name, err)
	}
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	if replicas > 1 && cfg.Fleet.URL == "" {
		t.Fatalf("Deployment %s runs %d replicas without a fleet: idempotency would be per pod", d.Name, replicas)
	}
	if cfg.Fleet.URL == "" {
		return
	}
	u, err := url.Parse(cfg.Fleet.URL)
	if err != nil {
		t.Fatalf("fleet.url %q: %v", cfg.Fleet.URL, err)
	}
	svc := objs.services[u.Hostname()]
	if svc == nil {
		t.Fatalf("fleet.url %q: no Service %q in the examples", cfg.Fleet.URL, u.Hostname())
	}
	found := false
	for _, p := range svc.Spec.Ports {
		found = found || strconv.Itoa(int(p.Port)) == u.Port()
	}
	if !found {
		t.Errorf("fleet.url %q: Service %s has no port %s", cfg.Fleet.URL, svc.Name, u.Port())
	}
	var backends int
	for _, rd := range objs.deployments {
		match := len(svc.Spec.Selector) > 0
		for k, v := range svc.Spec.Selector {
			match = match && rd.Spec.Template.Labels[k] == v
		}
		if match {
			backends++
		}
	}
	if backends == 0 {
		t.Errorf("Service %s (the fleet's Redis) selects no Deployment of the examples", svc.Name)
	}
	if cfg.Fleet.PasswordEnv == "" {
		return
	}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name != cfg.Fleet.PasswordEnv {
			continue
		}
		if ref := e.ValueFrom; ref == nil || ref.SecretKeyRef == nil || objs.secrets[ref.SecretKeyRef.Name] == nil ||
			objs.secrets[ref.SecretKeyRef.Name].StringData[ref.SecretKeyRef.Key] == "" {
			t.Errorf("env %s is not a key of a Secret of the examples", e.Name)
		}
		return
	}
	t.Errorf("fleet.password_env %s is not in the container's env", cfg.Fleet.PasswordEnv)
}
