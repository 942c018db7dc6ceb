package envoyfilter_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/testcert"
)

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	c := testcert.Server(t)
	certFile, keyFile = c.WriteFiles(t, dir)
	return certFile, keyFile, c.Pool(t)
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
	app, _ := startApp(t, path, zap.NewNop(), envoyfilter.Options{})
	conn, err := grpc.NewClient(app.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health, err := healthpb.NewHealthClient(conn).Check(context.Background(),
		&healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
	if err != nil {
		t.Fatal(err)
	} else if health.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health.GetStatus() = %v, want %v", health.GetStatus(), healthpb.HealthCheckResponse_SERVING)
	}

	driver := envoydriver.New(conn, envoydriver.Config{})
	front := httptest.NewServer(driver)
	defer front.Close()
	h := &harness{t: t, front: front}
	// A never sends a token: only the hedge can answer, however slow the machine.
	text, from, err := streamChat(context.Background(), h.client(), simHeaders("tls-1", "A=stall")...)
	if err != nil {
		t.Fatal(err)
	} else if text != llmsim.ExpectedChatText("tls-1", tokens) {
		t.Fatalf("text = %q, want %q", text, llmsim.ExpectedChatText("tls-1", tokens))
	} else if !from["B"] {
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
		`llm_hedge_hedge_wins_total{role="hedge",route="chat",upstream="B"} 1`,
		`llm_hedge_ttft_seconds_count{route="chat"} 1`,
		`llm_hedge_upstream_ttft_seconds_count{route="chat",upstream="B"} 1`,
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

// graceClock hands the drain's health-grace timer (the AfterFunc of
// exactly grace) to the test, which fires it; other timers run on the real
// clock.
type graceClock struct {
	grace time.Duration
	timer chan func()
}

func (c *graceClock) Now() time.Time { return time.Now() }

func (c *graceClock) AfterFunc(d time.Duration, f func()) core.Timer {
	if d != c.grace {
		return time.AfterFunc(d, f)
	}
	c.timer <- f
	return heldTimer{}
}

type heldTimer struct{}

func (heldTimer) Stop() bool { return false }

// logMessages is a logger that also sends every message to a channel.
func logMessages() (*zap.Logger, chan string) {
	msgs := make(chan string, 256)
	logCore, _ := observer.New(zap.InfoLevel)
	return zap.New(logCore, zap.Hooks(func(e zapcore.Entry) error {
		select {
		case msgs <- e.Message:
		default:
		}
		return nil
	})), msgs
}

func waitMessage(t *testing.T, msgs <-chan string, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m := <-msgs:
			if m == want {
				return
			}
		case <-timeout:
			t.Fatalf("no %q log within 10s", want)
		}
	}
}

// SIGTERM: health turns NOT_SERVING at once, new connections and streams
// are still served during shutdown.health_grace, then the listener closes
// and the stream in flight finishes.
func TestDrainHealthGraceBeforeTheListenerCloses(t *testing.T) {
	release := make(chan struct{})
	wl := llmsim.Reference(1, testScale)
	wl.StallProb = noStalls
	up := (&llmsim.Server{Name: "A", Workload: wl, Behave: func(r *http.Request) llmsim.Behavior {
		if r.Header.Get(llmsim.HeaderRequest) == "held" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		return llmsim.Behavior{}
	}}).Start()
	defer up.Close()
	path := filepath.Join(t.TempDir(), "extproc.yaml")
	os.WriteFile(path, []byte(`
grpc: {listen: "127.0.0.1:0"}
metrics: {listen: "off"}
shutdown: {health_grace: 5s, drain_timeout: 30s}
routes:
  - name: chat
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: A, url: "`+up.URL+`"}]
    delay: 10s
`), 0o600)
	cfg, err := envoyfilter.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	clock := &graceClock{grace: 5 * time.Second, timer: make(chan func(), 1)}
	log, msgs := logMessages()
	app, err := envoyfilter.NewApp(path, cfg, log, zap.NewAtomicLevel(), envoyfilter.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	signals := make(chan os.Signal, 1)
	ran := make(chan error, 1)
	go func() { ran <- app.Run(signals) }()
	waitMessage(t, msgs, "llmhedge-extproc serving")
	addr := app.GRPCAddr()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	driver := envoydriver.New(conn, envoydriver.Config{})
	defer driver.Close()
	front := httptest.NewServer(driver)
	defer front.Close()
	h := &harness{t: t, front: front}

	type result struct {
		text string
		err  error
		at   time.Time
	}
	held := make(chan result, 1)
	go func() {
		text, _, err := streamChat(context.Background(), h.client(), simHeaders("held", "")...)
		held <- result{text, err, time.Now()}
	}()
	waitSim(t, up, "the held request", func() bool { return up.Served() == 1 })

	sigterm := time.Now()
	signals <- syscall.SIGTERM
	var endGrace func()
	select {
	case endGrace = <-clock.timer:
	case err := <-ran:
		t.Fatalf("Run returned (%v) without a health grace", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no health grace timer within 10s")
	}
	healthFlipped := time.Now()
	// A health check on a new connection: the listener still accepts,
	// and Envoy's health checker learns the server is leaving.
	checkConn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := healthpb.NewHealthClient(checkConn).Check(context.Background(),
		&healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
	checkConn.Close()
	if err != nil {
		t.Fatalf("health during the grace: %v", err)
	} else if resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health during the grace: resp.GetStatus() = %v, want %v", resp.GetStatus(), healthpb.HealthCheckResponse_NOT_SERVING)
	}
	// A new stream in the grace is served in full.
	text, _, err := streamChat(context.Background(), h.client(), simHeaders("in-grace", "")...)
	if err != nil {
		t.Fatalf("a stream opened during the grace: %v", err)
	} else if text != llmsim.ExpectedChatText("in-grace", tokens) {
		t.Fatalf("a stream opened during the grace: text = %q, want %q", text, llmsim.ExpectedChatText("in-grace", tokens))
	}
	lastAccepted := time.Now()

	endGrace()
	waitMessage(t, msgs, "listener closed; no new connections")
	listenerClosed := time.Now()
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatal("the listener still accepts connections after the grace")
	}
	select {
	case err := <-ran:
		t.Fatalf("Run returned (%v) with a stream in flight", err)
	default:
	}
	close(release)
	r := <-held
	if r.err != nil {
		t.Fatalf("the stream in flight at SIGTERM: r.err = %v, want nil", r.err)
	} else if r.text != llmsim.ExpectedChatText("held", tokens) {
		t.Fatalf("the stream in flight at SIGTERM: r.text = %q, want %q", r.text, llmsim.ExpectedChatText("held", tokens))
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	since := func(at time.Time) time.Duration { return at.Sub(sigterm).Round(time.Microsecond) }
	t.Logf("drain timeline after SIGTERM: health NOT_SERVING +%v, last stream accepted and served +%v, "+
		"listener closed +%v, last in-flight stream finished +%v, stopped +%v (the 5s grace fired by the test)",
		since(healthFlipped), since(lastAccepted), since(listenerClosed), since(r.at), since(stopped))
}

// startApp loads the config file at path, builds the App from it and
// starts it (the caller stops it).
func startApp(t *testing.T, path string, log *zap.Logger, opts envoyfilter.Options) (*envoyfilter.App, *envoyfilter.FileConfig) {
	t.Helper()
	cfg, err := envoyfilter.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	app, err := envoyfilter.NewApp(path, cfg, log, zap.NewAtomicLevel(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Start(); err != nil {
		t.Fatal(err)
	}
	return app, cfg
}
