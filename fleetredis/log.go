package fleetredis

import (
	"go.uber.org/zap"

	"github.com/llmhedge/llmhedge/core"
)

// LogFleetState writes the line of a fleet's change of state (core's
// FleetOptions.Log) for the compiled adapters: a warning when it goes down
// (requests then use local state), info when it is back.
func LogFleetState(logger *zap.Logger, fields []core.LogField) {
	zf := make([]zap.Field, 0, len(fields))
	up := false
	for _, f := range fields {
		zf = append(zf, zap.String(f.Key, f.Str))
		if f.Key == "state" && f.Str == "up" {
			up = true
		}
	}
	if up {
		logger.Info("fleet up: joins and replays are shared again", zf...)
		return
	}
	logger.Warn("fleet down: requests use this replica's own state", zf...)
}
