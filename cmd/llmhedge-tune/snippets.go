package main

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// snippets are ready configurations with the recommended delay. API keys
// appear only as references to environment variables, in each host's own
// syntax, never as values.
type snippets struct {
	// Caddyfile for Caddy built with the llm_hedge module.
	Caddyfile string `json:"caddyfile"`
	// Traefik is dynamic configuration for the file provider (camelCase;
	// keys through the provider's template function env).
	Traefik string `json:"traefik"`
	// Envoy is the routes section of the llmhedge-extproc configuration
	// (snake_case; keys as ${NAME}, expanded by the server).
	Envoy string `json:"envoy"`
}

// snippetUpstream is one upstream as the snippets list it.
type snippetUpstream struct {
	endpoint
	// header names the key header (Authorization or x-api-key) and prefix
	// goes before the key ("Bearer "); header is "" without key_env.
	header, prefix string
}

// makeSnippets writes the three configurations for the primary, the
// secondary and the other endpoints of the primary's format, in order.
func makeSnippets(eps []endpoint, secondary int, rec *recommendation) *snippets {
	ups := []snippetUpstream{upstreamOf(eps[0])}
	if secondary > 0 {
		ups = append(ups, upstreamOf(eps[secondary]))
	} else {
		// Hedge to the same endpoint: a second, independent request.
		again := upstreamOf(eps[0])
		again.Name += "-hedge"
		ups = append(ups, again)
	}
	var excluded []string
	for i, e := range eps {
		switch {
		case i == 0 || i == secondary:
		case e.Priority: // compared with hedging, not hedged to
		case e.Format == eps[0].Format:
			ups = append(ups, upstreamOf(e))
		default:
			excluded = append(excluded, e.Name)
		}
	}
	header := snippetHeader(rec, excluded)
	return &snippets{
		Caddyfile: caddySnippet(header, ups, rec),
		Traefik:   traefikSnippet(header, ups, rec),
		Envoy:     envoySnippet(header, ups, eps[0].Path(), rec),
	}
}

func upstreamOf(e endpoint) snippetUpstream {
	u := snippetUpstream{endpoint: e}
	if e.KeyEnv != "" {
		if e.Format == formatAnthropic {
			u.header = "x-api-key"
		} else {
			u.header, u.prefix = "Authorization", "Bearer "
		}
	}
	return u
}

// snippetHeader is the comment that says where the numbers come from.
func snippetHeader(rec *recommendation, excluded []string) []string {
	lines := []string{
		fmt.Sprintf("llmhedge-tune: delay %s = p%s of %s's time to first token over %d paired requests;",
			rec.Delay, quantileName(rec.Quantile), rec.Primary, rec.Pairs),
		fmt.Sprintf("expected extra attempts %.1f %%, predicted TTFT p99 %s (no hedge %s).",
			100*rec.ExpectedExtra, formatDuration(time.Duration(rec.Hedged.TTFT.P99)), formatDuration(time.Duration(rec.NoHedge.TTFT.P99))),
	}
	if len(excluded) > 0 {
		lines = append(lines, "Not listed (another API format; one body cannot go to both): "+strings.Join(excluded, ", ")+".")
	}
	return lines
}

// budgetRatio leaves the hedge budget headroom above the target for
// bursts of slowness while still capping the extra load.
func budgetRatio(target float64) float64 {
	return math.Min(1, math.Round(2*target*1000)/1000)
}

func caddySnippet(header []string, ups []snippetUpstream, rec *recommendation) string {
	var b strings.Builder
	comment(&b, "# ", header)
	b.WriteString(":8080 {\n\tllm_hedge {\n")
	for _, u := range ups {
		fmt.Fprintf(&b, "\t\tupstream %s {\n\t\t\tname %s\n", caddyToken(u.Base), caddyToken(u.Name))
		if u.header != "" {
			fmt.Fprintf(&b, "\t\t\theader_up %s %s\n", u.header, caddyToken(u.prefix+"{env."+u.KeyEnv+"}"))
		}
		if u.Model != "" {
			fmt.Fprintf(&b, "\t\t\tmodel %s\n", caddyToken(u.Model))
		}
		b.WriteString("\t\t}\n")
	}
	fmt.Fprintf(&b, "\t\tdelay %s\n", rec.Delay)
	fmt.Fprintf(&b, "\t\t# To follow the primary's TTFT as it drifts, use instead:\n")
	fmt.Fprintf(&b, "\t\t# delay adaptive %s {\n\t\t#\tquantile %s\n\t\t# }\n", rec.Delay, formatFloat(rec.Quantile))
	fmt.Fprintf(&b, "\t\tbudget {\n\t\t\tratio %s\n\t\t}\n", formatFloat(budgetRatio(rec.TargetExtra)))
	b.WriteString("\t}\n}\n")
	return b.String()
}

func traefikSnippet(header []string, ups []snippetUpstream, rec *recommendation) string {
	var b strings.Builder
	comment(&b, "# ", header)
	b.WriteString("# Traefik dynamic configuration (file provider); attach the middleware\n")
	b.WriteString("# llm-hedge to the router of your LLM API.\n")
	b.WriteString("http:\n  middlewares:\n    llm-hedge:\n      plugin:\n        llmhedge:\n          upstreams:\n")
	yamlUpstreams(&b, "            ", "setHeaders", ups, func(u snippetUpstream) string {
		// Single quotes: the template's own double quotes stay intact.
		return fmt.Sprintf(`'%s{{ env "%s" }}'`, u.prefix, u.KeyEnv)
	})
	fmt.Fprintf(&b, "          delay: %s\n", yamlString(rec.Delay))
	fmt.Fprintf(&b, "          # or: delayMode: adaptive, delayQuantile: %s\n", formatFloat(rec.Quantile))
	fmt.Fprintf(&b, "          budget:\n            ratio: %s\n", formatFloat(budgetRatio(rec.TargetExtra)))
	return b.String()
}

func envoySnippet(header []string, ups []snippetUpstream, path string, rec *recommendation) string {
	var b strings.Builder
	comment(&b, "# ", header)
	b.WriteString("# Routes section of the llmhedge-extproc configuration.\n")
	fmt.Fprintf(&b, "routes:\n  - name: llm\n    match:\n      path_prefixes: [%s]\n    upstreams:\n", yamlString(path))
	yamlUpstreams(&b, "      ", "set_headers", ups, func(u snippetUpstream) string {
		return yamlString(u.prefix + "${" + u.KeyEnv + "}")
	})
	fmt.Fprintf(&b, "    delay: %s\n", yamlString(rec.Delay))
	fmt.Fprintf(&b, "    # or: delay: {mode: adaptive, fixed: %s, quantile: %s}\n", rec.Delay, formatFloat(rec.Quantile))
	fmt.Fprintf(&b, "    budget:\n      ratio: %s\n", formatFloat(budgetRatio(rec.TargetExtra)))
	return b.String()
}

// yamlUpstreams writes ups as a YAML list indented by indent, with the
// host's spelling of the headers map and of a reference to the key's
// environment variable.
func yamlUpstreams(b *strings.Builder, indent, headersKey string, ups []snippetUpstream, keyRef func(snippetUpstream) string) {
	for _, u := range ups {
		fmt.Fprintf(b, "%s- name: %s\n%s  url: %s\n", indent, yamlString(u.Name), indent, yamlString(u.Base))
		if u.header != "" {
			fmt.Fprintf(b, "%s  %s:\n%s    %s: %s\n", indent, headersKey, indent, u.header, keyRef(u))
		}
		if u.Model != "" {
			fmt.Fprintf(b, "%s  model: %s\n", indent, yamlString(u.Model))
		}
	}
}

func comment(b *strings.Builder, prefix string, lines []string) {
	for _, l := range lines {
		b.WriteString(prefix + l + "\n")
	}
}

// caddyToken quotes s when the Caddyfile lexer would otherwise split it or
// read it as a block or a comment. Placeholders such as {env.KEY} need no
// quotes.
func caddyToken(s string) string {
	if s != "" && s != "{" && s != "}" && !strings.HasPrefix(s, "#") && !strings.ContainsAny(s, " \t\r\n\"`\\") {
		return s
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// yamlString is s as a double-quoted YAML scalar (JSON string syntax is a
// subset of it).
func yamlString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// quantileName writes 0.95 as "95" and 0.975 as "97.5".
func quantileName(q float64) string {
	return strconv.FormatFloat(math.Round(q*1000)/10, 'f', -1, 64)
}

// formatDuration rounds d for people: 1.234s, 52.1ms.
func formatDuration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}
