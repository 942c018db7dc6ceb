// Package configcheck holds checks of the engine configuration that every
// adapter's config parser must produce from the same settings.
package configcheck

import (
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
)

// PrimaryFastestMargins checks the engine configuration of a route set to
// primary fastest with two upstreams whose prefer_margin are 25% and 0.1.
func PrimaryFastestMargins(t *testing.T, cfg config.Config) {
	t.Helper()
	if cfg.Primary != "fastest" {
		t.Fatalf("Primary = %q, want \"fastest\"", cfg.Primary)
	}
	if len(cfg.Upstreams) != 2 {
		t.Fatalf("%d upstreams, want 2", len(cfg.Upstreams))
	}
	if got := float64(cfg.Upstreams[0].PreferMargin); got != 0.25 {
		t.Fatalf("Upstreams[0].PreferMargin = %v, want 0.25", got)
	}
	if got := float64(cfg.Upstreams[1].PreferMargin); got != 0.1 {
		t.Fatalf("Upstreams[1].PreferMargin = %v, want 0.1", got)
	}
}
