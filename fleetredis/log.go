package fleetredis

import (
	"go.uber.org/zap"

	"github.com/llmhedge/llmhedge/core"
)

// LogFleetState writes the line of a fleet's change of state (core's
// FleetOptions.Log) for the compiled adapters: a warning when it goes down
// (requests then use local state), info when it is back.
//
// A line with a "msg" field is one of the engine's own (core's
// Options.Log, e.g. the spend cap reached, Redis' eviction policy): a
// warning with that message, or of the level its "level" field names
// ("info", "debug").
func LogFleetState(logger *zap.Logger, fields []core.LogField) {
	zf := make([]zap.Field, 0, len(fields))
	up := false
	msg, level := "", ""
	for _, f := range fields {
		switch {
		case f.Key == "msg":
			msg = f.Str
			continue
		case f.Key == "level":
			level = f.Str
			continue
		case f.Kind == core.LogInt:
			zf = append(zf, zap.Int64(f.Key, f.Int))
		case f.Kind == core.LogBool:
			zf = append(zf, zap.Bool(f.Key, f.Bool))
		default:
			zf = append(zf, zap.String(f.Key, f.Str))
		}
		if f.Key == "state" && f.Str == "up" {
			up = true
		}
	}
	if msg != "" {
		switch level {
		case "info":
			logger.Info(msg, zf...)
		case "debug":
			logger.Debug(msg, zf...)
		default:
			logger.Warn(msg, zf...)
		}
		return
	}
	if up {
		logger.Info("fleet up: joins and replays are shared again", zf...)
		return
	}
	logger.Warn("fleet down: requests use this replica's own state", zf...)
}
