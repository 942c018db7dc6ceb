package core

import (
	"net/http"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/redact"
	"github.com/llmhedge/llmhedge/core/stream"
)

// Credentials an upstream may quote back: the gateway's own key (set in
// set_headers) and the client's (sent in its request).
const (
	gatewayKey   = "sk-gateway-secret-123"
	clientOwnKey = "sk-client-own-9876543210"
)

// cfgWithGatewayKey is one upstream that sends the gateway's key, with a
// single attempt: its failure is the client's answer.
func cfgWithGatewayKey() config.Config {
	cfg := testConfig()
	cfg.Upstreams = cfg.Upstreams[:1]
	cfg.Upstreams[0].SetHeaders = map[string]string{"Authorization": "Bearer " + gatewayKey}
	cfg.MaxAttempts = 1
	return cfg
}

// An upstream's error body that quotes the gateway's key reaches the
// client with the key redacted (the rest of the body as it was).
func TestKeptErrorBodyRedactsTheGatewayKey(t *testing.T) {
	hs := newHarness(t, cfgWithGatewayKey())
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(401, "application/json")
	a.write(`{"error":{"message":"Incorrect API key provided: ` + gatewayKey + `"}}`)
	a.end()
	res := <-out
	<-hs.reports
	want := `{"error":{"message":"Incorrect API key provided: REDACTED"}}`
	if res.rec.Code != 401 {
		t.Fatalf("res.rec.Code = %v, want 401", res.rec.Code)
	} else if bodyOf(res) != want {
		t.Fatalf("bodyOf(res) = %v, want %v", bodyOf(res), want)
	}
}

// A complete 2xx answer without output, kept as the client's best answer,
// is redacted the same way.
func TestKeptAnswerWithoutOutputRedactsTheGatewayKey(t *testing.T) {
	hs := newHarness(t, cfgWithGatewayKey())
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write(": key " + gatewayKey + "\n\ndata: [DONE]\n\n")
	a.end()
	res := <-out
	<-hs.reports
	want := ": key REDACTED\n\ndata: [DONE]\n\n"
	if res.rec.Code != 200 {
		t.Fatalf("res.rec.Code = %v, want 200", res.rec.Code)
	} else if bodyOf(res) != want {
		t.Fatalf("bodyOf(res) = %v, want %v", bodyOf(res), want)
	}
}

// An upstream error message long enough to be cut inside the key: no part
// of the key (not even its start) reaches the report.
func TestReasonIsRedactedBeforeItIsCut(t *testing.T) {
	hs := newHarness(t, cfgWithGatewayKey())
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	// The key starts 6 bytes before WithDetail's cut.
	msg := strings.Repeat("x", stream.MaxReason-7) + " " + gatewayKey
	a.write("event: error\ndata: {\"error\":{\"message\":\"" + msg + "\"}}\n\n")
	a.end()
	<-out
	rep := <-hs.reports
	got := rep.Attempts[0].Error
	mustNotContain(t, "report error", got, gatewayKey[:redact.MinSecretLen])
	if !strings.HasPrefix(got, "upstream error event: xxx") {
		t.Fatalf("got = %q, want it to start with \"upstream error event: xxx\"", got)
	} else if len(got) > len("upstream error event: ")+stream.MaxReason+len("…") {
		t.Fatalf("len(got) = %v, want <= len(\"upstream error event: \")+MaxReason+len(\"…\") (%v)", len(got), len("upstream error event: ")+stream.MaxReason+len("…"))
	}
}

// The client's own credential, echoed in an upstream's error event, does
// not reach the report (and so no adapter's log).
func TestReasonRedactsTheClientsOwnCredential(t *testing.T) {
	for _, header := range []string{"Authorization", "X-Api-Key", "X-Goog-Api-Key"} {
		hs := newHarness(t, cfgWithGatewayKey())
		r := chatRequest("")
		value := clientOwnKey
		if header == "Authorization" {
			value = "Bearer " + clientOwnKey
		}
		r.Header.Set(header, value)
		out := hs.serve(r)
		a := hs.tr.next(t)
		a.respond(200, "text/event-stream")
		a.write("event: error\ndata: {\"error\":{\"message\":\"invalid key " + clientOwnKey + "\"}}\n\n")
		a.end()
		<-out
		rep := <-hs.reports
		if got, want := rep.Attempts[0].Error, "upstream error event: invalid key REDACTED"; got != want {
			t.Errorf("%s: report error = %q, want %q", header, got, want)
		}
	}
}

// A query part without "=" is a value: it may be a bare key.
func TestBareQueryPartIsRedacted(t *testing.T) {
	const raw = "https://h.test/v1/chat?sk-bare-secret-1"
	if got, want := redact.URL(raw), "https://h.test/v1/chat?REDACTED"; got != want {
		t.Errorf("redact.URL(%q) = %q, want %q", raw, got, want)
	}
	secrets := secretsOf([]config.UpstreamConfig{{URL: raw}})
	if got, want := redact.Text("upstream said: bad key sk-bare-secret-1", secrets), "upstream said: bad key REDACTED"; got != want {
		t.Errorf("redactText with the URL's secrets = %q, want %q", got, want)
	}
	if got, want := redact.URL("http://h.test/?a=1&&flag&b"), "http://h.test/?a=REDACTED&&REDACTED&REDACTED"; got != want {
		t.Errorf("redactURL = %q, want %q", got, want)
	}
}

// Gemini callers, told apart by X-Goog-Api-Key alone, do not share an
// idempotency key's answer.
func TestIdempotencyScopesGeminiCallers(t *testing.T) {
	hs := newHarness(t, testConfig())
	gemini := func(apiKey string) *http.Request {
		r := keyed("", "shared-key")
		r.Header.Set("X-Goog-Api-Key", apiKey)
		return r
	}
	hs.answerNextCall("A")
	ra := <-hs.serve(gemini("AIza-caller-A"))
	if bodyOf(ra) != tokenChunk("A") {
		t.Fatalf("caller A got %q, want %q", bodyOf(ra), tokenChunk("A"))
	}
	hs.answerNextCall("B")
	rb := <-hs.serve(gemini("AIza-caller-B"))
	if got := rb.rec.Header().Get("Idempotent-Replayed"); got != "" {
		t.Fatalf("caller B: got = %q, want \"\"", got)
	} else if bodyOf(rb) != tokenChunk("B") {
		t.Fatalf("caller B: bodyOf(rb) = %v, want %v", bodyOf(rb), tokenChunk("B"))
	}
}

// A long message cut by the detector's own bound leaves no fragment of a
// key either, however much redaction before it shortened the text.
func TestDetailCutLeavesNoTokenFragment(t *testing.T) {
	key := strings.Repeat("K", 1000)
	msg := strings.Repeat(key+" ", stream.MaxDetail/len(key)) + "tail-" + key
	got := redactReason(stream.WithDetail("upstream error", msg), []string{key})
	if strings.Contains(got, "KKKK") {
		t.Fatalf("got = %q, want it not to contain \"KKKK\"", got)
	} else if strings.Contains(got, "tail-") {
		t.Fatalf("got = %q, want it not to contain \"tail-\"", got)
	}
	if !strings.HasPrefix(got, "upstream error: REDACTED REDACTED") {
		t.Fatalf("reason = %q, want it to start with the redacted keys", got)
	}
}

// Configured values that are not credentials (a short feature flag, a
// format parameter) are left alone in a kept error body: replacing them
// would break its JSON for nothing.
func TestKeptErrorBodyKeepsValuesThatAreNotCredentials(t *testing.T) {
	cfg := cfgWithGatewayKey()
	cfg.Upstreams[0].URL = "http://a.test/base?alt=json"
	cfg.Upstreams[0].SetHeaders["X-Feature"] = "true"
	hs := newHarness(t, cfg)
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(400, "application/json")
	body := `{"error":{"message":"Invalid json payload","retryable":true}}`
	a.write(body)
	a.end()
	res := <-out
	<-hs.reports
	if bodyOf(res) != body {
		t.Fatalf("client got %q, want the upstream's body %q unchanged", bodyOf(res), body)
	}
}

// The client's own key sent in its query (Gemini's ?key=) and quoted back
// by the upstream is redacted from the report.
func TestReasonRedactsTheClientsQueryKey(t *testing.T) {
	hs := newHarness(t, cfgWithGatewayKey())
	r := chatRequest("")
	r.URL.RawQuery = "key=" + clientOwnKey
	out := hs.serve(r)
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write("event: error\ndata: {\"error\":{\"message\":\"invalid key " + clientOwnKey + "\"}}\n\n")
	a.end()
	<-out
	rep := <-hs.reports
	if got, want := rep.Attempts[0].Error, "upstream error event: invalid key REDACTED"; got != want {
		t.Errorf("report error = %q, want %q", got, want)
	}
}
