package envoyfilter_test

import (
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/envoyfilter"
)

// fleet: at the top applies to every route without its own; a route's own
// wins; ${NAME} in the URL is expanded; a bad URL is reported per route
// without its password.
func TestConfigFleet(t *testing.T) {
	t.Setenv("LLMHEDGE_TEST_REDIS", "127.0.0.1:6390")
	cfg, err := envoyfilter.ParseConfig([]byte(`
fleet: {url: "redis://${LLMHEDGE_TEST_REDIS}/1", timeout: 80ms, prefix: "gw:"}
routes:
  - name: chat
    upstreams: [{url: http://127.0.0.1:9001}]
  - name: own
    upstreams: [{url: http://127.0.0.1:9001}]
    fleet: {url: "redis://10.0.0.1:6379/0", lease: 3s}
`))
	if err != nil {
		t.Fatal(err)
	}
	chat, err := cfg.Routes[0].CoreConfig()
	if err != nil {
		t.Fatal(err)
	}
	if chat.Fleet.URL != "redis://127.0.0.1:6390/1" || chat.Fleet.Timeout.D() != 80*time.Millisecond || chat.Fleet.Prefix != "gw:" {
		t.Errorf("route chat's fleet = %+v, want the server-wide one, expanded", chat.Fleet)
	}
	own, _ := cfg.Routes[1].CoreConfig()
	if own.Fleet.URL != "redis://10.0.0.1:6379/0" || own.Fleet.Lease.D() != 3*time.Second {
		t.Errorf("route own's fleet = %+v, want its own", own.Fleet)
	}
	_, err = envoyfilter.ParseConfig([]byte(`
fleet: {url: "http://u:s3cret-pw@h:1/0"}
routes:
  - name: chat
    upstreams: [{url: http://127.0.0.1:9001}]
`))
	if err == nil || !strings.Contains(err.Error(), "routes[0] (chat): fleet") || strings.Contains(err.Error(), "s3cret-pw") {
		t.Errorf("bad fleet URL: error %v, want one naming the route's fleet without the password", err)
	}
}
