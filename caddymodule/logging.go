package caddymodule

import (
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmhedge/llmhedge/core"
)

// Log levels of the per-request line (log_level).
const (
	// LogAuto logs at info when something worth a look happened (a hedge or
	// retry started, a hedge was denied, or the outcome is not ok), else at
	// debug, so a healthy route adds nothing to an info log.
	LogAuto  = "auto"
	LogInfo  = "info"
	LogDebug = "debug"
)

// logMessage is the message of the per-request line.
const logMessage = "llm_hedge request"

// logReport writes the one structured line of a request.
func (h *Handler) logReport(rep *core.Report) {
	level := zapcore.DebugLevel
	switch h.LogLevel {
	case LogInfo:
		level = zapcore.InfoLevel
	case LogDebug:
	default:
		if rep.HedgesStarted > 0 || len(rep.Denials) > 0 || rep.Outcome != core.OutcomeOK {
			level = zapcore.InfoLevel
		}
	}
	ce := h.logger.Check(level, logMessage)
	if ce == nil {
		return
	}
	fields := make([]zap.Field, 0, 19)
	fields = append(fields, zap.String("route", rep.Route))
	if r := rep.Request; r != nil {
		// The path only: a query may carry credentials.
		fields = append(fields, zap.String("method", r.Method), zap.String("path", r.URL.Path))
	}
	fields = append(fields,
		zap.String("outcome", rep.Outcome),
		zap.Int("status", rep.Status),
		zap.Bool("hedged", rep.Hedged),
		zap.Int("attempts", len(rep.Attempts)),
		zap.Int("hedges_started", rep.HedgesStarted),
		zap.Duration("delay", rep.Delay),
		zap.Duration("total", rep.Total),
	)
	if w := rep.WinnerAttempt(); w != nil {
		fields = append(fields,
			zap.String("winner", w.Upstream),
			zap.Int("winner_index", w.Index),
			zap.Duration("ttft", rep.TTFT))
	}
	if len(rep.Denials) > 0 {
		fields = append(fields, zap.Strings("denials", rep.Denials))
	}
	if rep.WastedPromptTokens > 0 {
		fields = append(fields, zap.Int64("wasted_prompt_tokens", rep.WastedPromptTokens))
	}
	if rep.KeyHash != "" {
		// Set by core for a client's key only; never the key itself.
		fields = append(fields, zap.String("idempotency_key_hash", rep.KeyHash))
	}
	fields = append(fields, zap.Array("attempt_details", attemptList(rep.Attempts)))
	ce.Write(fields...)
}

// attemptList logs the attempts as an array of objects.
type attemptList []core.AttemptReport

// MarshalLogArray implements zapcore.ArrayMarshaler.
func (l attemptList) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for i := range l {
		if err := enc.AppendObject(attemptEntry{&l[i]}); err != nil {
			return err
		}
	}
	return nil
}

type attemptEntry struct {
	a *core.AttemptReport
}

// MarshalLogObject implements zapcore.ObjectMarshaler.
func (e attemptEntry) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	a := e.a
	enc.AddInt("index", a.Index)
	enc.AddString("upstream", a.Upstream)
	enc.AddString("role", a.Role)
	enc.AddString("result", a.Result)
	if a.Status != 0 {
		enc.AddInt("status", a.Status)
	}
	enc.AddDuration("started", a.Started)
	if a.TTFT > 0 {
		enc.AddDuration("ttft", a.TTFT)
	}
	if a.CancelLatency > 0 {
		enc.AddDuration("cancel_latency", a.CancelLatency)
	}
	if a.Error != "" {
		// Redacted by core: no URL query or userinfo, no header value.
		enc.AddString("error", a.Error)
	}
	return nil
}
