package main

import (
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/switchadmin"
)

// The command serves the per-process switch on admin.listen, and names the
// listener in its start line.
func TestAdminListenerOfTheCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "extproc.yaml")
	cfg := `
grpc: {listen: "127.0.0.1:0"}
metrics: {listen: "off"}
admin: {listen: "127.0.0.1:0"}
shutdown: {drain_timeout: 1s, health_grace: 0s}
routes:
  - name: chat
    upstreams: [{name: A, url: "http://127.0.0.1:9"}]
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "-config", path)
	serving := p.waitLog(t, "llmhedge-extproc serving")
	addr, _ := serving["admin"].(string)
	if addr == "" {
		t.Fatalf("the start line names no admin listener: %v", serving)
	}
	endpoint := "http://" + addr + "/switch"
	if code, body := switchadmin.Call(t, endpoint, http.MethodPost, `{"route":"chat","delay":"300ms"}`); code != http.StatusOK {
		t.Fatalf("POST /switch: %d %s", code, body)
	}
	if got := switchadmin.Listed(t, endpoint); got != "chat=delay 300ms" {
		t.Errorf("GET /switch = %q, want %q", got, "chat=delay 300ms")
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.waitLog(t, "stopped")
	if err := p.wait(t); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.out())
	}
}
