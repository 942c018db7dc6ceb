package caddymodule

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// Transport configures the handler's own HTTP client, which sends every
// attempt. Caddy's reverse_proxy is not used (its next handler must never
// be called concurrently); this transport keeps its own keep-alive pools,
// shared by all requests of the route and carried over config reloads while
// its settings stay the same. It speaks HTTP/1.1 and HTTP/2 (ALPN over TLS,
// or h2c when asked), dials upstreams directly (no HTTP proxy from the
// environment, no PROXY protocol header).
type Transport struct {
	// DialTimeout bounds connecting to an upstream (TCP and TLS handshake).
	// Default 10s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// ResponseHeaderTimeout bounds the wait for an upstream's response
	// headers. LLM servers may hold their headers until the first token, so
	// the hedge delay, not this, should react to slowness. Default 0 (none).
	ResponseHeaderTimeout caddy.Duration `json:"response_header_timeout,omitempty"`

	// KeepAliveIdleTimeout is how long an idle upstream connection is kept
	// for reuse. Default 2m.
	KeepAliveIdleTimeout caddy.Duration `json:"keepalive_idle_timeout,omitempty"`

	// MaxIdleConnsPerHost is the number of idle connections kept per
	// upstream host. Default 64.
	MaxIdleConnsPerHost int `json:"max_idle_conns_per_host,omitempty"`

	// Versions are the HTTP versions used towards upstreams: "1.1", "2"
	// (HTTP/2 over TLS, negotiated by ALPN) and "h2c" (HTTP/2 without TLS,
	// for http:// upstreams; without "1.1", since a transport that may use
	// HTTP/1.1 uses it for http:// URLs). Default ["1.1", "2"].
	Versions []string `json:"versions,omitempty"`

	// TLSInsecureSkipVerify turns off verification of upstream
	// certificates. Only for testing. Default false.
	TLSInsecureSkipVerify bool `json:"tls_insecure_skip_verify,omitempty"`

	// TLSServerName overrides the server name sent in SNI and checked in
	// the upstream's certificate. Default: the upstream URL's host.
	TLSServerName string `json:"tls_server_name,omitempty"`

	// TLSTrustedCACerts are PEM files of CA certificates trusted for
	// upstreams, instead of the system roots. Default: the system roots.
	TLSTrustedCACerts []string `json:"tls_trusted_ca_certs,omitempty"`
}

// Transport defaults.
const (
	defaultDialTimeout         = 10 * time.Second
	defaultKeepAliveIdle       = 2 * time.Minute
	defaultMaxIdleConnsPerHost = 64
)

// withDefaults returns a copy of t with every zero field set.
func (t *Transport) withDefaults() Transport {
	var out Transport
	if t != nil {
		out = *t
	}
	if out.DialTimeout == 0 {
		out.DialTimeout = caddy.Duration(defaultDialTimeout)
	}
	if out.KeepAliveIdleTimeout == 0 {
		out.KeepAliveIdleTimeout = caddy.Duration(defaultKeepAliveIdle)
	}
	if out.MaxIdleConnsPerHost == 0 {
		out.MaxIdleConnsPerHost = defaultMaxIdleConnsPerHost
	}
	if len(out.Versions) == 0 {
		out.Versions = []string{"1.1", "2"}
	}
	return out
}

// validate reports the first problem of t (defaults applied).
func (t Transport) validate() error {
	if t.DialTimeout < 0 || t.ResponseHeaderTimeout < 0 || t.KeepAliveIdleTimeout < 0 {
		return fmt.Errorf("transport: timeouts must not be negative")
	}
	if t.MaxIdleConnsPerHost < 0 {
		return fmt.Errorf("transport: max_idle_conns_per_host %d must not be negative", t.MaxIdleConnsPerHost)
	}
	var h1, h2c bool
	for _, v := range t.Versions {
		switch v {
		case "1.1":
			h1 = true
		case "2":
		case "h2c":
			h2c = true
		default:
			return fmt.Errorf("transport: unknown HTTP version %q: want 1.1, 2 or h2c", v)
		}
	}
	if h1 && h2c {
		return fmt.Errorf("transport: versions 1.1 and h2c exclude each other (a transport that may use HTTP/1.1 uses it for http:// upstreams)")
	}
	return nil
}

// transportKey identifies a transport's settings, CA file contents
// included, so a reload with the same settings reuses its connection pools.
func transportKey(t Transport, caPEM []byte) string {
	settings, _ := json.Marshal(t)
	sum := sha256.Sum256(caPEM)
	return "transport|" + string(settings) + "|" + hex.EncodeToString(sum[:8])
}

// readCACerts reads the PEM files of t.TLSTrustedCACerts, concatenated.
func readCACerts(t Transport) ([]byte, error) {
	var all []byte
	for _, name := range t.TLSTrustedCACerts {
		pem, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("transport: reading tls_trusted_ca_certs: %v", err)
		}
		all = append(all, pem...)
		all = append(all, '\n')
	}
	return all, nil
}

// newHTTPTransport builds the http.Transport for t (defaults applied, valid).
func newHTTPTransport(t Transport, caPEM []byte) (*http.Transport, error) {
	tlsConfig := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.TLSServerName,
		InsecureSkipVerify: t.TLSInsecureSkipVerify, //nolint:gosec // operator's explicit choice, documented as test-only
	}
	if len(t.TLSTrustedCACerts) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("transport: no certificate found in tls_trusted_ca_certs %v", t.TLSTrustedCACerts)
		}
		tlsConfig.RootCAs = pool
	}
	dialer := &net.Dialer{Timeout: time.Duration(t.DialTimeout), KeepAlive: 30 * time.Second}
	protocols := new(http.Protocols)
	for _, v := range t.Versions {
		switch v {
		case "1.1":
			protocols.SetHTTP1(true)
		case "2":
			protocols.SetHTTP2(true)
		case "h2c":
			protocols.SetUnencryptedHTTP2(true)
		}
	}
	return &http.Transport{
		// Attempts go straight to the upstream: an environment proxy would
		// add a hop the operator did not configure.
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		TLSClientConfig:       tlsConfig,
		TLSHandshakeTimeout:   time.Duration(t.DialTimeout),
		ResponseHeaderTimeout: time.Duration(t.ResponseHeaderTimeout),
		IdleConnTimeout:       time.Duration(t.KeepAliveIdleTimeout),
		MaxIdleConnsPerHost:   t.MaxIdleConnsPerHost,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
		Protocols:             protocols,
	}, nil
}
