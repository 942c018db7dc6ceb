package lighttrace

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// collector is an OTLP/HTTP endpoint for tests: every post is handed to
// the test through posts, then answered with status once hold is closed.
type collector struct {
	srv    *httptest.Server
	posts  chan received
	hold   chan struct{} // closed: answer; open: each post waits
	status int
}

// received is one post as the collector saw it; timeout marks the value
// a waiting test gets when none came in time.
type received struct {
	path    string
	header  http.Header
	body    []byte
	timeout bool
}

// startCollector serves posts answered with status, held until release
// when held is true.
func startCollector(t *testing.T, status int, held bool) *collector {
	c := &collector{posts: make(chan received, 64), hold: make(chan struct{}), status: status}
	if !held {
		close(c.hold)
	}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(func() { c.srv.Close() })
	return c
}

func (c *collector) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	c.posts <- received{path: r.URL.Path, header: r.Header.Clone(), body: body}
	<-c.hold
	w.WriteHeader(c.status)
}

// release answers the held post and every later one.
func (c *collector) release() { close(c.hold) }

// next waits for the collector's next post, failing t after 10 s.
func (c *collector) next(t *testing.T) received {
	t.Helper()
	posts := c.posts
	timer := time.AfterFunc(10*time.Second, func() { posts <- received{timeout: true} })
	p := <-posts
	timer.Stop()
	if p.timeout {
		t.Fatal("no post reached the collector within 10s")
	}
	return p
}

// decoded is a post's body as generic JSON (compiled types, safe to read
// under Yaegi).
func decoded(t *testing.T, body []byte) map[string]interface{} {
	t.Helper()
	var v map[string]interface{}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("body is not JSON: %v: %s", err, body)
	}
	return v
}

// otlpSpans lists the spans of a decoded ExportTraceServiceRequest, and
// its service.name and scope name (the one resource and scope it holds).
func otlpSpans(t *testing.T, req map[string]interface{}) ([]map[string]interface{}, string, string) {
	t.Helper()
	rss := list(t, req, "resourceSpans")
	if len(rss) != 1 {
		t.Fatalf("%d resourceSpans, want 1", len(rss))
	}
	rs := rss[0].(map[string]interface{})
	service := ""
	for _, a := range list(t, field(t, rs, "resource"), "attributes") {
		kv := a.(map[string]interface{})
		if kv["key"] == "service.name" {
			service, _ = field(t, kv, "value")["stringValue"].(string)
		}
	}
	sss := list(t, rs, "scopeSpans")
	if len(sss) != 1 {
		t.Fatalf("%d scopeSpans, want 1", len(sss))
	}
	ss := sss[0].(map[string]interface{})
	scopeName, _ := field(t, ss, "scope")["name"].(string)
	var out []map[string]interface{}
	for _, s := range list(t, ss, "spans") {
		out = append(out, s.(map[string]interface{}))
	}
	return out, service, scopeName
}

func field(t *testing.T, m map[string]interface{}, key string) map[string]interface{} {
	t.Helper()
	v, ok := m[key].(map[string]interface{})
	if !ok {
		t.Fatalf("%q is %T (%v), want an object", key, m[key], m[key])
	}
	return v
}

func list(t *testing.T, m map[string]interface{}, key string) []interface{} {
	t.Helper()
	v, ok := m[key].([]interface{})
	if !ok {
		t.Fatalf("%q is %T (%v), want an array", key, m[key], m[key])
	}
	return v
}

// attrs maps a span's attributes to their OTLP value objects.
func attrs(t *testing.T, s map[string]interface{}) map[string]map[string]interface{} {
	t.Helper()
	out := map[string]map[string]interface{}{}
	if _, ok := s["attributes"]; !ok {
		return out
	}
	for _, a := range list(t, s, "attributes") {
		kv := a.(map[string]interface{})
		key, _ := kv["key"].(string)
		out[key] = field(t, kv, "value")
	}
	return out
}
