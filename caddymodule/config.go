package caddymodule

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/llmhedge/llmhedge/core/config"
)

// coreConfig is cfg with the global placeholders of its upstreams replaced
// by repl. Zero values stay zero: core fills in the defaults.
func coreConfig(cfg config.Config, repl *caddy.Replacer) config.Config {
	out, _ := cfg.ExpandUpstreams(func(v string) (string, error) { return repl.ReplaceKnown(v, ""), nil })
	out.Fleet.URL = repl.ReplaceKnown(out.Fleet.URL, "")
	return out
}
