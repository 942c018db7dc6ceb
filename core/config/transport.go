package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// TransportConfig configures the HTTP client that sends upstream attempts,
// the same for every adapter (Caddy's transport block, the Envoy server's
// transport section; the Traefik plugin uses the defaults). Attempts never
// go through the host proxy's own upstream client: the transport keeps its
// own keep-alive pools, shared by every request of its routes. Every zero
// field means its default (WithDefaults).
type TransportConfig struct {
	// DialTimeout bounds connecting to an upstream (TCP). Default 10s.
	DialTimeout Duration `json:"dial_timeout,omitempty"`

	// TLSHandshakeTimeout bounds the TLS handshake with an upstream.
	// Default: DialTimeout.
	TLSHandshakeTimeout Duration `json:"tls_handshake_timeout,omitempty"`

	// ResponseHeaderTimeout bounds the wait for an upstream's response
	// headers. LLM servers may hold their headers until the first token, so
	// the hedge delay, not this, should react to slowness. Default 0 (none).
	ResponseHeaderTimeout Duration `json:"response_header_timeout,omitempty"`

	// KeepAliveIdleTimeout is how long an idle upstream connection is kept
	// for reuse. Default 2m.
	KeepAliveIdleTimeout Duration `json:"keepalive_idle_timeout,omitempty"`

	// MaxIdleConnsPerHost is the number of idle connections kept per
	// upstream host. Default 64.
	MaxIdleConnsPerHost int `json:"max_idle_conns_per_host,omitempty"`

	// Versions are the HTTP versions used towards upstreams: "1.1", "2"
	// (HTTP/2 over TLS, negotiated by ALPN) and "h2c" (HTTP/2 without TLS,
	// for http:// upstreams; without "1.1", since a transport that may use
	// HTTP/1.1 uses it for http:// URLs). Default ["1.1", "2"]. Other sets
	// than the default need a compiled build (not Yaegi).
	Versions []string `json:"versions,omitempty"`

	// ProxyFromEnvironment sends attempts through the proxy named by
	// HTTP_PROXY, HTTPS_PROXY and NO_PROXY. Default false: attempts go
	// straight to the upstream.
	ProxyFromEnvironment bool `json:"proxy_from_environment,omitempty"`

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
	DefaultDialTimeout          Duration = 10000000000  // 10s
	DefaultKeepAliveIdleTimeout Duration = 120000000000 // 2m
	DefaultMaxIdleConnsPerHost  int      = 64
)

// WithDefaults returns t with every zero field set to its default.
func (t TransportConfig) WithDefaults() TransportConfig {
	if t.DialTimeout == 0 {
		t.DialTimeout = DefaultDialTimeout
	}
	if t.TLSHandshakeTimeout == 0 {
		t.TLSHandshakeTimeout = t.DialTimeout
	}
	if t.KeepAliveIdleTimeout == 0 {
		t.KeepAliveIdleTimeout = DefaultKeepAliveIdleTimeout
	}
	if t.MaxIdleConnsPerHost == 0 {
		t.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	}
	if len(t.Versions) == 0 {
		t.Versions = []string{"1.1", "2"}
	}
	return t
}

// Validate reports every problem of t (defaults applied or not), one per
// line, each starting with "transport: ".
func (t TransportConfig) Validate() error {
	var errs []error
	if t.DialTimeout < 0 || t.TLSHandshakeTimeout < 0 || t.ResponseHeaderTimeout < 0 || t.KeepAliveIdleTimeout < 0 {
		errs = append(errs, errors.New("transport: timeouts must not be negative"))
	}
	if t.MaxIdleConnsPerHost < 0 {
		errs = append(errs, fmt.Errorf("transport: max_idle_conns_per_host %d must not be negative", t.MaxIdleConnsPerHost))
	}
	h1 := false
	h2c := false
	for _, v := range t.Versions {
		switch v {
		case "1.1":
			h1 = true
		case "2":
		case "h2c":
			h2c = true
		default:
			errs = append(errs, fmt.Errorf("transport: unknown HTTP version %q: want 1.1, 2 or h2c", v))
		}
	}
	if h1 && h2c {
		errs = append(errs, errors.New("transport: versions 1.1 and h2c exclude each other (a transport that may use HTTP/1.1 uses it for http:// upstreams)"))
	}
	return errors.Join(errs...)
}

// ReadCACerts reads the PEM files of t.TLSTrustedCACerts, concatenated
// (nil when there are none), for NewTransport and TransportKey.
func (t TransportConfig) ReadCACerts() ([]byte, error) {
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

// TransportKey identifies the transport NewTransport builds from t
// (defaults applied) and caPEM, so that a configuration reload with the
// same settings and CA file contents can keep the running transport and
// its warm connections.
func TransportKey(t TransportConfig, caPEM []byte) string {
	settings, _ := json.Marshal(t.WithDefaults())
	sum := sha256.Sum256(caPEM)
	return "transport\x00" + string(settings) + "\x00" + hex.EncodeToString(sum[:8])
}
