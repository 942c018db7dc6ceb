package envoyfilter_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/llmhedge/llmhedge/core/llmsim"
	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/envoyfilter/envoydriver"
)

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "llmhedge-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// The process wrapper: TLS on the gRPC listener, the health service, the
// Prometheus endpoint, and the drain.
func TestAppTLSHealthMetricsAndDrain(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	wl := llmsim.Reference(1, testScale)
	wl.StallProb = noStalls
	a, b := llmsim.Start("A", wl), llmsim.Start("B", wl)
	defer a.Close()
	defer b.Close()
	path := filepath.Join(dir, "extproc.yaml")
	os.WriteFile(path, []byte(`
grpc: {listen: "127.0.0.1:0", tls: {cert_file: "`+certFile+`", key_file: "`+keyFile+`"}}
metrics: {listen: "127.0.0.1:0"}
log: {level: warn}
routes:
  - name: chat
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: A, url: "`+a.URL+`"}, {name: B, url: "`+b.URL+`"}]
    delay: 100ms
`), 0o600)
	cfg, err := envoyfilter.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	app, err := envoyfilter.NewApp(path, cfg, zap.NewNop(), zap.NewAtomicLevel(), envoyfilter.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Start(); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(app.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health, err := healthpb.NewHealthClient(conn).Check(context.Background(),
		&healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
	if err != nil || health.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %v, %v", health, err)
	}

	driver := envoydriver.New(conn, envoydriver.Config{})
	front := httptest.NewServer(driver)
	defer front.Close()
	h := &harness{t: t, front: front}
	text, from, err := streamChat(context.Background(), h.client(), simHeaders("tls-1", "A=ttft:2s")...)
	if err != nil || text != llmsim.ExpectedChatText("tls-1", tokens) || !from["B"] {
		t.Fatalf("%q from %v, %v", text, from, err)
	}
	// The client has the whole answer before the ext_proc stream ends and
	// its report and stream kind are counted: wait for the stream to close.
	waitFor(t, "the ext_proc stream to end", func() bool { return app.Server.InFlight() == 0 })

	resp, err := http.Get("http://" + app.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`llm_hedge_requests_total{outcome="ok",route="chat"} 1`,
		`llm_hedge_attempts_total{result="lost",role="primary",route="chat",upstream="A"} 1`,
		`llm_hedge_attempts_total{result="won",role="hedge",route="chat",upstream="B"} 1`,
		`llm_hedge_hedges_started_total{route="chat"} 1`,
		`llm_hedge_hedge_wins_total{route="chat"} 1`,
		`llm_hedge_ttft_seconds_count{route="chat",upstream="B"} 1`,
		`llm_hedge_loser_cancel_seconds_count{route="chat",upstream="A"} 1`,
		`llm_hedge_current_delay_seconds{route="chat"} 0.1`,
		`llm_hedge_hedges_in_flight{route="chat"} 0`,
		`llm_hedge_extproc_streams_total{kind="hedged"} 1`,
		`llm_hedge_wasted_prompt_tokens_total{route="chat"}`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	driver.Close()
	app.Shutdown(5 * time.Second)
	if n := app.Server.InFlight(); n != 0 {
		t.Fatalf("%d streams open after the drain", n)
	}
}
