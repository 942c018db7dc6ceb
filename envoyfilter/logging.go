package envoyfilter

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/zapfields"
)

func parseLevel(s string) (zapcore.Level, error) {
	var l zapcore.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("%q: want debug, info, warn or error", s)
	}
	return l, nil
}

// NewLogger builds the zap logger described by cfg. The returned level can
// be changed later (the level is reloadable).
func NewLogger(cfg LogConfig) (*zap.Logger, zap.AtomicLevel, error) {
	level, err := parseLevel(cfg.Level)
	if err != nil {
		return nil, zap.AtomicLevel{}, err
	}
	var zc zap.Config
	if cfg.Format == "console" {
		zc = zap.NewDevelopmentConfig()
	} else {
		zc = zap.NewProductionConfig()
		zc.Sampling = nil // request logs must not be sampled away
	}
	zc.Level = zap.NewAtomicLevelAt(level)
	logger, err := zc.Build()
	if err != nil {
		return nil, zap.AtomicLevel{}, err
	}
	return logger, zc.Level, nil
}

// requestLogger writes one line per hedged request from its report.
// Upstream names only: credentials never reach a Report.
type requestLogger struct {
	log *zap.Logger
}

// Observe implements core.Observer: the keys every adapter writes
// (core.ReportLogFields).
func (l requestLogger) Observe(r *core.Report) {
	if ce := l.log.Check(zap.InfoLevel, "request"); ce != nil {
		ce.Write(zapfields.Append(make([]zap.Field, 0, 18), core.ReportLogFields(r))...)
	}
}
