package envoyfilter

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmhedge/llmhedge/core"
)

// The request log names the idempotency key by its hash, never by the key.
func TestRequestLogCarriesKeyHashNotKey(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"choices":[{"message":{"content":"hi"}}]}`))
	}))
	defer upstream.Close()
	logCore, logs := observer.New(zapcore.InfoLevel)
	h, err := core.New(config.Config{Upstreams: []config.UpstreamConfig{{Name: "A", URL: upstream.URL}}},
		core.Options{Observer: requestLogger{log: zap.New(logCore)}})
	if err != nil {
		t.Fatal(err)
	}
	key := "client-key-7f3a9"
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("status %d, want 200", rec.Code)
	}
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("%d log entries, want 1", len(entries))
	}
	fields := entries[0].ContextMap()
	if _, ok := fields["idempotency_key"]; ok {
		t.Errorf("the log has an idempotency_key field")
	}
	if got := fields["idempotency_key_hash"]; got != core.KeyHash(key) {
		t.Errorf("idempotency_key_hash = %v, want %q", got, core.KeyHash(key))
	}
	for name, v := range fields {
		if s, ok := v.(string); ok && strings.Contains(s, key) {
			t.Errorf("field %s carries the idempotency key", name)
		}
	}
}

// The request line carries core.ReportLogFields' keys, in order, as the
// Caddy module and the Traefik plugin write them: winner_attempt is an
// index, winner_upstream a name.
func TestRequestLogKeysAreTheSharedOnes(t *testing.T) {
	logCore, logs := observer.New(zapcore.InfoLevel)
	rep := &core.Report{Route: "chat", Outcome: core.OutcomeOK, Status: 200, Hedged: true, Winner: 1, HedgesStarted: 1,
		Attempts: []core.AttemptReport{
			{Index: 0, Upstream: "A", Role: core.RolePrimary, Result: core.ResultLost, Error: "cancelled"},
			{Index: 1, Upstream: "B", Role: core.RoleHedge, Result: core.ResultWon, Status: 200},
		}}
	requestLogger{log: zap.New(logCore)}.Observe(rep)
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("%d log lines, want 1", len(entries))
	}
	var got, want []string
	for _, f := range entries[0].Context {
		got = append(got, f.Key)
	}
	for _, f := range core.ReportLogFields(rep) {
		want = append(want, f.Key)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("keys %v, want %v", got, want)
	}
	fields := entries[0].ContextMap()
	if fields["winner_attempt"] != int64(1) {
		t.Errorf("fields[\"winner_attempt\"] = %v, want %v", fields["winner_attempt"], int64(1))
	} else if fields["winner_upstream"] != "B" {
		t.Errorf("fields[\"winner_upstream\"] = %q, want \"B\"", fields["winner_upstream"])
	}
	if _, ok := fields["winner"]; ok {
		t.Errorf("the line still has winner = %v", fields["winner"])
	}
}
