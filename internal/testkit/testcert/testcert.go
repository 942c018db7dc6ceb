// Package testcert makes the self-signed certificates of the adapters'
// TLS tests (a gRPC listener, mTLS clients, CA files for
// tls_trusted_ca_certs) and writes them as PEM files.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Cert is a self-signed certificate and its P-256 key.
type Cert struct {
	DER []byte
	Key *ecdsa.PrivateKey
}

// Server is a certificate for 127.0.0.1 that serves TLS, valid from an
// hour ago to an hour from now.
func Server(t testing.TB) Cert {
	return generate(t, &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "llmhedge-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
}

// Client is a client certificate (its own CA, for client_ca_file).
func Client(t testing.TB) Cert {
	return generate(t, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "envoy-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
}

// CA is a CA certificate with the given serial number, so that two of them
// differ even when made in the same second.
func CA(t testing.TB, serial int64) Cert {
	return generate(t, &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true})
}

func generate(t testing.TB, tmpl *x509.Certificate) Cert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return Cert{DER: der, Key: key}
}

// Pool is a certificate pool that trusts c.
func (c Cert) Pool(t testing.TB) *x509.CertPool {
	t.Helper()
	cert, err := x509.ParseCertificate(c.DER)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return pool
}

// Pair is c as a tls.Certificate, for a client or a server.
func (c Cert) Pair() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{c.DER}, PrivateKey: c.Key}
}

// WriteFiles writes c as cert.pem and its key as key.pem into dir and
// returns their paths.
func (c Cert) WriteFiles(t testing.TB, dir string) (certFile, keyFile string) {
	t.Helper()
	keyDER, err := x509.MarshalECPrivateKey(c.Key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = WritePEM(t, filepath.Join(dir, "cert.pem"), c.DER)
	keyFile = filepath.Join(dir, "key.pem")
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	return certFile, keyFile
}

// WritePEM writes the DER certificate der to path as PEM (a CA file, e.g.
// of an httptest TLS server's certificate) and returns path.
func WritePEM(t testing.TB, path string, der []byte) string {
	t.Helper()
	writeFile(t, path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return path
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
