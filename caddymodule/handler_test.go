package caddymodule

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// fastWorkload answers every request after ttft, 3 tokens 1ms apart, with
// pings every 2ms while it waits: a small, deterministic upstream (sigma
// and stall probability -1: no jitter, no stalls).
func fastWorkload(ttft time.Duration) llmsim.Workload {
	return llmsim.Workload{MedianTTFT: ttft, Sigma: -1, StallProb: -1, Tokens: 3, TokenGap: time.Millisecond, PingEvery: 2 * time.Millisecond}
}

// startSims starts llmsim upstreams A and B, closed at the end of the test.
func startSims(t *testing.T) (a, b *llmsim.Running) {
	t.Helper()
	a = llmsim.Start("A", fastWorkload(5*time.Millisecond))
	b = llmsim.Start("B", fastWorkload(5*time.Millisecond))
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	return a, b
}

// provisionForTest provisions a handler on A and B, with its log captured.
func provisionForTest(t *testing.T, extra string, a, b *llmsim.Running) (*Handler, *observer.ObservedLogs) {
	t.Helper()
	config := `{"route":"unit","upstreams":[` +
		`{"name":"A","url":"` + a.URL + `","set_headers":{"Authorization":"Bearer sk-upstream-A-secret"}},` +
		`{"name":"B","url":"` + b.URL + `","set_headers":{"Authorization":"Bearer sk-upstream-B-secret"}}],` +
		`"delay":{"fixed":"20ms"}` + extra + `}`
	h, err := provisionJSON(t, newCaddyContext(t), config)
	if err != nil {
		t.Fatal(err)
	}
	logCore, logs := observer.New(zapcore.DebugLevel)
	h.logger = zap.New(logCore)
	return h, logs
}

// caddyRequest is a chat request carrying a Caddy replacer, as Caddy's
// server prepares it.
func caddyRequest(id, behavior string) (*http.Request, *caddy.Replacer) {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer client-key")
	r.Header.Set(llmsim.HeaderRequest, id)
	if behavior != "" {
		r.Header.Set(llmsim.HeaderBehavior, behavior)
	}
	repl := caddy.NewReplacer()
	return r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)), repl
}

// forbiddenNext fails the test if the handler ever calls it.
func forbiddenNext(t *testing.T) caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		t.Error("llm_hedge called the next handler")
		return nil
	})
}

func TestServeHTTPHedgeWinsAndReports(t *testing.T) {
	a, b := startSims(t)
	h, logs := provisionForTest(t, "", a, b)
	winsBefore := processMetrics().CounterValue(core.MetricHedgeWins, "unit", "B", "hedge")

	r, repl := caddyRequest("hedge-1", "A=stall")
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, forbiddenNext(t)); err != nil {
		t.Fatal(err)
	}
	want := llmsim.ExpectedStream("B", "m", "hedge-1", 3)
	if got := llmsim.StripPings(w.Body.Bytes()); string(got) != string(want) {
		t.Fatalf("body\n%s\nwant B's whole stream\n%s", got, want)
	}
	for name, want := range map[string]string{
		PlaceholderWinner: "B", PlaceholderWinnerIndex: "1", PlaceholderAttempts: "2",
		PlaceholderWinnerUpstream: "B", PlaceholderWinnerAttempt: "1",
		PlaceholderOutcome: "ok", PlaceholderHedges: "1", PlaceholderDelayMillis: "20",
	} {
		if got, _ := repl.GetString(name); got != want {
			t.Errorf("{%s} = %q, want %q", name, got, want)
		}
	}
	// B starts after the 20ms delay, so the client's TTFT is at least that.
	if ttft, _ := repl.GetString(PlaceholderTTFTMillis); atoi(ttft) < 20 {
		t.Errorf("{%s} = %q, want >= 20", PlaceholderTTFTMillis, ttft)
	}
	if got := processMetrics().CounterValue(core.MetricHedgeWins, "unit", "B", "hedge"); got != winsBefore+1 {
		t.Errorf("hedge wins %v, want %v", got, winsBefore+1)
	}

	entries := logs.FilterMessage(logMessage).All()
	if len(entries) != 1 {
		t.Fatalf("%d log lines, want 1", len(entries))
	}
	e := entries[0]
	fields := e.ContextMap()
	if e.Level != zapcore.InfoLevel {
		t.Errorf("e.Level = %v, want zapcore.InfoLevel", e.Level)
	} else if fields["winner_upstream"] != "B" {
		t.Errorf("fields[\"winner_upstream\"] = %q, want \"B\"", fields["winner_upstream"])
	} else if fields["winner_attempt"] != int64(1) {
		t.Errorf("fields[\"winner_attempt\"] = %v, want %v", fields["winner_attempt"], int64(1))
	} else if fields["outcome"] != "ok" {
		t.Errorf("fields[\"outcome\"] = %q, want \"ok\"", fields["outcome"])
	} else if fields["attempts"] != int64(2) {
		t.Errorf("fields[\"attempts\"] = %v, want %v", fields["attempts"], int64(2))
	}
	line := encodeLogEntry(t, e)
	if !strings.Contains(line, `"attempt_list":[{"index":0,"upstream":"A","role":"primary","result":"lost"`) {
		t.Errorf("log line lacks the attempt details: %s", line)
	}
	for _, secret := range []string{"sk-upstream-A-secret", "sk-upstream-B-secret", "client-key"} {
		if strings.Contains(line, secret) {
			t.Errorf("log line leaks %q: %s", secret, line)
		}
	}
}

// encodeLogEntry renders a captured entry as the JSON line Caddy would write.
func encodeLogEntry(t *testing.T, e observer.LoggedEntry) string {
	t.Helper()
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	buf, err := enc.EncodeEntry(e.Entry, e.Context)
	if err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// atoi is strconv.Atoi with -1 for anything that is not a number.
func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// TestServeHTTPAbortsBrokenStream: when the winner breaks after the answer
// started, the handler must abort the response the way net/http expects
// (panic with http.ErrAbortHandler), so the client sees a broken stream.
func TestServeHTTPAbortsBrokenStream(t *testing.T) {
	a, b := startSims(t)
	h, logs := provisionForTest(t, "", a, b)
	r, repl := caddyRequest("broken-1", "A=reset_after:1")
	w := httptest.NewRecorder()
	recovered := func() (v any) {
		defer func() { v = recover() }()
		_ = h.ServeHTTP(w, r, forbiddenNext(t))
		return nil
	}()
	if recovered != http.ErrAbortHandler {
		t.Fatalf("recovered %v, want http.ErrAbortHandler", recovered)
	}
	if !strings.Contains(w.Body.String(), llmsim.TokenText("broken-1", 0)) {
		t.Fatalf("the first token was not delivered before the abort: %q", w.Body.String())
	}
	if got, _ := repl.GetString(PlaceholderOutcome); got != "stream_failed" {
		t.Fatalf("outcome %q, want stream_failed", got)
	}
	if n := logs.FilterMessage(logMessage).Len(); n != 1 {
		t.Fatalf("%d log lines, want 1 even when aborting", n)
	}
}

// TestServeHTTPUnhedgedPassthrough: a request the route does not hedge (here
// a GET) is still proxied, once, by the handler itself.
func TestServeHTTPUnhedgedPassthrough(t *testing.T) {
	a, b := startSims(t)
	h, _ := provisionForTest(t, "", a, b)
	r, repl := caddyRequest("get-1", "")
	r.Method = http.MethodGet
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, forbiddenNext(t)); err != nil {
		t.Fatal(err)
	}
	if w.Code != http.StatusMethodNotAllowed {
		t.Fatalf("w.Code = %v, want http.StatusMethodNotAllowed", w.Code)
	} else if a.Served() != 1 {
		t.Fatalf("a.Served() = %v, want 1", a.Served())
	} else if b.Served() != 0 {
		t.Fatalf("b.Served() = %v, want 0", b.Served())
	}
	if got, _ := repl.GetString(PlaceholderAttempts); got != "1" {
		t.Fatalf("attempts %q, want 1", got)
	}
}

// An upstream whose error event quotes the key it was sent: the key reaches
// neither the client nor the log line (core redacts the report's errors;
// the adapter logs them as they are).
func TestServeHTTPLogsNoQuotedKey(t *testing.T) {
	quoting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: error\ndata: {\"error\":{\"message\":\"bad key "+r.Header.Get("Authorization")+"\"}}\n\n")
	}))
	defer quoting.Close()
	config := `{"route":"unit","upstreams":[{"name":"A","url":"` + quoting.URL + `","set_headers":{"Authorization":"Bearer sk-quoted-secret"}}],` +
		`"max_attempts":1}`
	h, err := provisionJSON(t, newCaddyContext(t), config)
	if err != nil {
		t.Fatal(err)
	}
	logCore, logs := observer.New(zapcore.DebugLevel)
	h.logger = zap.New(logCore)
	r, _ := caddyRequest("quoted-1", "")
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, forbiddenNext(t)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(w.Body.String(), "sk-quoted-secret") {
		t.Fatalf("client body leaks the key: %s", w.Body.String())
	}
	entries := logs.FilterMessage(logMessage).All()
	if len(entries) != 1 {
		t.Fatalf("%d log lines, want 1", len(entries))
	}
	line := encodeLogEntry(t, entries[0])
	if strings.Contains(line, "sk-quoted-secret") {
		t.Fatalf("line = %q, want it not to contain \"sk-quoted-secret\"", line)
	} else if !strings.Contains(line, "bad key REDACTED") {
		t.Fatalf("line = %q, want it to contain \"bad key REDACTED\"", line)
	}
}

// The log line names a client's idempotency key by its hash, never by the
// key; a request without one (its key generated) has no such field.
func TestLogLineCarriesClientKeyHashOnly(t *testing.T) {
	a, b := startSims(t)
	h, logs := provisionForTest(t, "", a, b)
	key := "client-key-7f3a9"
	for _, sent := range []string{key, ""} {
		r, _ := caddyRequest("key-"+sent, "")
		if sent != "" {
			r.Header.Set("Idempotency-Key", sent)
		}
		if err := h.ServeHTTP(httptest.NewRecorder(), r, forbiddenNext(t)); err != nil {
			t.Fatal(err)
		}
	}
	entries := logs.FilterMessage(logMessage).All()
	if len(entries) != 2 {
		t.Fatalf("%d log lines, want 2", len(entries))
	}
	keyed := entries[0].ContextMap()
	if got := keyed["idempotency_key_hash"]; got != core.KeyHash(key) {
		t.Errorf("keyed request: idempotency_key_hash = %v, want %q", got, core.KeyHash(key))
	}
	if line := encodeLogEntry(t, entries[0]); strings.Contains(line, key) {
		t.Errorf("the log line carries the idempotency key: %s", line)
	}
	if got, ok := entries[1].ContextMap()["idempotency_key_hash"]; ok {
		t.Errorf("request without a key: idempotency_key_hash = %v, want no field", got)
	}
}
