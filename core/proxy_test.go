package core

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
)

// realHedger returns a Hedger on the system clock and the default
// transport (or tr) whose one upstream is url.
func realHedger(t *testing.T, url string, tr http.RoundTripper) *Hedger {
	t.Helper()
	cfg := config.Config{Upstreams: []config.UpstreamConfig{{Name: "A", URL: url}}}
	h, err := New(cfg, Options{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// frontServer serves h over HTTP/1.1. (Through a HandlerFunc: Yaegi cannot
// hand an interpreted *Hedger to compiled code as an http.Handler.)
func frontServer(h *Hedger) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) }))
}

// rawUpstream answers every request on one connection with response, raw
// bytes: a Go server would rewrite the Connection header under test.
func rawUpstream(t *testing.T, response string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go answerRaw(c, response)
		}
	}()
	return "http://" + ln.Addr().String()
}

// answerRaw reads one request's head and answers it, then closes.
func answerRaw(c net.Conn, response string) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		if line == "\r\n" {
			break
		}
	}
	c.Write([]byte(response))
}

// Hop-by-hop headers of an upstream's answer are connection-level: they
// never reach the client, hedged or passed through, won or failed.
func TestUpstreamHopHeadersAreNotForwarded(t *testing.T) {
	hop := "Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nUpgrade: h2c\r\n" +
		"Proxy-Authenticate: Basic\r\nProxy-Connection: keep-alive\r\nTe: trailers\r\nX-End-To-End: kept\r\n"
	sse := tokenChunk("hi")
	for _, c := range []struct{ name, method, response string }{
		{"hedged winner", "POST", "HTTP/1.1 200 OK\r\n" + hop + "Content-Type: text/event-stream\r\nContent-Length: " +
			strconv.Itoa(len(sse)) + "\r\n\r\n" + sse},
		{"pass-through", "GET", "HTTP/1.1 200 OK\r\n" + hop + "Content-Length: 5\r\n\r\nplain"},
		{"every attempt failed", "POST", "HTTP/1.1 503 Service Unavailable\r\n" + hop + "Content-Length: 2\r\n\r\n{}"},
	} {
		h := realHedger(t, rawUpstream(t, c.response), nil)
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(c.method, "/v1/chat/completions", strings.NewReader(`{"stream":true}`))
		h.Handle(rec, r)
		for _, name := range []string{"Connection", "X-Hop", "Keep-Alive", "Upgrade", "Proxy-Authenticate", "Proxy-Connection", "Te", "Transfer-Encoding"} {
			if v, ok := rec.Header()[name]; ok {
				t.Errorf("%s: header %s = %q reached the client", c.name, name, v)
			}
		}
		if got := rec.Header().Get("X-End-To-End"); got != "kept" {
			t.Errorf("%s: X-End-To-End = %q, want kept", c.name, got)
		}
	}
}

// Pass-through (GET, HEAD) forwards the upstream's Content-Length, as a
// reverse proxy does: the body goes out unchanged.
func TestPassThroughKeepsContentLength(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "11")
		if r.Method != "HEAD" {
			w.Write([]byte("hello world"))
		}
	}))
	defer up.Close()
	front := frontServer(realHedger(t, up.URL, nil))
	defer front.Close()
	for _, method := range []string{"GET", "HEAD"} {
		req, _ := http.NewRequest(method, front.URL+"/v1/models", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := resp.Header.Get("Content-Length"); got != "11" {
			t.Errorf("%s: Content-Length = %q, want 11 (chunked: %v)", method, got, resp.TransferEncoding)
		}
		if want := map[string]string{"GET": "hello world", "HEAD": ""}[method]; string(body) != want {
			t.Errorf("%s: body = %q, want %q", method, body, want)
		}
	}
}

// An encoded character in the client's path reaches the upstream as the
// client sent it: %2F stays %2F (it is not a path separator), whether the
// upstream's URL has a path of its own or not, hedged or passed through.
func TestEscapedPathReachesUpstream(t *testing.T) {
	seen := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.RequestURI
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte(tokenChunk("x")))
	}))
	defer up.Close()
	for _, c := range []struct{ base, method, path, want string }{
		{"", "GET", "/v1/files/a%2Fb/c%20d?x=1", "/v1/files/a%2Fb/c%20d?x=1"},
		{"/", "POST", "/v1/files/a%2Fb", "/v1/files/a%2Fb"},
		{"/base", "GET", "/v1/files/a%2Fb", "/base/v1/files/a%2Fb"},
		{"/base/", "POST", "/v1/vector_stores/vs%2F1/files?after=f%2F2", "/base/v1/vector_stores/vs%2F1/files?after=f%2F2"},
		{"/my%2Fbase", "GET", "/v1/models", "/my%2Fbase/v1/models"},
		{"/my%2Fbase", "POST", "/v1/a%2Fb", "/my%2Fbase/v1/a%2Fb"},
		{"/base", "GET", "/v1/plain/path", "/base/v1/plain/path"},
	} {
		h := realHedger(t, up.URL+c.base, nil)
		r := httptest.NewRequest(c.method, c.path, strings.NewReader(`{"stream":true}`))
		h.Handle(httptest.NewRecorder(), r)
		if got := <-seen; got != c.want {
			t.Errorf("upstream %q, %s %s: upstream got %q, want %q", c.base, c.method, c.path, got, c.want)
		}
	}
}

// trailerUpstream answers with a body and two trailers: X-Checksum
// announced in the Trailer header, X-Late not (http.TrailerPrefix).
func trailerUpstream(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Trailer", "X-Checksum")
	switch {
	case r.Method == "GET":
		h.Set("Content-Type", "text/plain")
		w.Write([]byte("plain"))
	case strings.Contains(r.URL.Path, "json"):
		h.Set("Content-Type", "application/json")
		w.Write([]byte(`{"ok":true}`))
	default:
		h.Set("Content-Type", "text/event-stream")
		w.Write([]byte(tokenChunk("x")))
		w.(http.Flusher).Flush()
		w.Write([]byte("data: [DONE]\n\n"))
	}
	h.Set("X-Checksum", "abc")
	h.Set(http.TrailerPrefix+"X-Late", "late")
}

// Upstream trailers (HTTP/1.1 chunked and HTTP/2) reach the client after
// the body, for a hedged winner (streamed or complete) and pass-through.
func TestUpstreamTrailersAreForwarded(t *testing.T) {
	h1 := httptest.NewServer(http.HandlerFunc(trailerUpstream))
	defer h1.Close()
	h2 := httptest.NewUnstartedServer(http.HandlerFunc(trailerUpstream))
	h2.EnableHTTP2 = true
	h2.StartTLS()
	defer h2.Close()
	for _, up := range []struct {
		name string
		url  string
		tr   http.RoundTripper
	}{{"HTTP/1.1", h1.URL, nil}, {"HTTP/2", h2.URL, h2.Client().Transport}} {
		front := frontServer(realHedger(t, up.url, up.tr))
		for _, c := range []struct{ name, method, path string }{
			{"streamed winner", "POST", "/v1/chat/completions"},
			{"complete winner", "POST", "/v1/json"},
			{"pass-through", "GET", "/v1/models"},
		} {
			req, _ := http.NewRequest(c.method, front.URL+c.path, strings.NewReader(`{"stream":true}`))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("%s %s: status %d", up.name, c.name, resp.StatusCode)
			}
			if got := resp.Trailer.Get("X-Checksum"); got != "abc" {
				t.Errorf("%s %s: trailer X-Checksum = %q, want abc", up.name, c.name, got)
			}
			if got := resp.Trailer.Get("X-Late"); got != "late" {
				t.Errorf("%s %s: trailer X-Late = %q, want late", up.name, c.name, got)
			}
			if got := resp.Header.Get("X-Checksum"); got != "" {
				t.Errorf("%s %s: X-Checksum = %q sent as a header", up.name, c.name, got)
			}
		}
		front.Close()
	}
}

// An idempotency leader (a request with a client key) gets the upstream's
// trailers too, streamed or complete.
func TestUpstreamTrailersReachKeyedLeader(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(trailerUpstream))
	defer up.Close()
	front := frontServer(realHedger(t, up.URL, nil))
	defer front.Close()
	for i, path := range []string{"/v1/chat/completions", "/v1/json"} {
		req, _ := http.NewRequest("POST", front.URL+path, strings.NewReader(`{"stream":true}`))
		req.Header.Set("Idempotency-Key", "trailer-key-"+strconv.Itoa(i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: status %d, want 200", path, resp.StatusCode)
		}
		if got := resp.Trailer.Get("X-Checksum"); got != "abc" {
			t.Errorf("%s: trailer X-Checksum = %q, want abc", path, got)
		}
		if got := resp.Trailer.Get("X-Late"); got != "late" {
			t.Errorf("%s: trailer X-Late = %q, want late", path, got)
		}
	}
}
