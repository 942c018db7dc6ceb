package e2e

import (
	"fmt"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/validitysuite"
)

// TestValidate: through real Caddy, with `validate json_schema` the client
// never receives the fast upstream's invalid answer (every answer is B's
// valid one); without it, today's behaviour: the invalid fast answer wins.
// Routes to B alone, with and without validate, give the cost of the
// check: holding a stream until it is complete, and the invalid first
// answer before the retry.
func TestValidate(t *testing.T) {
	validitysuite.Run(t, 50, 2000, 10, func(t *testing.T, aURL, bURL string) validitysuite.Routes {
		a := fmt.Sprintf("\t\tupstream %s {\n\t\t\tname A\n\t\t}\n", aURL)
		b := fmt.Sprintf("\t\tupstream %s {\n\t\t\tname B\n\t\t}\n", bURL)
		const validate = "\t\tvalidate json_schema\n"
		site := func(upstreams, extra string) string {
			return "\tllm_hedge {\n" + upstreams + "\t\tdelay 500ms\n" + extra + "\t}"
		}
		c := startCaddy(t, "", site(a+b, validate), site(a+b, ""), site(b, ""), site(b, validate))
		return validitysuite.Routes{Validated: c.url(0), Plain: c.url(1), Direct: c.url(2), DirectValidated: c.url(3)}
	})
}
