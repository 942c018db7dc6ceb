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
	aURL, bURL := validitysuite.Sims(t)
	site := func(extra string, urls ...string) string {
		s := "\tllm_hedge {\n"
		for i, u := range urls {
			s += fmt.Sprintf("\t\tupstream %s {\n\t\t\tname %s\n\t\t}\n", u, []string{"A", "B"}[i])
		}
		return s + "\t\tdelay 500ms\n" + extra + "\t}"
	}
	c := startCaddy(t, "",
		site("\t\tvalidate json_schema\n", aURL, bURL),
		site("", aURL, bURL),
		site("", bURL),
		site("\t\tvalidate json_schema\n", bURL))
	ctx := testContext(t)
	n := validitysuite.Count(50, 2000)
	validitysuite.Check(t, validitysuite.Load(ctx, n, 10, c.url(0), c.url(1), c.url(2), c.url(3)))
}
