package envoyfilter_test

import (
	"fmt"
	"net/http/httptest"
	"os"
	"runtime"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/chaos"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
)

// TestChaos runs the fault-injection suite (internal/testkit/chaos) through the
// ext_proc server behind the Envoy-side driver: the server's zap logger at
// debug level is captured for the canary check, its goroutines counted in
// process. LLMHEDGE_CHAOS=full runs 10,000 scenarios.
func TestChaos(t *testing.T) {
	env := chaos.NewEnv(t)
	cfg, err := envoyfilter.ParseConfig([]byte(fmt.Sprintf(`
metrics: {listen: "off"}
log: {level: debug, requests: true}
routes:
  - name: chaos
    match: {path_prefixes: [/v1/]}
    upstreams:
      - {name: A, url: %q}
      - {name: B, url: %q, set_headers: {Authorization: %q}}
    delay: %s
    timeout: %s
    max_attempts: %d
    budget: {ratio: -1, max_concurrent_hedges: -1, cool_down: 1ms, max_cool_down: 1ms,
             overload_rate: 1, breaker_failures: 1000000, breaker_open: 1ms}
`, env.URLA, env.URLB, env.AuthB, chaos.Delay, chaos.Timeout, chaos.MaxAttempts)))
	if err != nil {
		t.Fatal(err)
	}
	logs := &proc.Buffer{}
	logger := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.AddSync(logs), zap.DebugLevel))
	transport, err := core.NewTransport(cfg.Transport.TransportConfig, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := envoyfilter.NewServer(cfg, envoyfilter.Options{Logger: logger, Transport: transport})
	if err != nil {
		t.Fatal(err)
	}
	gs, conn := serveGRPC(t, srv)
	driver := envoydriver.New(conn, envoydriver.Config{Upstream: env.URLA})
	front := httptest.NewServer(driver)
	t.Cleanup(func() {
		front.CloseClientConnections()
		front.Close()
		driver.Close()
		conn.Close()
		gs.Stop()
		transport.CloseIdleConnections()
	})
	chaos.Run(t, env, chaos.Target{
		Name:       "envoy",
		BaseURL:    front.URL,
		PID:        os.Getpid(),
		InProcess:  true,
		Goroutines: func() (int, error) { return runtime.NumGoroutine(), nil },
		CloseIdle:  transport.CloseIdleConnections,
		Logs:       logs.String,
	}, chaos.Requests(), chaos.Seed())
}
