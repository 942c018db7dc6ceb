package core

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// NewTransport builds the upstream transport of t (defaults applied here,
// Validate first). caPEM holds the certificates of t.TLSTrustedCACerts
// (ReadCACerts). It runs under Yaegi: the default versions need nothing
// newer than Go 1.22's net/http.
func NewTransport(t config.TransportConfig, caPEM []byte) (*http.Transport, error) {
	t = t.WithDefaults()
	tlsConfig := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.TLSServerName,
		InsecureSkipVerify: t.TLSInsecureSkipVerify, //nolint:gosec // the operator's explicit choice, documented as test-only
	}
	if len(t.TLSTrustedCACerts) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("transport: no certificate found in tls_trusted_ca_certs %v", t.TLSTrustedCACerts)
		}
		tlsConfig.RootCAs = pool
	}
	dialer := &net.Dialer{Timeout: time.Duration(t.DialTimeout), KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		// A closure, not the method value dialer.DialContext: Yaegi
		// v0.16.1 types a compiled method value as a method expression.
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, addr)
		},
		TLSClientConfig:       tlsConfig,
		TLSHandshakeTimeout:   time.Duration(t.TLSHandshakeTimeout),
		ResponseHeaderTimeout: time.Duration(t.ResponseHeaderTimeout),
		IdleConnTimeout:       time.Duration(t.KeepAliveIdleTimeout),
		MaxIdleConnsPerHost:   t.MaxIdleConnsPerHost,
		ExpectContinueTimeout: time.Second,
		// With its own dialer and TLS config a transport only tries HTTP/2
		// when forced.
		ForceAttemptHTTP2: true,
	}
	if t.ProxyFromEnvironment {
		tr.Proxy = http.ProxyFromEnvironment
	}
	if err := setVersions(tr, t.Versions); err != nil {
		return nil, err
	}
	return tr, nil
}
