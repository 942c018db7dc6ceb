package traefikplugin

import (
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

func TestCreateConfigHoldsTheEngineDefaults(t *testing.T) {
	cfg := CreateConfig()
	cfg.Upstreams = []Upstream{{URL: "http://127.0.0.1:9001"}}
	got, err := cfg.coreConfig("hedge@file")
	if err != nil {
		t.Fatal(err)
	}
	want := config.Config{Route: "hedge@file", Upstreams: []config.UpstreamConfig{{URL: "http://127.0.0.1:9001"}}}.WithDefaults()
	if !reflect.DeepEqual(got.WithDefaults(), want) {
		t.Fatalf("defaults differ: %s", firstDifference(got.WithDefaults(), want))
	}
	// Spot checks against the documented values.
	if cfg.Delay != "1s" {
		t.Fatalf("CreateConfig: Delay = %q, want \"1s\"", cfg.Delay)
	} else if cfg.MaxAttempts != 3 {
		t.Fatalf("CreateConfig: MaxAttempts = %d, want 3", cfg.MaxAttempts)
	} else if cfg.Budget.Ratio != 0.1 {
		t.Fatalf("CreateConfig: Budget.Ratio = %v, want 0.1", cfg.Budget.Ratio)
	} else if cfg.Idempotency.Header != "Idempotency-Key" {
		t.Fatalf("CreateConfig: Idempotency.Header = %q, want \"Idempotency-Key\"", cfg.Idempotency.Header)
	} else if cfg.Log != "stdout" {
		t.Fatalf("CreateConfig: Log = %q, want \"stdout\"", cfg.Log)
	} else if cfg.MaxBody != 4<<20 {
		t.Fatalf("CreateConfig: MaxBody = %d, want %d", cfg.MaxBody, 4<<20)
	} else if !reflect.DeepEqual(cfg.Methods, []string{"POST"}) {
		t.Fatalf("CreateConfig: Methods = %q, want [POST]", cfg.Methods)
	}
}

func TestSpecMinimalFormConverts(t *testing.T) {
	// The top README's Traefik example: two upstreams and a delay of 50ms.
	cfg := CreateConfig()
	cfg.Upstreams = []Upstream{{URL: "http://127.0.0.1:9001"}, {URL: "http://127.0.0.1:9002"}}
	cfg.Delay = "50ms"
	got, err := cfg.coreConfig("hedge")
	if err != nil {
		t.Fatal(err)
	}
	if got.Delay.Fixed.D() != 50*time.Millisecond {
		t.Fatalf("got.Delay.Fixed.D() = %v, want %v", got.Delay.Fixed.D(), 50*time.Millisecond)
	} else if len(got.Upstreams) != 2 {
		t.Fatalf("len(got.Upstreams) = %v, want 2", len(got.Upstreams))
	} else if got.Upstreams[1].URL != "http://127.0.0.1:9002" {
		t.Fatalf("got.Upstreams[1].URL = %q, want \"http://127.0.0.1:9002\"", got.Upstreams[1].URL)
	}
}

func TestEveryOptionReachesTheEngine(t *testing.T) {
	cfg := &Config{
		Route: "r",
		Upstreams: []Upstream{{Name: "a", URL: " http://a:1/v1 ", SetHeaders: map[string]string{"Authorization": "Bearer k"},
			DeleteHeaders: []string{"Cookie"}, Model: "m2"}},
		Delay: "250ms", DelayMode: "adaptive", DelayQuantile: 0.9, DelayMin: "10ms", DelayMax: "2s",
		DelayWindow: 500, DelayMinSamples: 20, MaxAttempts: 3, Timeout: "30s", MinTimeLeft: "1s",
		MaxBody: 1 << 20, MaxPrefix: 4096, MaxLine: 2048, Methods: []string{"POST", "PUT"},
		PathPrefixes: []string{"/v1/"}, FirstEvent: "openai-chat",
		Idempotency: Idempotency{Header: "X-Key", TTL: "off", MaxEntries: 5, MaxBytes: 6000, MaxResponseBytes: 7000,
			ScopeHeaders: []string{"Authorization", "X-User"}},
		Budget: Budget{Ratio: 0.2, Burst: 3, MaxConcurrentHedges: 4, CoolDown: "2s", MaxCoolDown: "20s", OverloadRate: 0.5,
			OverloadWindow: 50, BreakerFailures: 7, BreakerOpen: "30s", TenantHeader: "X-Tenant", TenantTokensPerMinute: 1000},
		ReportHeader: "Server-Timing", StreamErrorEvent: true, Log: "stderr",
	}
	got, err := cfg.coreConfig("ignored")
	if err != nil {
		t.Fatal(err)
	}
	want := config.Config{
		Route: "r",
		Upstreams: []config.UpstreamConfig{{Name: "a", URL: "http://a:1/v1", SetHeaders: map[string]string{"Authorization": "Bearer k"},
			DeleteHeaders: []string{"Cookie"}, Model: "m2"}},
		Delay: config.DelayConfig{Mode: "adaptive", Fixed: config.Duration(250 * time.Millisecond), Quantile: 0.9, Min: config.Duration(10 * time.Millisecond),
			Max: config.Duration(2 * time.Second), Window: 500, MinSamples: 20},
		MaxAttempts: 3, Timeout: config.Duration(30 * time.Second), MinTimeLeft: config.Duration(time.Second), MaxBody: 1 << 20, MaxPrefix: 4096, MaxLine: 2048,
		Methods: []string{"POST", "PUT"}, PathPrefixes: []string{"/v1/"}, FirstEvent: "openai-chat",
		Idempotency: config.IdempotencyConfig{Header: "X-Key", TTL: -1, MaxEntries: 5, MaxBytes: 6000, MaxResponseBytes: 7000,
			ScopeHeaders: []string{"Authorization", "X-User"}},
		Budget: config.BudgetConfig{Ratio: 0.2, Burst: 3, MaxConcurrentHedges: 4, CoolDown: config.Duration(2 * time.Second),
			MaxCoolDown: config.Duration(20 * time.Second), OverloadRate: 0.5, OverloadWindow: 50, BreakerFailures: 7,
			BreakerOpen: config.Duration(30 * time.Second), TenantHeader: "X-Tenant", TenantTokensPerMinute: 1000},
		ReportHeader: "Server-Timing", StreamErrorEvent: true,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("core config: %s", firstDifference(got, want))
	}
}

func TestNewRejectsBadConfigurationClearly(t *testing.T) {
	next := http.NotFoundHandler()
	cases := []struct {
		edit func(*Config)
		want []string
	}{
		{func(c *Config) { c.Upstreams = nil }, []string{`"bad"`, "at least one upstream"}},
		{func(c *Config) { c.Delay = "5 sec" }, []string{`delay "5 sec" is not a duration`}},
		{func(c *Config) { c.Timeout = "-1s" }, []string{`timeout "-1s" must not be negative`}},
		{func(c *Config) { c.Budget.CoolDown = "soon" }, []string{`budget.coolDown "soon"`}},
		{func(c *Config) { c.Upstreams[0].URL = "ftp://x" }, []string{"scheme must be http or https"}},
		{func(c *Config) { c.Log = "syslog" }, []string{`log "syslog"`}},
		{func(c *Config) { c.DelayMode = "smart" }, []string{`delay mode "smart"`}},
		{func(c *Config) { c.Upstreams[0].SetHeaders = map[string]string{"Bad Name": "x"} }, []string{`"Bad Name"`}},
		// Several problems are reported together.
		{func(c *Config) { c.Delay = "x"; c.MaxAttempts = 99 }, []string{`delay "x"`, "max_attempts 99"}},
	}
	for i, c := range cases {
		cfg := CreateConfig()
		cfg.Upstreams = []Upstream{{URL: "http://127.0.0.1:9001"}}
		c.edit(cfg)
		h, err := New(context.Background(), next, cfg, "bad")
		if err == nil {
			t.Fatalf("case %d: New accepted it: err = nil, want an error", i)
		} else if h != nil {
			t.Fatalf("case %d: New returned a handler with its error", i)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("case %d: error %q does not mention %q", i, err, w)
			}
		}
	}
}

func TestTestDataOfTheManifestIsAccepted(t *testing.T) {
	// .traefik.yml's testData, as Traefik's catalog would decode it.
	cfg := CreateConfig()
	cfg.Upstreams = []Upstream{{URL: "http://127.0.0.1:9001"}, {URL: "http://127.0.0.1:9002"}}
	cfg.Delay = "50ms"
	if _, err := New(context.Background(), http.NotFoundHandler(), cfg, "testdata"); err != nil {
		t.Fatal(err)
	}
}

func TestOffArrivesInEveryYAMLSpellingAndMeansOff(t *testing.T) {
	// kubectl (YAML 1.1) reads an unquoted `off` as false; Traefik's file
	// provider passes that on as "false", its plugin decoder as "0".
	newWith := func(edit func(*Config)) (*Hedge, error) {
		cfg := CreateConfig()
		cfg.Upstreams = []Upstream{{URL: "http://127.0.0.1:9001"}}
		edit(cfg)
		h, err := New(context.Background(), http.NotFoundHandler(), cfg, "off")
		if err != nil {
			return nil, err
		}
		return h.(*Hedge), nil
	}
	for _, v := range []string{"0", "false", "off", "OFF", "False", " 0 "} {
		v := v
		h, err := newWith(func(c *Config) { c.Idempotency.TTL = v })
		if err != nil {
			t.Errorf("ttl %q: New failed: %v", v, err)
		} else if got := h.cfg.Idempotency.TTL; got != -1 {
			t.Errorf("ttl %q: engine TTL = %v, want -1 (no joins or replays)", v, got)
		}
		h, err = newWith(func(c *Config) { c.Log = v })
		if err != nil {
			t.Errorf("log %q: New failed: %v", v, err)
		} else if h.logOut != nil {
			t.Errorf("log %q: log lines still written", v)
		}
	}
	// A zero duration keeps nothing: off as well.
	cfg := CreateConfig()
	cfg.Upstreams = []Upstream{{URL: "http://127.0.0.1:9001"}}
	cfg.Idempotency.TTL = "0s"
	got, err := cfg.coreConfig("zero")
	if err != nil {
		t.Fatal(err)
	}
	if got.Idempotency.TTL != -1 {
		t.Errorf(`ttl "0s": engine TTL = %v, want -1`, got.Idempotency.TTL)
	}
}

func TestYAMLTrueIsRejectedWithTheFix(t *testing.T) {
	// An unquoted on/yes/true arrives as "1" (Traefik's decoder) or "true".
	for _, v := range []string{"1", "true"} {
		cfg := CreateConfig()
		cfg.Upstreams = []Upstream{{URL: "http://127.0.0.1:9001"}}
		cfg.Idempotency.TTL = v
		cfg.Log = v
		_, err := New(context.Background(), http.NotFoundHandler(), cfg, "on")
		if err == nil {
			t.Fatalf("ttl and log %q accepted", v)
		}
		for _, want := range []string{`idempotency.ttl "` + v + `"`, `log "` + v + `"`, "on/yes/true", `"10m"`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not mention %q", err, want)
			}
		}
	}
}
