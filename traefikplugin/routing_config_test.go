package traefikplugin

import "testing"

// primary and an upstream's preferMargin reach the engine's configuration.
func TestPrimaryAndPreferMarginConvert(t *testing.T) {
	cfg := CreateConfig()
	if cfg.Primary != "ordered" {
		t.Fatalf("CreateConfig().Primary = %q, want \"ordered\" (the engine's default)", cfg.Primary)
	}
	cfg.Primary = "fastest"
	cfg.Upstreams = []Upstream{{Name: "cheap", URL: "http://127.0.0.1:9001", PreferMargin: 0.25}, {URL: "http://127.0.0.1:9002"}}
	got, err := cfg.coreConfig("hedge")
	if err != nil {
		t.Fatal(err)
	}
	if got.Primary != "fastest" {
		t.Fatalf("Primary = %q, want \"fastest\"", got.Primary)
	}
	if float64(got.Upstreams[0].PreferMargin) != 0.25 {
		t.Fatalf("Upstreams[0].PreferMargin = %v, want 0.25", float64(got.Upstreams[0].PreferMargin))
	}
	cfg.Primary = "quickest"
	if _, err := cfg.coreConfig("hedge"); err == nil {
		t.Fatal("primary quickest was accepted, want an error")
	}
}
