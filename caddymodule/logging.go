package caddymodule

import (
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/zapfields"
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
	fields := make([]zap.Field, 0, 20)
	if r := rep.Request; r != nil {
		// The path only: a query may carry credentials.
		fields = append(fields, zap.String("method", r.Method), zap.String("path", r.URL.Path))
	}
	// The keys every adapter writes (core.ReportLogFields).
	fields = zapfields.Append(fields, core.ReportLogFields(rep))
	ce.Write(fields...)
}
