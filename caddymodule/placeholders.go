package caddymodule

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmhedge/llmhedge/core"
)

// Placeholders set on the request's replacer when the race is over, for
// access logs (log_append) and handlers that wrap llm_hedge. They are set
// after the answer has been written, so they cannot go into this response's
// headers: use report_header for that.
const (
	// PlaceholderWinnerUpstream is the winning upstream's name (the log
	// key winner_upstream); empty when none won.
	PlaceholderWinnerUpstream = "http.llm_hedge.winner_upstream"
	// PlaceholderWinnerAttempt is the winning attempt's number (0 = the
	// first; the log key winner_attempt); -1 when none won.
	PlaceholderWinnerAttempt = "http.llm_hedge.winner_attempt"
	// PlaceholderWinner is PlaceholderWinnerUpstream's older name, kept for
	// existing configurations.
	PlaceholderWinner = "http.llm_hedge.winner"
	// PlaceholderWinnerIndex is PlaceholderWinnerAttempt's older name.
	PlaceholderWinnerIndex = "http.llm_hedge.winner_index"
	// PlaceholderAttempts is the number of upstream attempts made.
	PlaceholderAttempts = "http.llm_hedge.attempts"
	// PlaceholderTTFTMillis is the time to first output event in
	// milliseconds, as the client saw it; empty when none won.
	PlaceholderTTFTMillis = "http.llm_hedge.ttft_ms"
	// PlaceholderOutcome is the request's outcome (ok, upstream_error,
	// fatal, timeout, client_gone, stream_failed, rejected, replayed,
	// joined).
	PlaceholderOutcome = "http.llm_hedge.outcome"
	// PlaceholderDelayMillis is the hedge delay in force, in milliseconds.
	PlaceholderDelayMillis = "http.llm_hedge.delay_ms"
	// PlaceholderHedges is the number of attempts started beyond the first.
	PlaceholderHedges = "http.llm_hedge.hedges"
	// PlaceholderDenials lists the reasons hedges were not started,
	// comma-separated.
	PlaceholderDenials = "http.llm_hedge.denials"
)

// setPlaceholders publishes rep on r's replacer, if it has one.
func setPlaceholders(r *http.Request, rep *core.Report) {
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		return
	}
	var winnerName, ttft any = "", ""
	winnerIndex := -1
	if w := rep.WinnerAttempt(); w != nil {
		winnerName, winnerIndex, ttft = w.Upstream, w.Index, rep.TTFT.Milliseconds()
	}
	repl.Set(PlaceholderWinnerUpstream, winnerName)
	repl.Set(PlaceholderWinnerAttempt, winnerIndex)
	repl.Set(PlaceholderWinner, winnerName)
	repl.Set(PlaceholderWinnerIndex, winnerIndex)
	repl.Set(PlaceholderAttempts, len(rep.Attempts))
	repl.Set(PlaceholderTTFTMillis, ttft)
	repl.Set(PlaceholderOutcome, rep.Outcome)
	repl.Set(PlaceholderDelayMillis, rep.Delay.Milliseconds())
	repl.Set(PlaceholderHedges, rep.HedgesStarted)
	repl.Set(PlaceholderDenials, strings.Join(rep.Denials, ","))
}
