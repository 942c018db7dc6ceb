package zapfields

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
	rest := make([]core.LogField, 0, len(fields))
	up := false
	msg, level := "", ""
	for _, f := range fields {
		switch f.Key {
		case "msg":
			msg = f.Str
			continue
		case "level":
			level = f.Str
			continue
		case "state":
			up = f.Str == "up"
		}
		rest = append(rest, f)
	}
	zf := Append(make([]zap.Field, 0, len(rest)), rest)
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
