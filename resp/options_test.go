package resp

import (
	"os"
	"strings"
	"testing"
)

// setenv sets an environment variable for one test. Not t.Setenv: under
// Yaegi the interpreted os.Getenv reads the interpreter's own copy of the
// environment, which only the interpreted os.Setenv changes (as under
// Traefik, where the plugin sees the environment Traefik started with).
func setenv(t *testing.T, name, value string) {
	t.Helper()
	if err := os.Setenv(name, value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Unsetenv(name) })
}

func TestParseURL(t *testing.T) {
	cases := []struct {
		url                  string
		addr, user, password string
		db                   int
		useTLS               bool
	}{
		{url: "redis://127.0.0.1:6380", addr: "127.0.0.1:6380"},
		{url: "redis://localhost", addr: "localhost:6379"},
		{url: "redis://:pw@h:1/2", addr: "h:1", password: "pw", db: 2},
		{url: "redis://app:p%40ss@h:1/0", addr: "h:1", user: "app", password: "p@ss"},
		{url: "rediss://h:6390/15", addr: "h:6390", db: 15, useTLS: true},
		{url: "redis://[::1]:7000/", addr: "[::1]:7000"},
	}
	for _, c := range cases {
		ep, err := parseURL(c.url, "")
		if err != nil {
			t.Errorf("parseURL(%q): %v", c.url, err)
			continue
		}
		if ep.addr != c.addr || ep.user != c.user || ep.password != c.password || ep.db != c.db || ep.useTLS != c.useTLS {
			t.Errorf("parseURL(%q) = addr %q user %q password %q db %d tls %v; want %q %q %q %d %v",
				c.url, ep.addr, ep.user, ep.password, ep.db, ep.useTLS, c.addr, c.user, c.password, c.db, c.useTLS)
		}
	}
}

func TestParseURLErrorsHideThePassword(t *testing.T) {
	bad := []string{
		"http://u:hunter2@h:1",
		"redis://u:hunter2@h:99999",
		"redis://u:hunter2@h:1/x",
		"redis://u:hunter2@h:1/0?db=1",
		"redis://u:hunter2@:1",
		"redis://u:hunter2@h:1/%zz",
		"redis://u:hunter2@h\x7f:1",
		"redis+cluster://u:hunter2@h:1,h:x/",
		"redis+cluster://u:hunter2@h:1,h:2/1", // database 0 only
	}
	for _, raw := range bad {
		_, err := parseURL(raw, "")
		if err == nil {
			t.Errorf("parseURL(%q) = no error, want one", raw)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("parseURL error %q contains the password", err.Error())
		}
	}
}

func TestPasswordEnv(t *testing.T) {
	setenv(t, "LLMHEDGE_TEST_REDIS_PW", "from-env")
	ep, _, err := Options{URL: "redis://:from-url@h:1", PasswordEnv: "LLMHEDGE_TEST_REDIS_PW"}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if ep.password != "from-env" {
		t.Fatalf("password = %q, want the environment's from-env", ep.password)
	}
	_, _, err = Options{URL: "redis://h:1", PasswordEnv: "LLMHEDGE_TEST_REDIS_PW_UNSET"}.resolve()
	if err == nil || !strings.Contains(err.Error(), "LLMHEDGE_TEST_REDIS_PW_UNSET") {
		t.Fatalf("unset password variable: err = %v, want one naming the variable", err)
	}
}

func TestResolveDefaults(t *testing.T) {
	_, o, err := Options{URL: "redis://h", MaxIdle: 100, MaxOpen: 10}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if o.MaxIdle != 10 {
		t.Fatalf("MaxIdle = %d, want 10 (capped at MaxOpen)", o.MaxIdle)
	}
	if o.DialTimeout != DefaultDialTimeout || o.ReadTimeout != DefaultReadTimeout || o.MaxBlocking != DefaultMaxBlocking {
		t.Fatalf("defaults: dial %v read %v maxBlocking %d; want %v %v %d",
			o.DialTimeout, o.ReadTimeout, o.MaxBlocking, DefaultDialTimeout, DefaultReadTimeout, DefaultMaxBlocking)
	}
}
