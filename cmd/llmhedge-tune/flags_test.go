package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestFlagErrorsAreClear(t *testing.T) {
	t.Setenv("TUNE_EMPTY_KEY", "")
	ok := "name=a,url=http://127.0.0.1:1,model=m"
	badLines := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(badLines, []byte(`{"prompt":"fine"}`+"\n"+`{"messages":"not an array"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{nil, "at least one -endpoint is required"},
		{[]string{"-endpoint", "name=a"}, "url= is required"},
		{[]string{"-endpoint", "url=ftp://x"}, "scheme must be http or https"},
		{[]string{"-endpoint", "url=http://"}, "has no host"},
		{[]string{"-endpoint", "url=http://u:p@x"}, "must not have a query, fragment or user info"},
		{[]string{"-endpoint", "url=http://x,format=grpc"}, `format "grpc": want openai or anthropic`},
		{[]string{"-endpoint", "url=http://x,key=sk-123"}, `unknown key "key"`},
		{[]string{"-endpoint", "url=http://x,name"}, `"name" is not key=value`},
		{[]string{"-endpoint", "url=http://x,url=http://y"}, "url given twice"},
		{[]string{"-endpoint", "url=http://x,key_env=sk-live-123"}, "is not an environment variable name"},
		{[]string{"-endpoint", "url=http://x,name=a b"}, "must not contain spaces"},
		{[]string{"-endpoint", ok, "-endpoint", ok}, `name "a" is used twice`},
		{[]string{"-endpoint", ok, "-n", "0"}, "-n 0: want 1 to 10000"},
		{[]string{"-endpoint", ok, "-n", "20000"}, "-n 20000: want 1 to 10000"},
		{[]string{"-endpoint", ok, "-concurrency", "0"}, "-concurrency 0: want 1 to 256"},
		{[]string{"-endpoint", ok, "-target-extra", "5"}, "-target-extra 5: want a fraction between 0 and 1"},
		{[]string{"-endpoint", ok, "-price-per-mtok", "-1"}, "must not be negative"},
		{[]string{"-endpoint", ok, "-timeout", "0s"}, "-timeout 0s must be positive"},
		{[]string{"-endpoint", ok, "extra"}, `unexpected argument "extra"`},
		{[]string{"-endpoint", ok, "-bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"-endpoint", "url=http://x"}, `the requests name no "model": add model=`},
		{[]string{"-endpoint", ok + ",key_env=TUNE_EMPTY_KEY"}, "environment variable TUNE_EMPTY_KEY (key_env) is not set or empty"},
		{[]string{"-endpoint", ok, "-requests", filepath.Join(t.TempDir(), "missing.jsonl")}, "no such file"},
		{[]string{"-endpoint", ok, "-requests", badLines}, `line 2: want "messages" as a non-empty array`},
	}
	for _, c := range cases {
		code, stdout, stderr := runTune(context.Background(), c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", c.args, code, stderr, exitUsage, c.want)
		}
		if stdout != "" {
			t.Errorf("%q: printed %q before failing", c.args, stdout)
		}
	}
}

func TestHelp(t *testing.T) {
	code, _, stderr := runTune(context.Background(), "-h")
	if code != exitOK {
		t.Errorf("-h exits %d", code)
	}
	for _, want := range []string{"-endpoint name=...,url=...", "-target-extra", "-price-per-mtok", "Ctrl-C"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("usage lacks %q", want)
		}
	}
}

func TestParseEndpoint(t *testing.T) {
	cases := []struct {
		spec string
		want endpoint
		url  string
	}{
		{"url=https://api.openai.com", endpoint{Name: "api.openai.com", Base: "https://api.openai.com", Format: "openai"},
			"https://api.openai.com/v1/chat/completions"},
		{"name=x,url=https://h.test/v1/,key_env=K,model=m", endpoint{Name: "x", Base: "https://h.test", KeyEnv: "K", Format: "openai", Model: "m"},
			"https://h.test/v1/chat/completions"},
		{"url=http://h.test:8080/proxy/v1,format=anthropic", endpoint{Name: "h.test:8080", Base: "http://h.test:8080/proxy", Format: "anthropic"},
			"http://h.test:8080/proxy/v1/messages"},
	}
	for _, c := range cases {
		got, err := parseEndpoint(c.spec)
		if err != nil || !reflect.DeepEqual(got, c.want) || got.URL() != c.url {
			t.Errorf("%q: %+v %q %v; want %+v %q", c.spec, got, got.URL(), err, c.want, c.url)
		}
	}
}

// TestURLRule: a URL that already ends with the format's API path is used
// as is; a base URL, with or without /v1, gets the API path appended.
func TestURLRule(t *testing.T) {
	for spec, want := range map[string]string{
		"url=https://api.anthropic.com/v1/messages,format=anthropic":   "https://api.anthropic.com/v1/messages",
		"format=anthropic,url=https://api.anthropic.com/v1/messages/":  "https://api.anthropic.com/v1/messages",
		"url=https://api.anthropic.com,format=anthropic":               "https://api.anthropic.com/v1/messages",
		"url=https://api.anthropic.com/v1,format=anthropic":            "https://api.anthropic.com/v1/messages",
		"url=https://api.openai.com/v1/chat/completions":               "https://api.openai.com/v1/chat/completions",
		"url=https://openrouter.ai/api/v1":                             "https://openrouter.ai/api/v1/chat/completions",
		"url=http://127.0.0.1:9001/gw/v1/chat/completions,model=m":     "http://127.0.0.1:9001/gw/v1/chat/completions",
		"url=http://127.0.0.1:9001/v1/messages/extra,format=anthropic": "http://127.0.0.1:9001/v1/messages/extra/v1/messages",
	} {
		e, err := parseEndpoint(spec)
		if err != nil {
			t.Errorf("%q: %v", spec, err)
			continue
		}
		if e.URL() != want {
			t.Errorf("%q: URL %q, want %q", spec, e.URL(), want)
		}
	}
	// A full URL of the other format is a mistake worth naming.
	_, err := parseEndpoint("url=https://api.anthropic.com/v1/messages")
	if err == nil || !strings.Contains(err.Error(), "add format=anthropic") {
		t.Errorf("openai endpoint with a /v1/messages URL: error %v, want one that says add format=anthropic", err)
	}
}

// TestEndpointUsageSaysModelIsRequired: -h must not present model= as
// optional (the built-in prompts name no model).
func TestEndpointUsageSaysModelIsRequired(t *testing.T) {
	_, _, stderr := runTune(context.Background(), "-h")
	if strings.Contains(stderr, "[,model=") {
		t.Errorf("-endpoint usage shows model as optional:\n%s", stderr)
	}
	if !strings.Contains(stderr, "model= is required unless every -requests line names its model") {
		t.Errorf("-endpoint usage does not say model= is required:\n%s", stderr)
	}
	if !strings.Contains(stderr, "full API URL, used as is") {
		t.Errorf("-endpoint usage does not state the URL rule:\n%s", stderr)
	}
}

// TestPlanPrintsCapAndSpend checks the plan before anything is sent: the
// hard cap, the token estimate (body bytes / 4) and the spend.
func TestPlanPrintsCapAndSpend(t *testing.T) {
	t.Setenv("TUNE_PLAN_KEY", "sk-plan-secret")
	opts, err := parseFlags([]string{
		"-endpoint", "name=a,url=http://127.0.0.1:1,key_env=TUNE_PLAN_KEY,model=m1",
		"-endpoint", "name=b,url=http://127.0.0.1:2,format=anthropic,model=m2",
		"-n", "250", "-price-per-mtok", "3",
	}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPlan(opts)
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	for e := 0; e < 2; e++ {
		for i := 0; i < 250; i++ {
			want += int64(len(p.body(e, i))+3) / 4
		}
	}
	if got, spend := p.promptTokens(); got != want || want < 250*2*10 || math.Abs(spend-float64(want)*3/1e6) > 1e-12 {
		t.Fatalf("tokens %d, want %d", got, want)
	}
	var buf bytes.Buffer
	p.print(&buf)
	out := buf.String()
	for _, s := range []string{
		"250 requests to each of 2 endpoint(s) = 500 requests at most (hard cap)",
		"http://127.0.0.1:1/v1/chat/completions", "http://127.0.0.1:2/v1/messages", "$TUNE_PLAN_KEY",
		"Estimated prompt tokens: " + thousands(want),
		"spend ≈ $",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("plan lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "sk-plan-secret") {
		t.Error("plan shows the key")
	}
	// Without a price the spend is not guessed.
	for i := range opts.Endpoints {
		opts.Endpoints[i].PriceIn = 0
	}
	buf.Reset()
	p.print(&buf)
	if !strings.Contains(buf.String(), "spend not estimated (set price_in= on the endpoints or -price-per-mtok)") {
		t.Errorf("plan without price:\n%s", buf.String())
	}
}

func TestConfirm(t *testing.T) {
	for answer, want := range map[string]bool{"y\n": true, "YES\n": true, "n\n": false, "\n": false, "": false} {
		var out bytes.Buffer
		if got := confirm(strings.NewReader(answer), &out); got != want || !strings.Contains(out.String(), "[y/N]") {
			t.Errorf("answer %q: %v, want %v", answer, got, want)
		}
	}
}

func TestReadRequests(t *testing.T) {
	in := `{"prompt":"hi","temperature":0}

{"model":"x","messages":[{"role":"user","content":"yo"}],"stream":false}
`
	reqs, err := readRequests(strings.NewReader(in))
	if err != nil || len(reqs) != 2 {
		t.Fatalf("%d requests, %v", len(reqs), err)
	}
	body, err := bodyFor(reqs[0], endpoint{Name: "e", Format: formatOpenAI, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	_ = json.Unmarshal(body, &got)
	if got["stream"] != true || got["model"] != "m" || got["temperature"] != float64(0) || got["prompt"] != nil {
		t.Errorf("body %s", body)
	}
	// The file's own model is kept when the endpoint sets none; stream is forced.
	body, _ = bodyFor(reqs[1], endpoint{Name: "e", Format: formatOpenAI})
	if !strings.Contains(string(body), `"model":"x"`) || !strings.Contains(string(body), `"stream":true`) {
		t.Errorf("body %s", body)
	}
	for _, bad := range []string{`[1,2]`, `{"prompt":""}`, `{"prompt":"a","messages":[]}`, `not json`, `{}`} {
		if _, err := readRequests(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if _, err := readRequests(strings.NewReader("\n\n")); err == nil {
		t.Error("an empty file is accepted")
	}
}

func TestAnthropicBody(t *testing.T) {
	req := chatRequest{"messages": json.RawMessage(`[{"role":"system","content":"a"},{"role":"user","content":"q"},{"role":"system","content":"b"}]`),
		"stream_options": json.RawMessage(`{"include_usage":true}`)}
	body, err := bodyFor(req, endpoint{Name: "c", Format: formatAnthropic, Model: "claude"})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		System    string           `json:"system"`
		Messages  []map[string]any `json:"messages"`
		MaxTokens int              `json:"max_tokens"`
		Stream    bool             `json:"stream"`
		Options   any              `json:"stream_options"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if got.System != "a\n\nb" || len(got.Messages) != 1 || got.MaxTokens != anthropicMaxTokens || !got.Stream || got.Options != nil {
		t.Errorf("anthropic body %s", body)
	}
	req["messages"] = json.RawMessage(`[{"role":"system","content":[{"type":"text","text":"a"}]}]`)
	if _, err := bodyFor(req, endpoint{Name: "c", Format: formatAnthropic, Model: "claude"}); err == nil {
		t.Error("a structured system message is silently dropped")
	}
}

// TestDevNullIsNoTerminal: CI runs with stdin on /dev/null, a character
// device; the command must not wait for a confirmation there.
func TestDevNullIsNoTerminal(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTerminal(f) || isTerminal(&bytes.Buffer{}) {
		t.Error("/dev/null or a buffer taken for a terminal")
	}
}
