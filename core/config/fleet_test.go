package config

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/redact"
)

func TestParseRedisURL(t *testing.T) {
	a, err := ParseRedisURL("rediss://gw:s3cret-pw@redis.internal:6380/3", "")
	if err != nil {
		t.Fatal(err)
	}
	if !a.TLS || a.Host != "redis.internal:6380" || a.Username != "gw" || a.Password != "s3cret-pw" || a.DB != 3 {
		t.Errorf("parsed %+v", a)
	}
	if a.Name() != "redis.internal:6380/3" {
		t.Errorf("Name() = %q, want redis.internal:6380/3", a.Name())
	}
	b, err := ParseRedisURL("redis://127.0.0.1", "")
	if err != nil || b.Host != "127.0.0.1:6379" || b.DB != 0 || b.TLS {
		t.Errorf("redis://127.0.0.1: %+v, %v; want port 6379, db 0", b, err)
	}
	os.Setenv("LLMHEDGE_TEST_REDIS_PW", "from-env")
	defer os.Unsetenv("LLMHEDGE_TEST_REDIS_PW")
	c, err := ParseRedisURL("redis://:in-url@h:1/0", "LLMHEDGE_TEST_REDIS_PW")
	if err != nil || c.Password != "from-env" {
		t.Errorf("password_env: password %q, %v; want from-env", c.Password, err)
	}
}

// A cluster URL lists its nodes (port 6379 when absent), takes database 0
// only, and its Name lists the nodes without the password.
func TestParseRedisClusterURL(t *testing.T) {
	a, err := ParseRedisURL("redis+cluster://gw:s3cret-pw@10.0.0.1:7000,10.0.0.2,[::1]:7002/", "")
	if err != nil {
		t.Fatal(err)
	}
	if !a.Cluster || a.TLS || a.Username != "gw" || a.Password != "s3cret-pw" || a.DB != 0 {
		t.Errorf("parsed %+v, want a cluster without TLS, user gw, db 0", a)
	}
	if strings.Join(a.Hosts, " ") != "10.0.0.1:7000 10.0.0.2:6379 [::1]:7002" || a.Host != "10.0.0.1:7000" {
		t.Errorf("hosts %q, host %q; want the three nodes with ports and the first as host", a.Hosts, a.Host)
	}
	if a.Name() != "10.0.0.1:7000,10.0.0.2:6379,[::1]:7002/0" {
		t.Errorf("Name() = %q, want the nodes and /0", a.Name())
	}
	s, err := ParseRedisURL("rediss+cluster://h:1", "")
	if err != nil || !s.Cluster || !s.TLS || len(s.Hosts) != 1 || s.Host != "h:1" {
		t.Errorf("rediss+cluster://h:1: %+v, %v; want one TLS cluster node h:1", s, err)
	}
	if p, _ := ParseRedisURL("redis://h:1/2", ""); p.Cluster || p.Hosts != nil {
		t.Errorf("redis://h:1/2 parsed as a cluster: %+v", p)
	}
	for _, bad := range []string{
		"redis+cluster://u:s3cret-pw@h:1,,h:2/",
		"redis+cluster://u:s3cret-pw@/",
		"redis+cluster://u:s3cret-pw@h:1,h:2/1",
		"redis+cluster://u:s3cret-pw@h:1,h:2/?x=1",
		"redis://u:s3cret-pw@h:1,h:2/0",
	} {
		_, err := ParseRedisURL(bad, "")
		if err == nil {
			t.Errorf("%s: no error", redact.URL(bad))
			continue
		}
		if strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("error %q shows the password", err)
		}
	}
}

// A bad fleet URL is reported without its password.
func TestFleetConfigErrorsHideThePassword(t *testing.T) {
	for _, raw := range []string{"http://u:s3cret-pw@h:1/0", "redis://u:s3cret-pw@h:1/x", "redis://u:s3cret-pw@:1/0", "redis://u:s3cret-pw@h:1/0?x=1"} {
		cfg := Config{Upstreams: []UpstreamConfig{{URL: "http://a"}}, Fleet: FleetConfig{URL: raw}}
		err := cfg.Validate()
		if err == nil {
			t.Errorf("%s: no error", redact.URL(raw))
			continue
		}
		if strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("error %q shows the password", err)
		}
		if !strings.Contains(err.Error(), "fleet") {
			t.Errorf("error %q does not name the fleet", err)
		}
	}
	ok := Config{Upstreams: []UpstreamConfig{{URL: "http://a"}}, Fleet: FleetConfig{URL: "redis://h:1/0"}}
	if err := ok.Validate(); err != nil {
		t.Errorf("valid fleet: %v", err)
	}
	if d := ok.WithDefaults().Fleet; d.Prefix != "llmhedge:" || d.Timeout.D().Milliseconds() != 250 {
		t.Errorf("fleet defaults = %+v, want prefix llmhedge: and timeout 250ms", d)
	}
	if off := (Config{}).WithDefaults().Fleet; off != (FleetConfig{}) {
		t.Errorf("no fleet: defaults filled in %+v, want none", off)
	}
}

// Key is built from every field: a value set in any one of them (a new
// field included) gives another key, so two configurations never share a
// Fleet by mistake.
func TestFleetConfigKeyCoversEveryField(t *testing.T) {
	base := FleetConfig{URL: "redis://127.0.0.1:6379/0"}
	v := reflect.ValueOf(&base).Elem()
	for i := 0; i < v.NumField(); i++ {
		changed := base
		f := reflect.ValueOf(&changed).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Int, reflect.Int64:
			f.SetInt(f.Int() + 12345)
		default:
			t.Fatalf("field %s has kind %s: teach this test to change it", v.Type().Field(i).Name, f.Kind())
		}
		if changed.Key() == base.Key() {
			t.Errorf("changing %s leaves the key %q unchanged", v.Type().Field(i).Name, base.Key())
		}
	}
	if (FleetConfig{URL: base.URL, Lease: Duration(2 * time.Second)}).Key() != base.Key() {
		t.Error("a field set to its default gives another key than the default itself")
	}
}
