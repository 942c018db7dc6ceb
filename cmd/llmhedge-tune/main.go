// Command llmhedge-tune measures real LLM endpoints and recommends a hedge
// delay for llmhedge.
//
// It sends the same streaming requests to every endpoint (request i goes to
// each one, so the samples pair up), measures the time to the first output
// event (by the same rules llmhedge races on, not the response headers) and
// the total time, counts the tokens billed, and reports:
//
//   - p50/p95/p99/max of TTFT and total time per endpoint, and the errors;
//   - the hedge delay that meets the target extra load: the primary's TTFT
//     quantile at 1 - target (target 5 % gives its p95);
//   - a strategy table from the same requests: single request, the priority
//     tier (an endpoint with tier=priority), race-all (send twice) and the
//     hedge at that delay, computed from the paired samples as
//     min(TTFT_A, d + TTFT_B) (README.md of this command), with their cost
//     per 1,000 requests and the cheapest one that meets -target-p99;
//   - a chart of the strategies (ttft-cdf.svg) and ready configuration
//     snippets for Caddy, Traefik and the Envoy ext_proc server, all in -out.
//
// Usage:
//
//	llmhedge-tune -endpoint name=openai,url=https://api.openai.com,key_env=OPENAI_API_KEY,model=gpt-4o-mini,price_in=0.15,price_out=0.6 \
//	              -endpoint name=backup,url=https://llm.example.com/v1,key_env=BACKUP_KEY,model=llama-3.1-8b,price_in=0.1,price_out=0.1 \
//	              -endpoint name=priority,url=https://api.openai.com,key_env=OPENAI_API_KEY,model=gpt-4o-mini,body.service_tier=priority,tier=priority,price_in=0.3,price_out=1.2 \
//	              -n 300 -concurrency 4 -target-p99 1.5s
//
// Flags:
//
//	-endpoint name=...,url=...,model=...[,key_env=...,format=openai|anthropic,body.FIELD=...,price_in=...,price_out=...,tier=priority]
//	    An endpoint; repeat it. The first is the primary. model replaces the
//	    body's "model" and is required unless every -requests line names its
//	    model. url is the base URL, with or without a trailing /v1, to which
//	    the format's API path is appended, or the full API URL (ending with
//	    that path), used as is. format openai (default) posts to
//	    .../v1/chat/completions with "Authorization: Bearer $KEY"; anthropic
//	    posts to .../v1/messages with "x-api-key: $KEY" and
//	    "anthropic-version: 2023-06-01". key_env names the environment
//	    variable that holds the key (none: no key is sent); keys are never
//	    printed or written. body.FIELD=VALUE sets a top-level body field
//	    (VALUE is JSON when it parses, else a string), e.g.
//	    body.service_tier=priority. price_in and price_out are USD per
//	    million input and output tokens. tier=priority marks the primary's
//	    priority tier: measured on its own, never a hedge target.
//	-requests file.jsonl
//	    One request per line: a Chat Completions body ({"model", "messages",
//	    ...}) or {"prompt": "..."}. "stream": true is always set. Anthropic
//	    endpoints get system messages moved to "system" and "max_tokens": 256
//	    when the line has none. Request i uses line i modulo the line count.
//	    Default: a built-in set of 20 short prompts.
//	-n 200              requests sent to EACH endpoint; hard cap 10000.
//	-concurrency 4      requests in flight per endpoint.
//	-target-extra 0.05  extra load the hedge may add (fraction of requests).
//	-target-p99 0       TTFT p99 the strategy table's winner must meet.
//	-price-per-mtok 0   USD per million input tokens of the endpoints
//	                    without price_in (prompt tokens are estimated as
//	                    body bytes / 4 for the plan).
//	-out llmhedge-tune-out
//	    Directory for ttft-cdf.svg, samples.csv, results.json, Caddyfile,
//	    traefik-dynamic.yml and llmhedge-extproc.yaml.
//	-json               print the results as JSON on stdout.
//	-yes                do not ask before sending. Without it the plan is
//	                    printed and confirmed at the terminal; when stdin is
//	                    not a terminal the command refuses (exit 2) and sends
//	                    nothing.
//	-timeout 2m         deadline of one request, the streamed answer included.
//
// Before sending anything it prints the plan: the endpoints, the number of
// requests (the hard cap) and the estimated prompt tokens and spend. A
// progress line runs on stderr. Ctrl-C stops sending, cancels the requests
// in flight and reports on the samples collected so far (exit status 130); a
// second Ctrl-C exits at once.
//
// Each request carries its body, Content-Type, Accept, User-Agent
// llmhedge-tune and the endpoint's key (and anthropic-version for
// Anthropic): no request id or other header of its own. The samples CSV
// names request i tune-<i>.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"
)

// usageHeader precedes the flag list of -h.
const usageHeader = `llmhedge-tune measures LLM endpoints and recommends a hedge delay.

It sends every request to every endpoint, measures the time to the first
output event and the total time, and writes the distributions, the delay
that meets -target-extra, the expected p99 with it, a CDF chart and
configuration snippets for Caddy, Traefik and Envoy to -out.

Example:
  OPENAI_API_KEY=... llmhedge-tune \
    -endpoint name=openai,url=https://api.openai.com,key_env=OPENAI_API_KEY,model=gpt-4o-mini \
    -endpoint name=backup,url=https://llm.example.com/v1,key_env=BACKUP_KEY,model=llama-3.1-8b \
    -n 300 -price-per-mtok 0.15

Ctrl-C stops and reports on the requests done so far.

Flags:
`

// Exit statuses.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130 // 128 + SIGINT, as shells report it
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal the default behaviour comes back, so a second
	// Ctrl-C ends the process even if a report hangs.
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command; ctx ends on Ctrl-C.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "llmhedge-tune: %v\nRun llmhedge-tune -h for the flags.\n", err)
		return exitUsage
	}
	p, err := newPlan(opts)
	if err != nil {
		fmt.Fprintf(stderr, "llmhedge-tune: %v\n", err)
		return exitUsage
	}
	// With -json stdout carries only the results.
	human := stdout
	if opts.JSON {
		human = stderr
	}
	p.print(human)
	if !opts.Yes {
		// Sending costs money: without -yes only a person at a terminal may
		// say yes. A pipe or /dev/null on stdin is no one's answer.
		if !isTerminal(stdin) {
			fmt.Fprintln(stderr, "llmhedge-tune: stdin is not a terminal, so the plan cannot be confirmed; nothing sent. Add -yes to send without asking.")
			return exitUsage
		}
		if !confirm(stdin, human) {
			fmt.Fprintln(human, "Nothing sent.")
			return exitFailed
		}
	}
	// Create the output directory before spending anything on requests.
	if err := os.MkdirAll(opts.OutDir, 0o755); err != nil {
		fmt.Fprintf(stderr, "llmhedge-tune: -out: %v\n", err)
		return exitFailed
	}

	bar := newProgress(stderr, p.total())
	m := measure(ctx, p, bar.done)
	bar.finish()
	res := analyze(p, m)
	if err := writeOutputs(opts.OutDir, res, m, opts.Endpoints); err != nil {
		fmt.Fprintf(stderr, "llmhedge-tune: writing results: %v\n", err)
		return exitFailed
	}
	if opts.JSON {
		err = printJSON(stdout, res)
	} else {
		err = printReport(stdout, res)
	}
	if err != nil {
		fmt.Fprintf(stderr, "llmhedge-tune: %v\n", err)
		return exitFailed
	}
	switch {
	case m.Interrupted:
		return exitInterrupted
	case res.Recommendation == nil:
		return exitFailed
	}
	return exitOK
}

// isTerminal reports whether f is an interactive terminal. A mode check
// alone is not enough: /dev/null, the stdin of CI jobs, is a character
// device too.
func isTerminal(f any) bool {
	file, ok := f.(*os.File)
	return ok && term.IsTerminal(int(file.Fd()))
}
