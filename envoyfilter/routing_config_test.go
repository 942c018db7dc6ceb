package envoyfilter_test

import (
	"testing"

	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/configcheck"
)

// primary: fastest and an upstream's prefer_margin (a number or a
// percentage string) reach the route's engine configuration.
func TestPrimaryAndPreferMarginConfig(t *testing.T) {
	cfg, err := envoyfilter.ParseConfig([]byte(`
routes:
  - name: chat
    primary: fastest
    upstreams:
      - {name: cheap, url: "http://127.0.0.1:9001", prefer_margin: 25%}
      - {name: other, url: "http://127.0.0.1:9002", prefer_margin: 0.1}
`))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cfg.Routes[0].CoreConfig()
	if err != nil {
		t.Fatal(err)
	}
	configcheck.PrimaryFastestMargins(t, cc)
	if _, err := envoyfilter.ParseConfig([]byte("routes:\n  - name: chat\n    primary: quickest\n    upstreams: [{url: \"http://127.0.0.1:9001\"}]\n")); err == nil {
		t.Fatal("primary: quickest was accepted, want an error")
	}
}
