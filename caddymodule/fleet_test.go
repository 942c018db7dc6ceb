package caddymodule

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// `fleet <url>` and its block fill config.FleetConfig; JSON has fleet.url.
func TestCaddyfileFleet(t *testing.T) {
	h, err := parse(t, `llm_hedge http://a.test {
		fleet redis://:pw@127.0.0.1:6380/2 {
			password_env REDIS_PASSWORD
			timeout 80ms
			prefix gw1:
			lease 3s
			retry_interval 1s
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	f := h.Fleet
	if f.URL != "redis://:pw@127.0.0.1:6380/2" || f.PasswordEnv != "REDIS_PASSWORD" || f.Timeout.D() != 80*time.Millisecond ||
		f.Prefix != "gw1:" || f.Lease.D() != 3*time.Second || f.RetryInterval.D() != time.Second {
		t.Errorf("fleet = %+v", f)
	}
	b, _ := json.Marshal(h)
	if !strings.Contains(string(b), `"fleet":{"url":"redis://:pw@127.0.0.1:6380/2"`) {
		t.Errorf("adapted JSON %s has no fleet.url", b)
	}
	short, err := parse(t, `llm_hedge http://a.test {
		fleet redis://127.0.0.1:6379
	}`)
	if err != nil || short.Fleet.URL != "redis://127.0.0.1:6379" {
		t.Errorf("fleet <url>: %+v, %v", short.Fleet, err)
	}
	if _, err := parse(t, `llm_hedge http://a.test {
		fleet redis://a redis://b
	}`); err == nil {
		t.Error("fleet with two URLs: no error")
	}
	if _, err := parse(t, `llm_hedge http://a.test {
		fleet redis://a {
			leese 2s
		}
	}`); err == nil || !strings.Contains(err.Error(), `"leese"`) {
		t.Errorf("fleet typo: error %v, want one naming leese", err)
	}
}

// Without a fleet the adapted JSON has none: today's configuration.
func TestNoFleetNoFleetJSON(t *testing.T) {
	h, err := parse(t, `llm_hedge http://a.test`)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(h); strings.Contains(string(b), "fleet") {
		t.Errorf("adapted JSON %s mentions a fleet", b)
	}
}

// A reload (the new config provisioned before the old one's Cleanup) keeps
// the fleet's client and breaker; the last Cleanup closes the client.
func TestReloadKeepsTheFleet(t *testing.T) {
	config := `{"route":"fleet-reload","upstreams":[{"url":"http://127.0.0.1:9001"}],"fleet":{"url":"redis://127.0.0.1:1/0"}}`
	oldCfg, err := provisionJSON(t, newCaddyContext(t), config)
	if err != nil {
		t.Fatal(err)
	}
	newCfg, err := provisionJSON(t, newCaddyContext(t), strings.Replace(config, "fleet-reload", "fleet-reload-2", 1))
	if err != nil {
		t.Fatal(err)
	}
	if oldCfg.fleetKey == "" || oldCfg.fleetKey != newCfg.fleetKey {
		t.Fatal("two configs with one fleet do not share its pooled client")
	}
	v, _ := shared.LoadOrStore(newCfg.fleetKey, nil)
	pooled := v.(*pooledFleet)
	shared.Delete(newCfg.fleetKey) // the reference LoadOrStore took
	if refs, _ := shared.References(newCfg.fleetKey); refs != 2 {
		t.Fatalf("fleet references = %d, want 2", refs)
	}
	if err := oldCfg.Cleanup(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := pooled.client.Do(ctx, "PING"); err != nil && err.Error() == "redis: client is closed" {
		t.Fatal("the old config's Cleanup closed the client the new config uses")
	}
	key := newCfg.fleetKey
	if err := newCfg.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, ok := shared.References(key); ok {
		t.Fatal("fleet still pooled after the last cleanup")
	}
	if _, err := pooled.client.Do(ctx, "PING"); err == nil || err.Error() != "redis: client is closed" {
		t.Errorf("after the last Cleanup: PING error %v, want the client closed", err)
	}
}
