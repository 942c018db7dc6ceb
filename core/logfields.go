package core

import "time"

// Kinds of LogField values.
const (
	LogString  int = 0 // Str
	LogInt     int = 1 // Int
	LogBool    int = 2 // Bool
	LogMillis  int = 3 // Millis: a duration in milliseconds, µs precision
	LogStrings int = 4 // Strs
	LogObjects int = 5 // Objects: a list of objects, each its own fields
)

// LogField is one key/value pair of a request's log line. It is a plain
// struct rather than an interface{} value so that every adapter (Traefik's
// under Yaegi too) can encode it with a switch on Kind.
type LogField struct {
	Key     string
	Kind    int
	Str     string
	Int     int64
	Bool    bool
	Millis  float64
	Strs    []string
	Objects [][]LogField
}

// ReportLogFields returns the fields of r's log line, in order. Every
// adapter writes these (and may put its own, such as the method, first), so
// a key means the same everywhere: winner_attempt is the winning attempt's
// index, winner_upstream its upstream's name. Durations are in
// milliseconds (keys ending in _ms). Upstream names and redacted errors
// only: a Report carries no credential, and idempotency_key_hash is
// KeyHash, never the key.
func ReportLogFields(r *Report) []LogField {
	fields := requestFields(r, 1)
	list := make([][]LogField, 0, len(r.Attempts))
	for i := range r.Attempts {
		list = append(list, attemptLogFields(&r.Attempts[i]))
	}
	return append(fields, LogField{Key: "attempt_list", Kind: LogObjects, Objects: list})
}

// requestFields are the log line's fields but the attempt list, with room
// for extra more.
func requestFields(r *Report, extra int) []LogField {
	fields := make([]LogField, 0, 18+extra)
	fields = append(fields, stringField("route", r.Route))
	fields = append(fields, stringField("outcome", r.Outcome))
	fields = append(fields, intField("status", int64(r.Status)))
	fields = append(fields, LogField{Key: "hedged", Kind: LogBool, Bool: r.Hedged})
	fields = append(fields, intField("attempts", int64(len(r.Attempts))))
	fields = append(fields, intField("hedges_started", int64(r.HedgesStarted)))
	fields = append(fields, millisField("delay_ms", r.Delay))
	fields = append(fields, millisField("total_ms", r.Total))
	if w := r.WinnerAttempt(); w != nil {
		fields = append(fields, intField("winner_attempt", int64(w.Index)))
		fields = append(fields, stringField("winner_upstream", w.Upstream))
		fields = append(fields, stringField("winner_role", w.Role))
		fields = append(fields, millisField("ttft_ms", r.TTFT))
	}
	if r.EarlyHeaders {
		fields = append(fields, LogField{Key: "early_headers", Kind: LogBool, Bool: true})
	}
	if len(r.Denials) > 0 {
		fields = append(fields, LogField{Key: "denials", Kind: LogStrings, Strs: r.Denials})
	}
	if r.WastedPromptTokens > 0 {
		fields = append(fields, intField("wasted_prompt_tokens", r.WastedPromptTokens))
	}
	if r.KeyHash != "" {
		fields = append(fields, stringField("idempotency_key_hash", r.KeyHash))
	}
	if r.Idempotency != "" {
		fields = append(fields, stringField("idempotency", r.Idempotency))
	}
	if r.Validation != "" {
		fields = append(fields, stringField("validation", r.Validation))
	}
	return fields
}

// attemptLogFields are the fields of one attempt within attempt_list.
func attemptLogFields(a *AttemptReport) []LogField { return attemptFields(a, 0) }

// attemptFields are attemptLogFields with room for extra more.
func attemptFields(a *AttemptReport, extra int) []LogField {
	fields := make([]LogField, 0, 11+extra)
	fields = append(fields, intField("index", int64(a.Index)))
	fields = append(fields, stringField("upstream", a.Upstream))
	fields = append(fields, stringField("role", a.Role))
	fields = append(fields, stringField("result", a.Result))
	if a.Status != 0 {
		fields = append(fields, intField("status", int64(a.Status)))
	}
	fields = append(fields, millisField("started_ms", a.Started))
	if a.TTFT > 0 {
		fields = append(fields, millisField("ttft_ms", a.TTFT))
	}
	if a.CancelLatency > 0 {
		fields = append(fields, millisField("cancel_ms", a.CancelLatency))
	}
	if a.Invalid != "" {
		fields = append(fields, stringField("invalid_check", a.Invalid))
	}
	if a.Explore {
		fields = append(fields, LogField{Key: "explore", Kind: LogBool, Bool: true})
	}
	if a.ErrorType != "" {
		fields = append(fields, stringField("error_type", a.ErrorType))
	}
	if a.Error != "" {
		// Redacted by core: no URL query or userinfo, no header value.
		fields = append(fields, stringField("error", a.Error))
	}
	return fields
}

// What became of a request with the client's idempotency key
// (Report.Idempotency, the log line's "idempotency").
const (
	IdempotencyLed      = "led"      // it ran the race (its answer is kept for the key)
	IdempotencyJoined   = "joined"   // it read the answer of a race in flight
	IdempotencyReplayed = "replayed" // it got the stored answer
	IdempotencyRejected = "rejected" // the key was used with another request
)

func stringField(key, v string) LogField { return LogField{Key: key, Kind: LogString, Str: v} }

func intField(key string, v int64) LogField { return LogField{Key: key, Kind: LogInt, Int: v} }

// millisField is d in milliseconds with microsecond precision.
func millisField(key string, d time.Duration) LogField {
	return LogField{Key: key, Kind: LogMillis, Millis: float64(d/time.Microsecond) / 1000}
}
