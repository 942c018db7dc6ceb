package core

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

func TestTransportDefaults(t *testing.T) {
	tr, err := NewTransport(config.TransportConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tr.TLSHandshakeTimeout != 10*time.Second {
		t.Errorf("TLSHandshakeTimeout = %v, want 10s (the dial timeout)", tr.TLSHandshakeTimeout)
	}
	if tr.IdleConnTimeout != 2*time.Minute {
		t.Errorf("IdleConnTimeout = %v, want 2m", tr.IdleConnTimeout)
	}
	if tr.MaxIdleConnsPerHost != 64 {
		t.Errorf("MaxIdleConnsPerHost = %d, want 64", tr.MaxIdleConnsPerHost)
	}
	if tr.ResponseHeaderTimeout != 0 {
		t.Errorf("ResponseHeaderTimeout = %v, want 0", tr.ResponseHeaderTimeout)
	}
	if tr.Proxy != nil {
		t.Error("Proxy is set, want none by default")
	}
	if !tr.ForceAttemptHTTP2 {
		t.Error("ForceAttemptHTTP2 = false, want true")
	}
	d := config.TransportConfig{DialTimeout: config.Duration(3 * time.Second)}.WithDefaults()
	if d.TLSHandshakeTimeout != config.Duration(3*time.Second) {
		t.Errorf("TLSHandshakeTimeout default = %v, want the dial timeout 3s", d.TLSHandshakeTimeout)
	}
	tr, err = NewTransport(config.TransportConfig{ProxyFromEnvironment: true, TLSHandshakeTimeout: config.Duration(time.Second)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Proxy == nil {
		t.Error("Proxy is nil with proxy_from_environment")
	}
	if tr.TLSHandshakeTimeout != time.Second {
		t.Errorf("TLSHandshakeTimeout = %v, want 1s", tr.TLSHandshakeTimeout)
	}
}

func TestTransportValidate(t *testing.T) {
	cases := []struct {
		cfg  config.TransportConfig
		want string
	}{
		{config.TransportConfig{DialTimeout: -1}, "timeouts must not be negative"},
		{config.TransportConfig{TLSHandshakeTimeout: -1}, "timeouts must not be negative"},
		{config.TransportConfig{MaxIdleConnsPerHost: -2}, "max_idle_conns_per_host -2 must not be negative"},
		{config.TransportConfig{Versions: []string{"3"}}, `unknown HTTP version "3"`},
		{config.TransportConfig{Versions: []string{"1.1", "h2c"}}, "1.1 and h2c exclude each other"},
	}
	for _, c := range cases {
		err := c.cfg.Validate()
		if err == nil {
			t.Errorf("err = nil, want an error")
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("err.Error() = %q, want it to contain %q", err.Error(), c.want)
		}
	}
	if err := (config.TransportConfig{}).WithDefaults().Validate(); err != nil {
		t.Errorf("defaults: Validate() = %v, want nil", err)
	}
}

func TestTransportTrustedCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.TransportConfig{TLSTrustedCACerts: []string{caFile}}
	read, err := cfg.ReadCACerts()
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTransport(cfg, read)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err != nil {
		t.Fatalf("GET through the trusted CA: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("status = %d, want 204", resp.StatusCode)
	}

	system, err := NewTransport(config.TransportConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer system.CloseIdleConnections()
	if resp, err := (&http.Client{Transport: system}).Get(srv.URL); err == nil {
		resp.Body.Close()
		t.Error("the system roots accepted the test server's certificate")
	}

	if _, err := NewTransport(cfg, []byte("not a certificate")); err == nil {
		t.Errorf("NewTransport without a certificate: err = nil, want an error")
	} else if !strings.Contains(err.Error(), "no certificate found") {
		t.Errorf("NewTransport without a certificate: err.Error() = %q, want it to contain \"no certificate found\"", err.Error())
	}
	missing := config.TransportConfig{TLSTrustedCACerts: []string{filepath.Join(t.TempDir(), "none.pem")}}
	if _, err := missing.ReadCACerts(); err == nil {
		t.Error("ReadCACerts of a missing file: nil error")
	}
}

func TestTransportKey(t *testing.T) {
	base := config.TransportKey(config.TransportConfig{}, nil)
	if got := config.TransportKey(config.TransportConfig{DialTimeout: config.DefaultDialTimeout}, nil); got != base {
		t.Errorf("a default written out changed the key: %q, want %q", got, base)
	}
	if got := config.TransportKey(config.TransportConfig{MaxIdleConnsPerHost: 3}, nil); got == base {
		t.Error("max_idle_conns_per_host 3 kept the default key")
	}
	if got := config.TransportKey(config.TransportConfig{}, []byte("other CA")); got == base {
		t.Error("other CA contents kept the key")
	}
}

func TestStateKeyIncludesRoute(t *testing.T) {
	ups := []config.UpstreamConfig{{URL: "http://a"}, {URL: "http://b"}}
	chat := StateKey(config.Config{Route: "chat", Upstreams: ups})
	if other := StateKey(config.Config{Route: "embed", Upstreams: ups}); other == chat {
		t.Errorf("routes chat and embed share the state key %q", chat)
	}
	if unnamed, named := StateKey(config.Config{Upstreams: ups}), StateKey(config.Config{Route: "default", Upstreams: ups}); unnamed != named {
		t.Errorf("no route = %q, route default = %q: want the same key", unnamed, named)
	}
	if slower := StateKey(config.Config{Route: "chat", Upstreams: ups, Delay: config.DelayConfig{Fixed: config.Duration(time.Minute)}}); slower != chat {
		t.Error("a new fixed delay changed the state key; the state still fits")
	}
	if moved := StateKey(config.Config{Route: "chat", Upstreams: ups[:1]}); moved == chat {
		t.Error("other upstreams kept the state key")
	}
}
