// Command caddy-llmhedge is Caddy with its standard modules and the
// llm_hedge handler: `go build` of this package gives the same binary as
// `xcaddy build --with github.com/llmhedge/llmhedge/caddymodule`.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// Caddy's standard modules, as in the official distribution.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// The llm_hedge handler and Caddyfile directive.
	_ "github.com/llmhedge/llmhedge/caddymodule"
)

func main() {
	caddycmd.Main()
}
