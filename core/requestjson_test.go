package core

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
)

// rejectedBeforeUpstream serves body and wants it answered with status and
// an OpenAI-shaped error of the given code, with no upstream contacted.
func rejectedBeforeUpstream(t *testing.T, cfg config.Config, path, body string, status int, code string) {
	t.Helper()
	tr := &refusingTransport{}
	shown := body
	if len(shown) > 80 {
		shown = shown[:80] + "…"
	}
	h, err := New(cfg, Options{Transport: tr, Clock: newFakeClock()})
	if err != nil {
		t.Fatal(err)
	}
	r := chatRequest(body)
	r.URL.Path = path
	rec := httptest.NewRecorder()
	h.Handle(rec, r)
	if rec.Code != status || !strings.Contains(rec.Body.String(), `"code":"`+code+`"`) ||
		!strings.HasPrefix(rec.Body.String(), `{"error":{"message":`) {
		t.Errorf("body %s: got %d %q, want %d with code %s", shown, rec.Code, rec.Body.String(), status, code)
	}
	if n := atomic.LoadInt32(&tr.calls); n != 0 {
		t.Errorf("body %s: %d upstream attempts, want 0", shown, n)
	}
}

// refusingTransport counts attempts and fails each at once.
type refusingTransport struct{ calls int32 }

func (tr *refusingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	atomic.AddInt32(&tr.calls, 1)
	return nil, errors.New("connection refused")
}

// A client cannot reach the model the operator replaced: upstreams decode
// the last of duplicate keys, the engine would rewrite the first, and Go
// decoders (Ollama) match keys ignoring case.
func TestModelRewriteCannotBeBypassed(t *testing.T) {
	cfg := testConfig()
	cfg.Upstreams[0].Model = "allowed"
	cfg.Upstreams[1].Model = "allowed"
	for body, code := range map[string]string{
		`{"model":"gpt-x","messages":[],"model":"expensive"}`:                               "duplicate_key",
		`{"model":"gpt-x","mod\u0065l":"expensive"}`:                                        "duplicate_key",
		`{"model":"gpt-x","MODEL":"expensive"}`:                                             "ambiguous_key",
		`{"Model":"expensive"}`:                                                             "ambiguous_key",
		`{"model":"gpt-x","stream":true,"stre\u0061m":false}`:                               "duplicate_key",
		`{"model":"gpt-x","messages":[{"model":"nested is fine"}],` + "\n" + `"model":"x"}`: "duplicate_key",
	} {
		rejectedBeforeUpstream(t, cfg, "/v1/chat/completions", body, 400, code)
	}
}

// An escaped key is rewritten in place, and nested "model" keys are left.
func TestModelRewriteReadsEscapedKey(t *testing.T) {
	got, err := rewriteModel([]byte(`{"mod\u0065l":"gpt-x","messages":[{"model":"keep"}]}`), "allowed")
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"mod\u0065l":"allowed","messages":[{"model":"keep"}]}`; string(got) != want {
		t.Fatalf("rewriteModel = %s, want %s", got, want)
	}
}

// A body over max_body cannot be rewritten, so it is refused (413) rather
// than forwarded with the client's model.
func TestOversizedBodyWithModelRewriteIs413(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBody = 1024
	cfg.Upstreams[1].Model = "allowed"
	big := `{"model":"expensive","pad":"` + strings.Repeat("x", 2000) + `"}`
	rejectedBeforeUpstream(t, cfg, "/v1/chat/completions", big, 413, "request_too_large")
}

// The state check cannot be dodged by sending a key twice or in another
// case: duplicates are refused, and tool types are found however given.
func TestStateKeysCannotBeHidden(t *testing.T) {
	cfg := testConfig()
	for body, code := range map[string]string{
		`{"store":true,"store":false}`:                "duplicate_key",
		`{"background":true,"backgr\u006fund":false}`: "duplicate_key",
		`{"store":true,"Store":false}`:                "ambiguous_key",
		`{"tools":[{"type":"mcp"}],"tools":[]}`:       "duplicate_key",
		"{\"bac\u212Aground\":true}":                  "ambiguous_key", // the Kelvin sign folds to k
		`{"ſtore":false}`:                             "ambiguous_key", // folds to "store" in Go's decoder
	} {
		rejectedBeforeUpstream(t, cfg, "/v1/chat/completions", body, 400, code)
	}
	// The Responses API stores unless "store" is false: a miscased false
	// must not pass for it.
	rejectedBeforeUpstream(t, cfg, "/v1/responses", `{"model":"m","Store":false}`, 400, "ambiguous_key")

	for body, want := range map[string]bool{
		`{"tools":[{"type":"mcp","type":"function"}]}`:         true,
		`{"tools":[{"TYPE":"function","type":"m\u0063p"}]}`:    true,
		`{"tools":[{"type":"computer_use_preview"}]}`:          true,
		`{"tools":[{"type":"function","name":"get_weather"}]}`: false,
		`{"model":"m","store":null}`:                           false,
	} {
		if got := mayChangeState([]byte(body), "/v1/chat/completions"); got != want {
			t.Errorf("mayChangeState(%s) = %v, want %v", body, got, want)
		}
	}
	if !mayChangeState([]byte(`{"model":"m","store":null}`), "/v1/responses") {
		t.Error(`mayChangeState({"store":null}) on /v1/responses = false, want true (the API stores by default)`)
	}
}
