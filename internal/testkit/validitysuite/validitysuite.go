// Package validitysuite holds what every adapter's TestValidate shares: the
// two upstreams of the answer-validation acceptance, its load and its
// checks (Run). Each adapter serves the four routes (A+B with and without
// validate, B alone with and without) in its own configuration.
package validitysuite

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// Sims starts the acceptance's upstreams, closed at t's cleanup: A answers
// schema-invalid JSON after 5 ms, B valid JSON after 40 ms (streams: 4
// chunks 2 ms apart).
func Sims(t *testing.T) (aURL, bURL string) {
	t.Helper()
	a := &llmsim.Structured{Name: "A", Valid: false, Delay: 5 * time.Millisecond, Gap: 2 * time.Millisecond}
	b := &llmsim.Structured{Name: "B", Valid: true, Delay: 40 * time.Millisecond, Gap: 2 * time.Millisecond}
	as, bs := llmsim.StartStructured(a), llmsim.StartStructured(b)
	t.Cleanup(as.Close)
	t.Cleanup(bs.Close)
	return as.URL, bs.URL
}

// Count is how many requests each route of TestValidate sends: ci in CI,
// bench in the full form (LLMHEDGE_BENCH=1).
func Count(ci, bench int) int {
	if os.Getenv("LLMHEDGE_BENCH") == "1" {
		return bench
	}
	return ci
}

// Routes are the base URLs of the acceptance's four routes: A+B with and
// without validate, B alone without and with it.
type Routes struct {
	Validated, Plain, Direct, DirectValidated string
}

// Start serves the four routes over upstreams A (aURL) and B (bURL), each
// upstream named as its letter, with a 500ms hedge delay, and returns
// their base URLs. The proxy stops at the end of the test.
type Start func(t *testing.T, aURL, bURL string) Routes

// Run is an adapter's TestValidate: it starts the upstreams, has start
// serve the routes, sends Count(ci, bench) requests to each, clients at a
// time, within 5 minutes, and checks the acceptance (Check).
func Run(t *testing.T, ci, bench, clients int, start Start) {
	aURL, bURL := Sims(t)
	r := start(t, aURL, bURL)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	Check(t, Load(ctx, Count(ci, bench), clients, r.Validated, r.Plain, r.Direct, r.DirectValidated))
}

// Results are the four routes' loads of n requests each.
type Results struct {
	N int
	// Validated and Plain went to A+B with and without validate; Direct
	// and DirectValidated to B alone without and with it.
	Validated, Plain, Direct, DirectValidated *llmsim.StructuredResult
}

// Load sends n requests, clients at a time, to each route (its base URL):
// A+B with and without validate, B alone without and with it.
func Load(ctx context.Context, n, clients int, validated, plain, direct, directValidated string) Results {
	client := &http.Client{}
	return Results{N: n,
		Validated:       llmsim.StructuredLoad(ctx, client, validated, n, clients),
		Plain:           llmsim.StructuredLoad(ctx, client, plain, n, clients),
		Direct:          llmsim.StructuredLoad(ctx, client, direct, n, clients),
		DirectValidated: llmsim.StructuredLoad(ctx, client, directValidated, n, clients)}
}

// Check logs the four summaries and checks the acceptance: with validate no
// answer is invalid and all are valid, without it A's fast invalid answer
// always wins, and B alone with validate answers every request validly.
func Check(t *testing.T, r Results) {
	t.Helper()
	n := r.N
	t.Logf("A+B, validate:        %s", r.Validated.Summary())
	t.Logf("A+B, no validate:     %s", r.Plain.Summary())
	t.Logf("B alone, no validate: %s", r.Direct.Summary())
	t.Logf("B alone, validate:    %s", r.DirectValidated.Summary())
	if r.Validated.Invalid != 0 {
		t.Errorf("with validate: %d of %d answers invalid, want 0", r.Validated.Invalid, n)
	} else if r.Validated.Valid != n {
		t.Errorf("with validate: %d of %d answers valid (%d failed: %v), want all", r.Validated.Valid, n, r.Validated.Failed, r.Validated.Errors)
	}
	if r.Plain.Invalid != n {
		t.Errorf("without validate: %d of %d answers invalid, want all (A's fast answer wins)", r.Plain.Invalid, n)
	}
	if r.DirectValidated.Valid != n {
		t.Errorf("B alone with validate: %d of %d answers valid (%d failed: %v), want all", r.DirectValidated.Valid, n, r.DirectValidated.Failed, r.DirectValidated.Errors)
	}
}
