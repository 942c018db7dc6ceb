package zapfields

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

// An engine line ("msg") is a warning unless its "level" field says
// otherwise; the level is no field of the line.
func TestLogFleetStateEngineLineLevel(t *testing.T) {
	zcore, logs := observer.New(zapcore.DebugLevel)
	logger := zap.New(zcore)
	LogFleetState(logger, []core.LogField{{Key: "msg", Str: "policy allkeys-lru"}, {Key: "fleet", Str: "r:6379/0"}})
	LogFleetState(logger, []core.LogField{{Key: "msg", Str: "policy unreadable"}, {Key: "level", Str: "info"}})
	entries := logs.AllUntimed()
	if len(entries) != 2 {
		t.Fatalf("%d log lines, want 2", len(entries))
	}
	if entries[0].Level != zapcore.WarnLevel || entries[0].Message != "policy allkeys-lru" {
		t.Errorf("first line %v %q, want warn \"policy allkeys-lru\"", entries[0].Level, entries[0].Message)
	}
	if entries[1].Level != zapcore.InfoLevel {
		t.Errorf("line with level info logged at %v, want info", entries[1].Level)
	}
	if _, ok := entries[1].ContextMap()["level"]; ok {
		t.Errorf("line fields %v carry the level, want it consumed", entries[1].ContextMap())
	}
}
