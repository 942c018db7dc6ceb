// Package switchadmin drives the per-process kill switch's admin endpoint
// (core.ServeSwitchAdmin) as the Caddy module and the Envoy server serve
// it, for their tests.
package switchadmin

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// Call sends method to url (the endpoint's full URL) with body ("" for
// none) and returns the status and the answer. Each call has a connection
// of its own: a Caddy config load replaces the admin server.
func Call(t testing.TB, url, method, body string) (int, string) {
	t.Helper()
	return Send(t, url, method, body, map[string]string{"Content-Type": "application/json"})
}

// Send is Call with the request headers hdr instead of a JSON content
// type: "Host" sets the Host header (the URL's address is still the one
// dialled), a web page's "Origin", "Content-Type" ... .
func Send(t testing.TB, url, method, body string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(answer)
}

// Listed is a GET of url as "route=switch" words, sorted by route, joined
// by spaces ("" for none).
func Listed(t testing.TB, url string) string {
	t.Helper()
	code, body := Call(t, url, http.MethodGet, "")
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, code, body)
	}
	var list struct{ Switches []fleetstore.SwitchEntry }
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatalf("GET %s: %v in %s", url, err, body)
	}
	words := make([]string, 0, len(list.Switches))
	for _, s := range list.Switches {
		words = append(words, s.Route+"="+s.Switch)
	}
	return strings.Join(words, " ")
}
