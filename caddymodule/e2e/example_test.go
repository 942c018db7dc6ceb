package e2e

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/proc"
)

// TestExampleCaddyfile runs examples/caddy/Caddyfile as written, with its
// upstreams, keys and ports from the environment: each upstream gets its
// own API key and model, the hedge wins over a stalled primary, the keys
// stay out of the logs, and the metrics endpoint serves llm_hedge_*.
func TestExampleCaddyfile(t *testing.T) {
	a, b := startSims(t)
	c := &caddyProc{t: t, dir: t.TempDir(), admin: fmt.Sprintf("http://127.0.0.1:%d", proc.FreePort(t))}
	c.ports = []int{proc.FreePort(t), proc.FreePort(t)}
	config, err := filepath.Abs(filepath.Join("..", "..", "examples", "caddy", "Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	err = c.launch(config, []string{
		"LLMHEDGE_ADMIN=" + strings.TrimPrefix(c.admin, "http://"),
		fmt.Sprintf("LLMHEDGE_LISTEN=http://127.0.0.1:%d", c.ports[0]),
		fmt.Sprintf("LLMHEDGE_METRICS_LISTEN=http://127.0.0.1:%d", c.ports[1]),
		"PRIMARY_URL=" + a.URL, "PRIMARY_API_KEY=sk-primary-secret", "PRIMARY_MODEL=gpt-primary",
		"HEDGE_URL=" + b.URL, "HEDGE_API_KEY=sk-hedge-secret", "HEDGE_MODEL=hedge/gpt",
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)

	// A never sends a token: only the hedge can answer, however slow the machine.
	got := streamChat(ctx, sdkClient(c.url(0), "example-1", "A=stall"))
	if err := got.fromOnly("B", "example-1"); err != nil {
		t.Fatal(err)
	}
	ra, rb := a.Requests(), b.Requests()
	if len(ra) != 1 {
		t.Fatalf("len(ra) = %v, want 1", len(ra))
	} else if len(rb) != 1 {
		t.Fatalf("len(rb) = %v, want 1", len(rb))
	}
	if ra[0].Authorization != "Bearer sk-primary-secret" {
		t.Fatalf("ra[0].Authorization = %q, want \"Bearer sk-primary-secret\"", ra[0].Authorization)
	} else if ra[0].Model != "gpt-primary" {
		t.Fatalf("ra[0].Model = %q, want \"gpt-primary\"", ra[0].Model)
	} else if rb[0].Authorization != "Bearer sk-hedge-secret" {
		t.Fatalf("rb[0].Authorization = %q, want \"Bearer sk-hedge-secret\"", rb[0].Authorization)
	} else if rb[0].Model != "hedge/gpt" {
		t.Fatalf("rb[0].Model = %q, want \"hedge/gpt\"", rb[0].Model)
	}

	access := c.waitLog("handled request", 1, nil)[0]
	if access["llm_hedge_winner"] != "hedge" {
		t.Fatalf("access[\"llm_hedge_winner\"] = %q, want \"hedge\"", access["llm_hedge_winner"])
	} else if fmt.Sprint(access["llm_hedge_attempts"]) != "2" {
		t.Fatalf("fmt.Sprint(access[\"llm_hedge_attempts\"]) = %q, want \"2\"", fmt.Sprint(access["llm_hedge_attempts"]))
	}
	if logs := c.logs(); strings.Contains(logs, "sk-primary-secret") {
		t.Fatal("the primary's API key (sk-primary-secret) is in Caddy's log")
	} else if strings.Contains(logs, "sk-hedge-secret") {
		t.Fatal("the hedge upstream's API key (sk-hedge-secret) is in Caddy's log")
	}

	resp, err := http.Get(c.url(1) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if v, ok := metricValue(t, string(body), "llm_hedge_hedge_wins_total", map[string]string{"route": "openai", "upstream": "hedge"}); !ok {
		t.Fatalf("llm_hedge_hedge_wins_total{route=openai,upstream=hedge} = %v (present %v)", v, ok)
	} else if v != 1 {
		t.Fatalf("v = %v, want 1", v)
	}
}
