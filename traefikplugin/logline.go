package traefikplugin

import (
	"encoding/json"
	"io"
	"time"

	"github.com/llmhedge/llmhedge/core"
)

// Traefik gives plugins no metrics registry, so each request is reported as
// one JSON line. Under Traefik the plugin's stdout and stderr are Traefik's
// own logger (DEBUG and ERROR level), which adds time and level.

// requestLine is the log line of one request. Field names are stable: tools
// parse them. Credentials never appear (upstreams are named, not their
// headers), nor idempotency keys (only their hash).
type requestLine struct {
	Msg                string        `json:"msg"`        // always "llmhedge request"
	Middleware         string        `json:"middleware"` // the Traefik middleware name
	Route              string        `json:"route"`
	Outcome            string        `json:"outcome"` // core.Outcome*
	Status             int           `json:"status"`  // sent to the client
	Hedged             bool          `json:"hedged"`  // eligible for a race
	Attempts           int           `json:"attempts"`
	HedgesStarted      int           `json:"hedges_started"`
	Winner             int           `json:"winner"` // attempt index, -1 when none
	WinnerUpstream     string        `json:"winner_upstream,omitempty"`
	TTFTMillis         float64       `json:"ttft_ms"`
	TotalMillis        float64       `json:"total_ms"`
	DelayMillis        float64       `json:"delay_ms"`
	Denials            []string      `json:"denials,omitempty"`
	WastedPromptTokens int64         `json:"wasted_prompt_tokens"`
	IdempotencyKeyHash string        `json:"idempotency_key_hash,omitempty"` // core.KeyHash: never the key
	AttemptList        []attemptLine `json:"attempt_list"`
}

// attemptLine is one attempt within a requestLine.
type attemptLine struct {
	Upstream      string  `json:"upstream"`
	Role          string  `json:"role"`   // primary, hedge, retry, single
	Result        string  `json:"result"` // won, lost, failed, cancelled
	Status        int     `json:"status,omitempty"`
	StartedMillis float64 `json:"started_ms"`
	TTFTMillis    float64 `json:"ttft_ms,omitempty"`
	CancelMillis  float64 `json:"cancel_ms,omitempty"`
	Error         string  `json:"error,omitempty"`
}

// logObserver writes one requestLine per request to out.
type logObserver struct {
	middleware string
	out        io.Writer
}

// Observe implements core.Observer.
func (o *logObserver) Observe(r *core.Report) {
	line := requestLine{
		Msg:                "llmhedge request",
		Middleware:         o.middleware,
		Route:              r.Route,
		Outcome:            r.Outcome,
		Status:             r.Status,
		Hedged:             r.Hedged,
		Attempts:           len(r.Attempts),
		HedgesStarted:      r.HedgesStarted,
		Winner:             r.Winner,
		TTFTMillis:         millis(r.TTFT),
		TotalMillis:        millis(r.Total),
		DelayMillis:        millis(r.Delay),
		Denials:            r.Denials,
		WastedPromptTokens: r.WastedPromptTokens,
		IdempotencyKeyHash: r.KeyHash,
		AttemptList:        make([]attemptLine, 0, len(r.Attempts)),
	}
	for _, a := range r.Attempts {
		line.AttemptList = append(line.AttemptList, attemptLine{
			Upstream:      a.Upstream,
			Role:          a.Role,
			Result:        a.Result,
			Status:        a.Status,
			StartedMillis: millis(a.Started),
			TTFTMillis:    millis(a.TTFT),
			CancelMillis:  millis(a.CancelLatency),
			Error:         a.Error,
		})
	}
	if w := r.WinnerAttempt(); w != nil {
		line.WinnerUpstream = w.Upstream
	}
	b, err := json.Marshal(line)
	if err != nil {
		return
	}
	// One Write per line: Traefik's logger turns each Write into one entry.
	o.out.Write(append(b, '\n'))
}

// millis is d in milliseconds with microsecond precision.
func millis(d time.Duration) float64 {
	return float64(d/time.Microsecond) / 1000
}
