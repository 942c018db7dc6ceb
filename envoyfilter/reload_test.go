package envoyfilter_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/testcert"
)

const onlyA = `
  - name: chat
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: A, url: "{A}"}]
    delay: 10s
`

const onlyB = `
  - name: chat
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: B, url: "{B}"}]
    delay: 10s
`

// A reload applies to new requests at once; a request in flight finishes
// with the configuration it started with; a bad reload changes nothing.
func TestReloadKeepsStreamsInFlight(t *testing.T) {
	release := make(chan struct{})
	h := newHarness(t, harnessOptions{routes: onlyA, behaveA: func(r *http.Request) llmsim.Behavior {
		if r.Header.Get(llmsim.HeaderRequest) == "held-1" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		return llmsim.Behavior{}
	}})
	type result struct {
		text string
		from map[string]bool
		err  error
	}
	held := make(chan result, 1)
	go func() {
		text, from, err := streamChat(context.Background(), h.client(), simHeaders("held-1", "")...)
		held <- result{text, from, err}
	}()
	waitSim(t, h.A, "the held request", func() bool { return h.A.Served() == 1 })

	if err := h.srv.Reload(h.config("", onlyB)); err != nil {
		t.Fatal(err)
	}
	text, from, err := streamChat(context.Background(), h.client(), simHeaders("new-1", "")...)
	if err != nil {
		t.Fatalf("after the reload: %v", err)
	} else if !from["B"] {
		t.Fatalf("after the reload: %q from %v, %v", text, from, err)
	} else if from["A"] {
		t.Fatalf("after the reload: %q from %v, %v", text, from, err)
	} else if text != llmsim.ExpectedChatText("new-1", tokens) {
		t.Fatalf("after the reload: text = %q, want %q", text, llmsim.ExpectedChatText("new-1", tokens))
	}

	bad := *h.config("", onlyB)
	bad.Routes = []envoyfilter.RouteConfig{{Name: "broken"}}
	if err := h.srv.Reload(&bad); err == nil {
		t.Fatal("a route without upstreams was accepted")
	}
	if _, from, err := streamChat(context.Background(), h.client(), simHeaders("new-2", "")...); err != nil {
		t.Fatalf("after the bad reload: %v", err)
	} else if !from["B"] {
		t.Fatalf("after the bad reload: from %v, %v", from, err)
	}

	close(release)
	r := <-held
	if r.err != nil {
		t.Fatalf("the request in flight: r.err = %v, want nil", r.err)
	} else if !r.from["A"] {
		t.Fatalf("the request in flight: %q from %v, %v", r.text, r.from, r.err)
	} else if r.from["B"] {
		t.Fatalf("the request in flight: %q from %v, %v", r.text, r.from, r.err)
	} else if r.text != llmsim.ExpectedChatText("held-1", tokens) {
		t.Fatalf("the request in flight: r.text = %q, want %q", r.text, llmsim.ExpectedChatText("held-1", tokens))
	}
}

// writeConfig writes an App's configuration file.
func writeConfig(t *testing.T, path, yaml string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
}

// checkHealth runs a health check over TLS trusting only pool.
func checkHealth(addr string, pool *x509.CertPool) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// The first SIGHUP after the TLS paths changed serves the certificate at
// the new paths; every setting a reload cannot apply is named in the
// warning.
func TestReloadLoadsNewTLSPathsAndNamesRestartOnlySettings(t *testing.T) {
	dir := t.TempDir()
	cert1, key1, pool1 := selfSigned(t, t.TempDir())
	cert2, key2, pool2 := selfSigned(t, t.TempDir())
	path := filepath.Join(dir, "extproc.yaml")
	config := func(listen, cert, key, rest string) string {
		return `
grpc: {listen: "` + listen + `", tls: {cert_file: "` + cert + `", key_file: "` + key + `"}}
metrics: {listen: "off"}
routes: [{name: chat, upstreams: [{url: "http://127.0.0.1:1"}]}]
` + rest
	}
	writeConfig(t, path, config("127.0.0.1:0", cert1, key1, ""))
	logCore, logs := observer.New(zap.InfoLevel)
	app, _ := startApp(t, path, zap.New(logCore), envoyfilter.Options{Transport: http.DefaultTransport})
	defer app.Shutdown(time.Second)
	if err := checkHealth(app.GRPCAddr(), pool1); err != nil {
		t.Fatalf("health check with the first certificate: %v", err)
	}

	writeConfig(t, path, config("127.0.0.1:1", cert2, key2,
		"log: {format: console}\ntransport: {dial_timeout: 1s}\nenvoy: {body_chunk: 16KiB}\n"))
	if err := app.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := checkHealth(app.GRPCAddr(), pool2); err != nil {
		t.Fatalf("after one reload, the certificate at the new paths is not served: %v", err)
	}
	warnings := logs.FilterMessage("restart-only settings changed; they keep their running values until a restart").All()
	if len(warnings) != 1 {
		t.Fatalf("%d restart-only warnings, want 1", len(warnings))
	}
	got := fmt.Sprint(warnings[0].ContextMap()["fields"])
	if want := "[grpc.listen log.format transport]"; got != want {
		t.Fatalf("restart-only warning names %s, want %s", got, want)
	}
}

// clientCert writes a self-signed client certificate (its own CA) and
// returns the file and the pair for a client.
func clientCert(t *testing.T, dir string) (caFile string, pair tls.Certificate) {
	c := testcert.Client(t)
	return testcert.WritePEM(t, filepath.Join(dir, "client.pem"), c.DER), c.Pair()
}

// mTLS: only the client certificate the loaded client_ca_file names gets
// in, and a reload that points client_ca_file at another file switches.
func TestReloadSwitchesClientCAs(t *testing.T) {
	dir := t.TempDir()
	cert, key, pool := selfSigned(t, dir)
	caA, clientA := clientCert(t, t.TempDir())
	caB, clientB := clientCert(t, t.TempDir())
	path := filepath.Join(dir, "extproc.yaml")
	config := func(ca string) string {
		return `
grpc: {listen: "127.0.0.1:0", tls: {cert_file: "` + cert + `", key_file: "` + key + `", client_ca_file: "` + ca + `"}}
metrics: {listen: "off"}
routes: [{name: chat, upstreams: [{url: "http://127.0.0.1:1"}]}]
`
	}
	writeConfig(t, path, config(caA))
	app, _ := startApp(t, path, zap.NewNop(), envoyfilter.Options{})
	defer app.Shutdown(time.Second)
	check := func(client tls.Certificate) error {
		conn, err := grpc.NewClient(app.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(
			&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{client}})))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(clientA); err != nil {
		t.Fatalf("client A with client_ca_file A: %v", err)
	}
	if err := check(clientB); err == nil {
		t.Fatal("client B got in with client_ca_file A")
	}
	writeConfig(t, path, config(caB))
	if err := app.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := check(clientB); err != nil {
		t.Fatalf("client B after the reload to client_ca_file B: %v", err)
	}
	if err := check(clientA); err == nil {
		t.Fatal("client A still gets in after the reload to client_ca_file B")
	}
}
