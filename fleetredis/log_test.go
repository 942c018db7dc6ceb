package fleetredis

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmhedge/llmhedge/core"
)

func TestLogFleetStateLevels(t *testing.T) {
	zcore, logs := observer.New(zapcore.DebugLevel)
	logger := zap.New(zcore)
	LogFleetState(logger, []core.LogField{{Key: "state", Str: "down"}, {Key: "error", Str: "dial"}})
	LogFleetState(logger, []core.LogField{{Key: "state", Str: "up"}})
	entries := logs.AllUntimed()
	if len(entries) != 2 {
		t.Fatalf("%d log lines, want 2", len(entries))
	}
	if entries[0].Level != zapcore.WarnLevel {
		t.Errorf("down line level = %v, want warn", entries[0].Level)
	}
	if got := entries[0].ContextMap()["error"]; got != "dial" {
		t.Errorf("down line error field = %v, want dial", got)
	}
	if entries[1].Level != zapcore.InfoLevel {
		t.Errorf("up line level = %v, want info", entries[1].Level)
	}
}
