package core

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/redact"
)

// The canaries stand for credentials: none may reach an answer, a report
// or a configuration error.
const (
	canaryQuery  = "CANARYQUERY"
	canaryHeader = "CANARYHEADER"
)

func mustNotContain(t *testing.T, what, text string, needles ...string) {
	t.Helper()
	for _, n := range needles {
		if strings.Contains(text, n) {
			t.Fatalf("%s contains %q: %q", what, n, text)
		}
	}
}

func TestRedactURL(t *testing.T) {
	cases := map[string]string{
		"http://user:pass@h.test/p?key=secret&a=b#frag": "http://REDACTED@h.test/p?key=REDACTED&a=REDACTED#REDACTED",
		"https://h.test:8443/v1?flag":                   "https://h.test:8443/v1?REDACTED",
		"http://h.test/a@b?x=":                          "http://h.test/a@b?x=REDACTED",
		"http://us er:pw@h":                             "http://REDACTED@h",
	}
	for in, want := range cases {
		if got := redact.URL(in); got != want {
			t.Errorf("redact.URL(%q) = %q, want %q", in, got, want)
		}
	}
	msg := `Post "http://10.0.0.7:9/v1/chat?key=` + canaryQuery + `": dial tcp 10.0.0.7:9: connect: refused; Bearer ` + canaryHeader
	got := redact.Text(msg, secretsOf([]config.UpstreamConfig{{SetHeaders: map[string]string{"Authorization": "Bearer " + canaryHeader}}}))
	want := `Post "http://10.0.0.7:9/v1/chat?key=REDACTED": dial tcp 10.0.0.7:9: connect: refused; REDACTED`
	if got != want {
		t.Fatalf("redactText = %q, want %q", got, want)
	}
}

// Validate quotes upstream URLs redacted, and rejects userinfo (which the
// engine would silently drop) pointing at set_headers.
func TestValidateRedactsURLs(t *testing.T) {
	cfg := config.Config{Upstreams: []config.UpstreamConfig{
		{URL: "http://h.test/v1?key=" + canaryQuery + "#frag"},
		{URL: "http://user:" + canaryQuery + "@h.test"},
		{URL: "http://us er:" + canaryQuery + "@h.test"}, // does not parse
		{URL: "ftp://h.test/#" + canaryQuery},
		{URL: "http://h.test", SetHeaders: map[string]string{"Authorization": "Bearer " + canaryHeader + "\n"}},
	}}
	err := cfg.Validate()
	if err == nil {
		t.Fatal("Validate accepted bad upstream URLs")
	}
	msg := err.Error()
	mustNotContain(t, "Validate error", msg, canaryQuery, canaryHeader)
	for _, want := range []string{
		`upstream 0: url "http://h.test/v1?key=REDACTED#REDACTED" must not have a fragment`,
		`upstream 1: url "http://REDACTED@h.test" has a user name or password, which is never sent`,
		`set_headers Authorization "Basic <base64 of user:password>"`,
		`upstream 2: url "http://REDACTED@h.test" is not a valid URL`,
		`upstream 3: url "ftp://h.test/#REDACTED": scheme must be http or https`,
		`upstream 4: header "Authorization" has a control character`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("Validate error lacks %q:\n%s", want, msg)
		}
	}
}

// A user:password in an upstream URL is rejected, never silently dropped.
func TestValidateRejectsUserinfo(t *testing.T) {
	for _, raw := range []string{"http://user:s3cr3tpw@h.test", "https://t0kenvalue@h.test/v1"} {
		err := config.Config{Upstreams: []config.UpstreamConfig{{URL: raw}}}.Validate()
		if err == nil || !strings.Contains(err.Error(), "set_headers Authorization") {
			t.Fatalf("Validate(%q) = %v, want the userinfo rejected with a hint to set_headers", raw, err)
		}
		mustNotContain(t, "Validate error", err.Error(), "s3cr3tpw", "t0kenvalue")
	}
}

// Real transport errors: a refused connection and a name the resolver
// cannot resolve. The client gets a code and the configured name; the
// report gets the cause, redacted.
func TestTransportErrorsReachNoClient(t *testing.T) {
	refused := closedPort(t, "tcp")
	dnsPort := closedPort(t, "udp")
	dialer := &net.Dialer{Timeout: 5 * time.Second, Resolver: &net.Resolver{PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "udp", dnsPort)
		}}}
	// A literal, not the method value dialer.DialContext: Yaegi cannot
	// convert a compiled method value to a func field.
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialer.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	cfg := config.Config{
		Upstreams: []config.UpstreamConfig{
			{Name: "a", URL: "http://" + refused, SetHeaders: map[string]string{"Authorization": "Bearer " + canaryHeader}},
			{Name: "b", URL: "http://internal-name.invalid:8123/v1?api-version=1&key=" + canaryURLKey},
		},
		Delay:       config.DelayConfig{Fixed: config.Duration(time.Hour)},
		Budget:      config.BudgetConfig{Ratio: -1},
		MaxAttempts: 2,
	}
	reports := make(chan *Report, 1)
	h, err := New(cfg, Options{Transport: tr, Observer: ObserverFunc(func(r *Report) { reports <- r })})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("POST", "/v1/chat/completions?key="+canaryQuery, strings.NewReader(`{"model":"m"}`))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.Handle(rec, req)
	rep := <-reports
	body := rec.Body.String()
	_, refusedPort, _ := net.SplitHostPort(refused)
	_, dnsPortOnly, _ := net.SplitHostPort(dnsPort)
	mustNotContain(t, "client body", body, canaryQuery, canaryHeader, "127.0.0.1", refusedPort, dnsPortOnly,
		"internal-name", "8123", "dial", "lookup", canaryURLKey)
	if rec.Code != http.StatusBadGateway {
		t.Fatalf("rec.Code = %v, want http.StatusBadGateway", rec.Code)
	} else if !strings.Contains(body, `"type":"upstream_error","code":"upstream_unreachable"`) {
		t.Fatalf("body = %q, want it to contain `\"type\":\"upstream_error\",\"code\":\"upstream_unreachable\"`", body)
	}
	if len(rep.Attempts) != 2 {
		t.Fatalf("attempts = %d, want 2", len(rep.Attempts))
	}
	for _, a := range rep.Attempts {
		if a.Error == "" {
			t.Fatalf("attempt %d has no error in the report", a.Index)
		}
		mustNotContain(t, "report error", a.Error, canaryQuery, canaryHeader, canaryURLKey)
	}
}

// canaryURLKey is a provider key carried in an upstream URL's query.
const canaryURLKey = "CANARY-URL-KEY-5d2e"

// An upstream URL's own query (Azure's api-version, a provider key) reaches
// the upstream before the client's query.
func TestUpstreamQueryComesBeforeTheClients(t *testing.T) {
	got := make(chan string, 2)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.URL.RawQuery
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}]}`)
	}))
	defer up.Close()
	h, err := New(config.Config{Upstreams: []config.UpstreamConfig{{Name: "a", URL: up.URL + "/v1?api-version=2024-06-01&key=" + canaryURLKey}}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ client, want string }{
		{"", "api-version=2024-06-01&key=" + canaryURLKey},
		{"?x=1", "api-version=2024-06-01&key=" + canaryURLKey + "&x=1"},
	} {
		rec := httptest.NewRecorder()
		h.Handle(rec, httptest.NewRequest("POST", "/chat/completions"+tc.client, strings.NewReader(`{}`)))
		if rec.Code != http.StatusOK {
			t.Fatalf("client query %q: status %d, want 200", tc.client, rec.Code)
		}
		if q := <-got; q != tc.want {
			t.Errorf("client query %q: upstream got query %q, want %q", tc.client, q, tc.want)
		}
	}
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T, network string) string {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := c.LocalAddr().String()
		c.Close()
		return addr
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// An upstream error event that quotes the configured key, and an upstream
// that answers an error status with an empty body: the key reaches neither
// the client nor the report.
func TestUpstreamTextQuotingAKeyIsRedacted(t *testing.T) {
	cfg := testConfig()
	cfg.Upstreams[0].SetHeaders = map[string]string{"Authorization": "Bearer " + canaryHeader}
	hs := newHarness(t, cfg)
	out := hs.serve(chatRequest(""))
	a := hs.tr.next(t)
	a.respond(200, "text/event-stream")
	a.write("event: error\ndata: {\"error\":{\"message\":\"invalid key " + canaryHeader + "\"}}\n\n")
	a.end()
	b := hs.tr.next(t)
	b.respond(503, "")
	b.end()
	res := <-out
	rep := <-hs.reports
	mustNotContain(t, "client body", bodyOf(res), canaryHeader)
	want := `{"error":{"message":"upstream \"B\" answered 503","type":"upstream_error","code":"upstream_error"}}` + "\n"
	if res.rec.Code != 503 {
		t.Fatalf("res.rec.Code = %v, want 503", res.rec.Code)
	} else if bodyOf(res) != want {
		t.Fatalf("bodyOf(res) = %v, want %v", bodyOf(res), want)
	}
	for _, at := range rep.Attempts {
		mustNotContain(t, "report error", at.Error, canaryHeader)
	}
	if !strings.Contains(rep.Attempts[0].Error, "invalid key REDACTED") {
		t.Fatalf("attempt 0 error = %q, want the upstream's message with the key redacted", rep.Attempts[0].Error)
	}
}

// Without a configured name the client learns the upstream's index, not
// its host.
func TestUnnamedUpstreamIsNamedByIndex(t *testing.T) {
	cfg := testConfig()
	// Named after its host as an adapter may have filled it in.
	cfg.Upstreams = []config.UpstreamConfig{{URL: "http://secret-host.test:7777", Name: "secret-host.test:7777"}}
	cfg.MaxAttempts = 1
	hs := newHarness(t, cfg)
	out := hs.serve(chatRequest(""))
	// A compiled error: under Yaegi an interpreted type does not satisfy
	// the compiled net.Error in a type assertion.
	hs.tr.next(t).fail(&net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded})
	res := <-out
	want := `{"error":{"message":"upstream 0 did not answer in time","type":"upstream_error","code":"upstream_timeout"}}` + "\n"
	if bodyOf(res) != want {
		t.Fatalf("client got %q, want %q", bodyOf(res), want)
	}
}
