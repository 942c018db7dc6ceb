package envoyfilter

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmhedge/llmhedge/core"
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

// Observe implements core.Observer.
func (l requestLogger) Observe(r *core.Report) {
	if ce := l.log.Check(zap.InfoLevel, "request"); ce != nil {
		fields := []zap.Field{
			zap.String("route", r.Route),
			zap.String("outcome", r.Outcome),
			zap.Int("status", r.Status),
			zap.Bool("hedged", r.Hedged),
			zap.Int("attempts", len(r.Attempts)),
			zap.Int("hedges", r.HedgesStarted),
			zap.Duration("ttft", r.TTFT),
			zap.Duration("total", r.Total),
			zap.Duration("delay", r.Delay),
		}
		if r.KeyHash != "" {
			// Set by core for a client's key only; never the key itself.
			fields = append(fields, zap.String("idempotency_key_hash", r.KeyHash))
		}
		if w := r.WinnerAttempt(); w != nil {
			fields = append(fields, zap.Int("winner", r.Winner), zap.String("winner_upstream", w.Upstream))
		}
		if len(r.Denials) > 0 {
			fields = append(fields, zap.Strings("denials", r.Denials))
		}
		for _, a := range r.Attempts {
			if a.Error != "" {
				fields = append(fields, zap.String(fmt.Sprintf("attempt%d_error", a.Index), a.Upstream+": "+a.Error))
			}
		}
		ce.Write(fields...)
	}
}
