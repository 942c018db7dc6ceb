package core

import (
	"net/http"
	"time"
)

// Outcomes of a request, as reported in Report.Outcome.
const (
	OutcomeOK            = "ok"             // a winner's answer was delivered in full
	OutcomeUpstreamError = "upstream_error" // every attempt failed; the best error was returned
	OutcomeFatal         = "fatal"          // a fatal client error (4xx) was passed through
	OutcomeTimeout       = "timeout"        // the shared deadline passed (504)
	OutcomeClientGone    = "client_gone"    // the client went away
	OutcomeStreamFailed  = "stream_failed"  // the winner failed after commit
	OutcomeRejected      = "rejected"       // bad input (e.g. idempotency conflict)
	OutcomeReplayed      = "replayed"       // answered from the idempotency store
	OutcomeJoined        = "joined"         // joined an in-flight race with the same key
	// OutcomeCut names a request whose handler panicked (an abort, a bug),
	// on its span only: no report is observed for it.
	OutcomeCut = "cut"
)

// Attempt roles and results, as reported in AttemptReport.
const (
	RolePrimary = "primary"
	RoleHedge   = "hedge"  // started because the delay passed
	RoleRetry   = "retry"  // started at once because an attempt failed
	RoleSingle  = "single" // an unhedged request (ineligible, opted out, large body)

	ResultWon       = "won"
	ResultLost      = "lost"      // cancelled because another attempt won
	ResultFailed    = "failed"    // failed on its own (ResultInvalid: its answer failed validation)
	ResultCancelled = "cancelled" // cancelled by the client, the deadline or a fatal answer
)

// Reasons a hedge was not started, as reported in Report.Denials.
const (
	DenyBudget        = "budget"         // the extra-load token bucket is empty
	DenyConcurrency   = "concurrency"    // too many hedges in flight
	DenyOverload      = "overload"       // the recent 429/503 rate is high
	DenyNoUpstream    = "no_upstream"    // every other upstream cools down or is open-circuit
	DenyDeadline      = "deadline"       // too little time left
	DenyTenant        = "tenant"         // the tenant's extra-token cap is spent
	DenyMaxAttempts   = "max_attempts"   // the race is full
	DenyNotIdempotent = "not_idempotent" // the request may change state and has no key
	DenyPaused        = "paused"         // the kill switch pauses hedging (process or fleet)
	DenySpendCap      = "spend_cap"      // the route's hourly spend cap is reached
)

// AttemptReport describes one upstream attempt.
type AttemptReport struct {
	Index    int
	Upstream string // the upstream's name; never a credential
	Role     string
	Result   string
	Status   int           // HTTP status, 0 when none arrived
	Error    string        // why it failed, when it did
	Started  time.Duration // since the request started
	TTFT     time.Duration // time from this attempt's start to its first output event; 0 if none
	// CancelLatency is the time from the winner's commit to this loser's
	// connection being closed, for lost attempts.
	CancelLatency time.Duration
	// Invalid names the validity check this attempt's answer failed
	// (result invalid).
	Invalid string
	// Explore: the attempt went to the runner-up to measure it (a route
	// with primary fastest), not to the best upstream.
	Explore bool
	// ErrorType classes a failure: an error code of the engine's answers
	// (upstream_unreachable, upstream_timeout, upstream_bad_response,
	// upstream_error) or the HTTP status, e.g. "503".
	ErrorType string

	// Filled for traced requests only (see Tracer): when the attempt's span
	// ends, since the request started; the upstream's host and port, the
	// provider its host names ("" when unknown) and the model the attempt
	// asked for when the upstream sets its own.
	Ended         time.Duration
	ServerAddress string
	ServerPort    int
	Provider      string
	Model         string
}

// Report is everything the engine knows about one request when it ends.
type Report struct {
	// Request is the client's request, so an observer can attach results
	// to it (e.g. Caddy placeholders). Observers must not read its body.
	Request *http.Request
	Route   string
	// KeyHash names the client's idempotency key without revealing it:
	// KeyHash(key), the first 16 hex digits of the key's SHA-256. The same
	// key sent by two callers hashes the same, though it names two
	// separate entries. Empty when the client sent no key (the engine's
	// generated one is not hashed) and for a request rejected before its
	// key was read.
	KeyHash  string
	Hedged   bool // the request was eligible for a race
	Outcome  string
	Status   int // status sent to the client
	Attempts []AttemptReport
	Winner   int           // index into Attempts, -1 when none
	Start    time.Time     // when the request arrived
	CommitAt time.Time     // when the winner was committed; zero when none
	TTFT     time.Duration // request start to the winner's first output event
	Total    time.Duration
	Delay    time.Duration // the hedge delay in force
	// HedgesStarted counts attempts started beyond the first.
	HedgesStarted int
	Denials       []string
	// EarlyHeaders: the status and headers went out before a winner (a
	// streaming race still undecided after Config.EarlyHeaders).
	EarlyHeaders bool
	// WastedPromptTokens estimates the prompt tokens spent on attempts that
	// did not win (body bytes / 4 each).
	WastedPromptTokens int64
	// Validation says how the validity checks went, when the request had
	// any: ValidationPassed, ValidationUnchecked (the answer outgrew
	// max_prefix) or ValidationFailed (every answer was invalid).
	Validation string
	// Idempotency says what became of the client's idempotency key
	// (Idempotency* values); "" when the request did not go through the
	// keyed path (no key, idempotency off, not hedgeable).
	Idempotency string
	// Model is the request's top-level "model"; filled for traced requests.
	Model string

	trace Trace // the request's spans, nil when it is not traced
}

// Observer receives a Report when each request ends. It is called on the
// request's goroutine and must not block.
type Observer interface {
	Observe(r *Report)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(r *Report)

// Observe calls f(r).
func (f ObserverFunc) Observe(r *Report) { f(r) }

// WinnerAttempt returns the winning attempt's report, or nil when no
// attempt won.
func (r *Report) WinnerAttempt() *AttemptReport {
	if r.Winner < 0 || r.Winner >= len(r.Attempts) {
		return nil
	}
	return &r.Attempts[r.Winner]
}
