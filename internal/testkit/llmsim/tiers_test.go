package llmsim

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

func TestPriorityRequested(t *testing.T) {
	cases := []struct {
		path, body string
		want       bool
	}{
		{"/v1/chat/completions", `{"service_tier":"priority"}`, true},
		{"/v1/chat/completions", `{"service_tier":"auto"}`, false},
		{"/v1/chat/completions", `{}`, false},
		{"/v1/responses", `{"service_tier":"priority"}`, true},
		{"/v1/messages", `{"service_tier":"auto"}`, true},
		{"/v1/messages", `{"service_tier":"standard_only"}`, false},
		{"/v1/messages", `{}`, false},
		{"/v1/chat/completions", `not json`, false},
	}
	for _, c := range cases {
		if got := PriorityRequested(c.path, []byte(c.body)); got != c.want {
			t.Errorf("PriorityRequested(%s, %s) = %v, want %v", c.path, c.body, got, c.want)
		}
	}
}

// TestTieredRoutesByServiceTier: one URL, two tiers; each request reaches
// the tier its body asks for, with its body intact.
func TestTieredRoutesByServiceTier(t *testing.T) {
	fast := Workload{MedianTTFT: 1, Sigma: -1, StallProb: -1, Tokens: 2, TokenGap: -1, PingEvery: -1}
	tiered := (&Tiered{Standard: &Server{Name: "std", Workload: fast}, Priority: &Server{Name: "prio", Workload: fast}}).Start()
	defer tiered.Close()
	for _, body := range []string{
		`{"model":"m","stream":true,"messages":[{"role":"user","content":"a"}]}`,
		`{"model":"m","stream":true,"service_tier":"priority","messages":[{"role":"user","content":"b"}]}`,
		`{"model":"m","stream":true,"service_tier":"priority","messages":[{"role":"user","content":"c"}]}`,
	} {
		resp, err := http.Post(tiered.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		want := "std"
		if strings.Contains(body, "priority") {
			want = "prio"
		}
		if got := resp.Header.Get(HeaderUpstream); got != want {
			t.Errorf("body %s answered by %q, want %q", body, got, want)
		}
	}
	if s, p := tiered.Standard.Served(), tiered.Priority.Served(); s != 1 || p != 2 {
		t.Errorf("served standard %d, priority %d; want 1 and 2", s, p)
	}
	if got := string(tiered.Priority.Requests()[0].Body); !strings.Contains(got, `"service_tier":"priority"`) {
		t.Errorf("the priority tier got body %q, want the whole request", got)
	}
}

// TestStartOnFixedPort serves on the address asked for.
func TestStartOnFixedPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r, err := (&Server{Name: "fixed"}).StartOn(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.URL != "http://"+addr {
		t.Errorf("URL %q, want http://%s", r.URL, addr)
	}
	if _, err := (&Server{Name: "again"}).StartOn(addr); err == nil {
		t.Errorf("a second server on %s started; want the address-in-use error", addr)
	}
}

func TestPriorityTierHasTheLowerTail(t *testing.T) {
	std := Reference(3, 1)
	prio := PriorityTier(std)
	if prio.MedianTTFT != std.MedianTTFT || prio.Sigma != 0.15 || prio.StallProb != 0.002 {
		t.Errorf("priority tier median %v sigma %v stalls %v; want %v, 0.15, 0.002", prio.MedianTTFT, prio.Sigma, prio.StallProb, std.MedianTTFT)
	}
	if s, p := std.TrueQuantile(0.95), prio.TrueQuantile(0.95); p >= s {
		t.Errorf("priority p95 %v is not below the standard p95 %v", p, s)
	}
}
