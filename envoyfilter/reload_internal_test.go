package envoyfilter

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/testcert"
)

func stateOf(s *Server, route string) interface{} {
	for _, r := range s.current.Load().table.routes {
		if r.name == route {
			return r.hedger.State()
		}
	}
	return nil
}

// A reload keeps a route's learned state (TTFT estimators, budgets,
// breakers, idempotency table) while its name and upstreams stay the same.
func TestReloadKeepsLearnedState(t *testing.T) {
	parse := func(yaml string) *FileConfig {
		cfg, err := ParseConfig([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	const v1 = "routes:\n  - {name: chat, upstreams: [{url: 'http://a:1'}, {url: 'http://b:1'}], delay: 1s}\n"
	s, err := NewServer(parse(v1), Options{})
	if err != nil {
		t.Fatal(err)
	}
	first := stateOf(s, "chat")
	// Another delay and max_attempts: same shape, same learning.
	if err := s.Reload(parse("routes:\n  - {name: chat, upstreams: [{url: 'http://a:1'}, {url: 'http://b:1'}], delay: 2s, max_attempts: 3}\n")); err != nil {
		t.Fatal(err)
	}
	if stateOf(s, "chat") != first {
		t.Fatal("an unchanged route lost its state on reload")
	}
	if err := s.Reload(parse("routes:\n  - {name: chat, upstreams: [{url: 'http://a:1'}, {url: 'http://c:1'}]}\n")); err != nil {
		t.Fatal(err)
	}
	if stateOf(s, "chat") == first {
		t.Fatal("a route with other upstreams kept the old state")
	}
	second := stateOf(s, "chat")
	if err := s.Reload(parse("routes:\n  - {name: chat2, upstreams: [{url: 'http://a:1'}, {url: 'http://c:1'}]}\n")); err != nil {
		t.Fatal(err)
	}
	if stateOf(s, "chat2") == second {
		t.Fatal("a renamed route shares the old route's budget")
	}
}

// A reload that changes the transport section gives the new routes a
// transport built from it; one that does not keeps the running transport
// (and its pooled connections).
func TestReloadRebuildsTheTransport(t *testing.T) {
	parse := func(yaml string) *FileConfig {
		cfg, err := ParseConfig([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	const routes = "routes:\n  - {name: chat, upstreams: [{url: 'http://a:1'}]}\n"
	s, err := NewServer(parse(routes), Options{})
	if err != nil {
		t.Fatal(err)
	}
	first := s.transport
	if err := s.Reload(parse("log: {level: debug}\n" + routes)); err != nil {
		t.Fatal(err)
	}
	if s.transport != first {
		t.Fatal("a reload without transport changes replaced the transport")
	}
	if err := s.Reload(parse("transport: {idle_conn_timeout: 7s, max_idle_conns_per_host: 3}\n" + routes)); err != nil {
		t.Fatal(err)
	}
	tr, ok := s.transport.(*http.Transport)
	if !ok || tr == first {
		t.Fatal("the transport section changed, but the transport was not rebuilt")
	}
	if tr.IdleConnTimeout != 7*time.Second {
		t.Fatalf("tr.IdleConnTimeout = %v, want %v", tr.IdleConnTimeout, 7*time.Second)
	} else if tr.MaxIdleConnsPerHost != 3 {
		t.Fatalf("tr.MaxIdleConnsPerHost = %v, want 3", tr.MaxIdleConnsPerHost)
	}
	second := s.transport
	if err := s.Reload(parse("transport: {keepalive_idle_timeout: 7s, max_idle_conns_per_host: 3}\n" + routes)); err != nil {
		t.Fatal(err)
	}
	if s.transport != second {
		t.Fatal("keepalive_idle_timeout 7s, the same as idle_conn_timeout 7s, rebuilt the transport")
	}
}

// A reload re-reads transport.tls_trusted_ca_certs: other contents at the
// same path build a new transport, the same contents keep the running one.
func TestReloadRereadsTrustedCAs(t *testing.T) {
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	writeCA := func(serial int64) { testcert.WritePEM(t, caFile, testcert.CA(t, serial).DER) }
	yaml := "transport: {tls_trusted_ca_certs: ['" + caFile + "']}\nroutes:\n  - {name: chat, upstreams: [{url: 'https://a:1'}]}\n"
	parse := func() *FileConfig {
		cfg, err := ParseConfig([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	writeCA(1)
	s, err := NewServer(parse(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	first := s.transport
	if err := s.Reload(parse()); err != nil {
		t.Fatal(err)
	}
	if s.transport != first {
		t.Fatal("a reload with the same CA file contents replaced the transport")
	}
	writeCA(2)
	if err := s.Reload(parse()); err != nil {
		t.Fatal(err)
	}
	if s.transport == first {
		t.Fatal("the CA file changed, but the transport was not rebuilt")
	}
	if err := os.WriteFile(caFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	running := s.transport
	if err := s.Reload(parse()); err == nil {
		t.Fatal("a reload with a CA file without certificates succeeded")
	}
	if s.transport != running {
		t.Fatal("a failed reload replaced the transport")
	}
}
