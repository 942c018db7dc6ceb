package envoyfilter_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/validitysuite"
)

// TestValidate is the answer-validation acceptance (validitysuite.Run)
// through the ext_proc server behind the Envoy-side driver; 50 requests a
// route, 2,000 with LLMHEDGE_BENCH=1.
func TestValidate(t *testing.T) {
	validitysuite.Run(t, 50, 2000, 10, func(t *testing.T, aURL, bURL string) validitysuite.Routes {
		route := func(extra string, urls ...string) string {
			s := "\n  - name: chat\n    upstreams:\n"
			for i, u := range urls {
				s += fmt.Sprintf("      - {name: %s, url: %q}\n", []string{"A", "B"}[i], u)
			}
			return s + "    delay: 500ms\n" + extra
		}
		return validitysuite.Routes{
			Validated:       validityFront(t, route("    validate: [json_schema]\n", aURL, bURL)),
			Plain:           validityFront(t, route("", aURL, bURL)),
			Direct:          validityFront(t, route("", bURL)),
			DirectValidated: validityFront(t, route("    validate: [json_schema]\n", bURL)),
		}
	})
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
