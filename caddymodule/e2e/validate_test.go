package e2e

import (
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// validityCount is how many requests each route of TestValidate sends:
// 2,000 in the full form (LLMHEDGE_BENCH=1), 50 in CI.
func validityCount() int {
	if os.Getenv("LLMHEDGE_BENCH") == "1" {
		return 2000
	}
	return 50
}

// validitySims are the acceptance's upstreams: A answers schema-invalid
// JSON after 5 ms, B valid JSON after 40 ms (streams: 4 chunks 2 ms apart).
func validitySims(t *testing.T) (a, b *llmsim.Structured, aURL, bURL string) {
	a = &llmsim.Structured{Name: "A", Valid: false, Delay: 5 * time.Millisecond, Gap: 2 * time.Millisecond}
	b = &llmsim.Structured{Name: "B", Valid: true, Delay: 40 * time.Millisecond, Gap: 2 * time.Millisecond}
	as, bs := llmsim.StartStructured(a), llmsim.StartStructured(b)
	t.Cleanup(as.Close)
	t.Cleanup(bs.Close)
	return a, b, as.URL, bs.URL
}

// TestValidate: through real Caddy, with `validate json_schema` the client
// never receives the fast upstream's invalid answer (every answer is B's
// valid one); without it, today's behaviour: the invalid fast answer wins.
// Routes to B alone, with and without validate, give the cost of the
// check: holding a stream until it is complete, and the invalid first
// answer before the retry.
func TestValidate(t *testing.T) {
	_, _, aURL, bURL := validitySims(t)
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
	t.Logf("A+B, validate json_schema: %s", validated.Summary())
	t.Logf("A+B, no validate:          %s", plain.Summary())
	t.Logf("B alone, no validate:      %s", direct.Summary())
	t.Logf("B alone, validate:         %s", directValidated.Summary())
	checkValidity(t, validated, plain, n)
	if directValidated.Valid != n {
		t.Errorf("B alone with validate: %d of %d answers valid (%d failed: %v), want all", directValidated.Valid, n, directValidated.Failed, directValidated.Errors)
	}
}

// checkValidity checks the acceptance's numbers.
func checkValidity(t *testing.T, validated, plain *llmsim.StructuredResult, n int) {
	t.Helper()
	if validated.Invalid != 0 {
		t.Errorf("with validate: %d of %d answers invalid, want 0", validated.Invalid, n)
	} else if validated.Valid != n {
		t.Errorf("with validate: %d of %d answers valid (%d failed: %v), want all", validated.Valid, n, validated.Failed, validated.Errors)
	}
	if plain.Invalid != n {
		t.Errorf("without validate: %d of %d answers invalid, want all (A's fast answer wins)", plain.Invalid, n)
	}
}
