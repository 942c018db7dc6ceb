package e2e

import (
	"fmt"
	"net/http"
	"os"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/validitysuite"
)

// validityCount is how many requests each route of TestValidate sends:
// 2,000 in the full form (LLMHEDGE_BENCH=1), 50 in CI.
func validityCount() int {
	if os.Getenv("LLMHEDGE_BENCH") == "1" {
		return 2000
	}
	return 50
}

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
	n := validityCount()
	client := &http.Client{}
	validated := llmsim.StructuredLoad(ctx, client, c.url(0), n, 10)
	plain := llmsim.StructuredLoad(ctx, client, c.url(1), n, 10)
	direct := llmsim.StructuredLoad(ctx, client, c.url(2), n, 10)
	directValidated := llmsim.StructuredLoad(ctx, client, c.url(3), n, 10)
	validitysuite.Check(t, validitysuite.Results{N: n, Validated: validated, Plain: plain, Direct: direct, DirectValidated: directValidated})
}
