package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/testcert"
)

// protoRecorder wraps an upstream and records the protocol of each request.
type protoRecorder struct {
	next   http.Handler
	mu     sync.Mutex
	protos []string
}

func (p *protoRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	proto := r.Proto
	if r.TLS != nil {
		proto += "+TLS"
	}
	p.mu.Lock()
	p.protos = append(p.protos, proto)
	p.mu.Unlock()
	p.next.ServeHTTP(w, r)
}

func (p *protoRecorder) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.protos...)
}

// TestTLSAndHTTP2ToUpstreams: the module's own transport speaks HTTP/2
// over TLS (ALPN) to an https upstream trusted through
// tls_trusted_ca_certs, and h2c to a cleartext upstream with versions h2c.
func TestTLSAndHTTP2ToUpstreams(t *testing.T) {
	// A: https with HTTP/2, a test certificate for 127.0.0.1.
	recA := &protoRecorder{next: &llmsim.Server{Name: "A", Workload: simWorkload(10 * time.Millisecond)}}
	tlsUp := httptest.NewUnstartedServer(recA)
	tlsUp.EnableHTTP2 = true
	tlsUp.StartTLS()
	t.Cleanup(tlsUp.Close)
	caFile := testcert.WritePEM(t, filepath.Join(t.TempDir(), "ca.pem"), tlsUp.Certificate().Raw)

	// B: cleartext HTTP/2 (h2c) only.
	recB := &protoRecorder{next: &llmsim.Server{Name: "B", Workload: simWorkload(10 * time.Millisecond)}}
	h2cSrv := &http.Server{Handler: recB, Protocols: new(http.Protocols)}
	h2cSrv.Protocols.SetUnencryptedHTTP2(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go h2cSrv.Serve(ln)
	t.Cleanup(func() { h2cSrv.Close() })

	// One attempt per request: the test is about protocols, and no hedge
	// (however slow the machine) sends a second request to the upstream.
	c := startCaddy(t, "",
		fmt.Sprintf("\tllm_hedge %s {\n\t\tmax_attempts 1\n\t\ttransport {\n\t\t\ttls_trusted_ca_certs %s\n\t\t}\n\t}", tlsUp.URL, caFile),
		fmt.Sprintf("\tllm_hedge http://%s {\n\t\tmax_attempts 1\n\t\ttransport {\n\t\t\tversions h2c\n\t\t}\n\t}", ln.Addr()))
	ctx := testContext(t)
	if err := streamChat(ctx, sdkClient(c.url(0), "tls-1", "")).fromOnly("A", "tls-1"); err != nil {
		t.Fatal(err)
	}
	if err := streamChat(ctx, sdkClient(c.url(1), "h2c-1", "")).fromOnly("B", "h2c-1"); err != nil {
		t.Fatal(err)
	}
	if got := recA.seen(); len(got) != 1 || got[0] != "HTTP/2.0+TLS" {
		t.Errorf("the https upstream saw requests %q, want one over \"HTTP/2.0+TLS\"", got)
	}
	if got := recB.seen(); len(got) != 1 || got[0] != "HTTP/2.0" {
		t.Errorf("the h2c upstream saw requests %q, want one over \"HTTP/2.0\"", got)
	}
}

// TestHTTP2ClientSeesAbortedStream: over HTTP/2 between client and Caddy
// (h2c here), a stream that breaks after commit is reset, which the client
// sees as an error, never as a clean end.
func TestHTTP2ClientSeesAbortedStream(t *testing.T) {
	a, b := startSims(t)
	c := startCaddy(t, "\tservers {\n\t\tprotocols h1 h2c\n\t}", hedgeSite(a, b, ""))
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: tr}
	t.Cleanup(tr.CloseIdleConnections)

	do := func(id, behavior string) (*http.Response, []byte, error) {
		resp, err := client.Do(rawChatRequest(c.url(0), id, behavior))
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp, body, err
	}

	resp, body, err := do("h2-ok", "A=stall")
	if err != nil {
		t.Fatalf("h2c request: %v", err)
	} else if resp.ProtoMajor != 2 {
		t.Fatalf("h2c request: resp.ProtoMajor = %v, want 2", resp.ProtoMajor)
	}
	if got, want := llmsim.StripPings(body), llmsim.ExpectedStream("B", "model-b", "h2-ok", simTokens); string(got) != string(want) {
		t.Fatalf("body over h2c\n%s\nwant\n%s", got, want)
	}

	_, body, err = do("h2-broken", "A=reset_after:2;B=stall")
	if err == nil {
		t.Fatalf("a broken stream ended cleanly over HTTP/2: %q", body)
	}
	if !strings.Contains(string(body), llmsim.TokenText("h2-broken", 1)) {
		t.Fatalf("the tokens before the break were not delivered: %q", body)
	}
}
