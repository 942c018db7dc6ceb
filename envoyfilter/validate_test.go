package envoyfilter_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// TestValidate: through the ext_proc server behind the Envoy-side driver,
// with `validate: [json_schema]` the client never receives the fast
// upstream's schema-invalid answer; without it the invalid fast answer
// wins (today's behaviour). Routes to the valid upstream alone, with and
// without validate, give the cost of the check. 50 requests a route, 2,000 with LLMHEDGE_BENCH=1.
func TestValidate(t *testing.T) {
	n := 50
	if os.Getenv("LLMHEDGE_BENCH") == "1" {
		n = 2000
	}
	a := &llmsim.Structured{Name: "A", Valid: false, Delay: 5 * time.Millisecond, Gap: 2 * time.Millisecond}
	b := &llmsim.Structured{Name: "B", Valid: true, Delay: 40 * time.Millisecond, Gap: 2 * time.Millisecond}
	as, bs := llmsim.StartStructured(a), llmsim.StartStructured(b)
	defer as.Close()
	defer bs.Close()
	route := func(extra string, urls ...string) string {
		s := "\n  - name: chat\n    upstreams:\n"
		for i, u := range urls {
			s += fmt.Sprintf("      - {name: %s, url: %q}\n", []string{"A", "B"}[i], u)
		}
		return s + "    delay: 500ms\n" + extra
	}
	validatedURL := validityFront(t, route("    validate: [json_schema]\n", as.URL, bs.URL))
	plainURL := validityFront(t, route("", as.URL, bs.URL))
	directURL := validityFront(t, route("", bs.URL))
	directValidatedURL := validityFront(t, route("    validate: [json_schema]\n", bs.URL))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client := &http.Client{}
	validated := llmsim.StructuredLoad(ctx, client, validatedURL, n, 10)
	plain := llmsim.StructuredLoad(ctx, client, plainURL, n, 10)
	direct := llmsim.StructuredLoad(ctx, client, directURL, n, 10)
	directValidated := llmsim.StructuredLoad(ctx, client, directValidatedURL, n, 10)
	t.Logf("A+B, validate [json_schema]: %s", validated.Summary())
	t.Logf("A+B, no validate:            %s", plain.Summary())
	t.Logf("B alone, no validate:        %s", direct.Summary())
	t.Logf("B alone, validate:           %s", directValidated.Summary())
	if directValidated.Valid != n {
		t.Errorf("B alone with validate: %d of %d answers valid (%d failed: %v), want all", directValidated.Valid, n, directValidated.Failed, directValidated.Errors)
	}
	if validated.Invalid != 0 {
		t.Errorf("with validate: %d of %d answers invalid, want 0", validated.Invalid, n)
	} else if validated.Valid != n {
		t.Errorf("with validate: %d of %d answers valid (%d failed: %v), want all", validated.Valid, n, validated.Failed, validated.Errors)
	}
	if plain.Invalid != n {
		t.Errorf("without validate: %d of %d answers invalid, want all (A's fast answer wins)", plain.Invalid, n)
	}
}

// validityFront serves an ext_proc server with these routes behind the
// driver and returns the driver's URL.
func validityFront(t *testing.T, routes string) string {
	t.Helper()
	cfg, err := envoyfilter.ParseConfig([]byte("metrics: {listen: \"off\"}\nlog: {requests: false}\nenvoy: {}\nroutes:" + routes))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, routes)
	}
	srv, err := envoyfilter.NewServer(cfg, envoyfilter.Options{})
	if err != nil {
		t.Fatal(err)
	}
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not routed to the ext_proc server: "+strings.TrimSpace(r.URL.Path), http.StatusTeapot)
	}))
	gs, conn := serveGRPC(t, srv)
	driver := envoydriver.New(conn, envoydriver.Config{Upstream: other.URL})
	front := httptest.NewServer(driver)
	t.Cleanup(func() {
		front.CloseClientConnections()
		front.Close()
		driver.Close()
		conn.Close()
		gs.Stop()
		other.Close()
	})
	return front.URL
}

// The Envoy server's YAML spells the options as the README says: a list of
// checks, an unquoted 502, the schema as a mapping.
func TestValidateYAML(t *testing.T) {
	cfg, err := envoyfilter.ParseConfig([]byte(`metrics: {listen: "off"}
routes:
  - name: chat
    upstreams: [{url: "http://127.0.0.1:1"}]
    validate: [json_schema, finish]
    validate_failure: 502
    validate_schema: {type: object, required: [city]}
`))
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Routes[0]
	if got := strings.Join(r.ValidateChecks, ","); got != "json_schema,finish" {
		t.Fatalf("validate = %q, want json_schema,finish", got)
	} else if r.ValidateFailure != "502" {
		t.Fatalf("validate_failure = %q, want \"502\"", r.ValidateFailure)
	} else if r.ValidateSchema != `{"required":["city"],"type":"object"}` {
		t.Fatalf("validate_schema = %q, want the mapping as JSON text", r.ValidateSchema)
	}
}
