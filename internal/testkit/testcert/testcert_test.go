package testcert

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
)

// The server certificate written to files loads as a key pair and verifies
// against its own pool for 127.0.0.1.
func TestServerFilesVerify(t *testing.T) {
	c := Server(t)
	certFile, keyFile := c.WriteFiles(t, t.TempDir())
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: c.Pool(t), DNSName: "127.0.0.1"}); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

// Two CAs with other serials are other files.
func TestCAsDiffer(t *testing.T) {
	dir := t.TempDir()
	a, _ := os.ReadFile(WritePEM(t, filepath.Join(dir, "a.pem"), CA(t, 1).DER))
	b, _ := os.ReadFile(WritePEM(t, filepath.Join(dir, "b.pem"), CA(t, 2).DER))
	if len(a) == 0 || string(a) == string(b) {
		t.Fatalf("CA files: %d and %d bytes, equal %v; want two different non-empty files", len(a), len(b), string(a) == string(b))
	}
}
