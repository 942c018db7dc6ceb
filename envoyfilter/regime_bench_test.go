package envoyfilter_test

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/regimeload"
)

// TestBenchRegimeShift is regimeload's regime-shift benchmark through the
// Envoy-side driver and the ext_proc server, each route under /<route>/v1/;
// its long form (regimeload.EnvOptions) is LLMHEDGE_BENCH=1 go test -run
// TestBenchRegimeShift -v ./envoyfilter.
func TestBenchRegimeShift(t *testing.T) {
	regimeload.Bench(t, "envoy ext_proc (driver)", startRegimeRoutes, regimeload.EnvOptions(1.25, 0))
}

// TestBenchIncident is regimeload's incident benchmark through
// the Envoy-side driver and the ext_proc server: every run starts a fresh
// server (startRegimeRoutes, in process). Its long form
// (regimeload.IncidentEnvOptions) is LLMHEDGE_BENCH=1 go test -run
// TestBenchIncident -v ./envoyfilter.
func TestBenchIncident(t *testing.T) {
	regimeload.Incident(t, "envoy ext_proc (driver)", startRegimeRoutes, regimeload.IncidentEnvOptions())
}

// startRegimeRoutes serves the benchmark's routes from one ext_proc server
// behind the driver.
func startRegimeRoutes(t *testing.T, routes []regimeload.Route) map[string]string {
	var yaml strings.Builder
	yaml.WriteString("metrics: {listen: \"off\"}\nlog: {requests: false}\nroutes:\n")
	for _, r := range routes {
		prefer := ""
		if r.PreferA != 0 {
			prefer = fmt.Sprintf(", prefer_margin: %g", r.PreferA)
		}
		fmt.Fprintf(&yaml, `  - name: %s
    match: {path_prefixes: [/%s/]}
    primary: %s
    upstreams: [{name: A, url: %q%s}, {name: B, url: %q}]
    delay: {mode: adaptive, fixed: %s}
    report_header: %s
`, r.Name, r.Name, r.Primary, r.A, prefer, r.B, r.Delay, regimeload.ReportHeader)
		// A field left 0 is not written: the engine's default holds.
		if r.Burst != 0 {
			fmt.Fprintf(&yaml, "    budget: {burst: %g}\n", r.Burst)
		}
		if r.MaxAttempts != 0 {
			fmt.Fprintf(&yaml, "    max_attempts: %d\n", r.MaxAttempts)
		}
	}
	cfg, err := envoyfilter.ParseConfig([]byte(yaml.String()))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := envoyfilter.NewServer(cfg, envoyfilter.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gs, conn := serveGRPC(t, srv)
	t.Cleanup(gs.Stop)
	t.Cleanup(func() { conn.Close() })
	front := httptest.NewServer(envoydriver.New(conn, envoydriver.Config{}))
	t.Cleanup(front.Close)
	bases := map[string]string{}
	for _, r := range routes {
		bases[r.Name] = front.URL + "/" + r.Name + "/v1/"
	}
	return bases
}
