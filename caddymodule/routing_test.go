package caddymodule

import (
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/configcheck"
)

// `primary fastest` and an upstream's `prefer_margin` (a fraction or a
// percentage) reach the engine's configuration.
func TestCaddyfilePrimaryAndPreferMargin(t *testing.T) {
	h, err := parse(t, `llm_hedge {
		primary fastest
		upstream http://127.0.0.1:9001 {
			name cheap
			prefer_margin 25%
		}
		upstream http://127.0.0.1:9002 {
			prefer_margin 0.1
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	configcheck.PrimaryFastestMargins(t, h.Config)
	if err := h.Config.Validate(); err != nil {
		t.Fatal(err)
	}
	_, err = parse(t, `llm_hedge {
		upstream http://127.0.0.1:9001 {
			prefer_margin lots
		}
	}`)
	if err == nil || !strings.Contains(err.Error(), `prefer_margin "lots"`) {
		t.Fatalf("prefer_margin lots: error %v, want one naming the value", err)
	}
}
