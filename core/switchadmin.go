package core

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// This file is the per-process kill switch's HTTP surface, one for every
// host with an admin API: the Caddy module registers ServeSwitchAdmin on
// Caddy's admin API, the Envoy server on its admin listener. Both serve
// the same JSON, so an operator's script works against either.

// switchAdminRequest is the body of a POST: {"route": "chat", "paused":
// true, "delay": "250ms"|"auto"}. A field left out is left unchanged; no
// route (or "*") is the switch of every route.
type switchAdminRequest struct {
	Route  string  `json:"route"`
	Paused *bool   `json:"paused"`
	Delay  *string `json:"delay"`
}

// switchAdminList is the answer to a GET, and part of a POST's.
type switchAdminList struct {
	Switches []fleetstore.SwitchEntry `json:"switches"`
}

// switchAdminChange is the answer to a POST.
type switchAdminChange struct {
	Route    string                   `json:"route"`
	Before   string                   `json:"before"`
	After    string                   `json:"after"`
	Switches []fleetstore.SwitchEntry `json:"switches"`
}

// maxSwitchAdminBody bounds a POST's body.
const maxSwitchAdminBody int64 = 64 << 10

// ParseSwitchAdminRequest decodes a POST body into the route and the
// changes it asks for. Unknown fields are errors, so a typo ("pause")
// never silently changes nothing.
func ParseSwitchAdminRequest(body []byte) (string, *bool, *time.Duration, error) {
	var req switchAdminRequest
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return "", nil, nil, errors.New("body: want JSON {\"route\": \"NAME\", \"paused\": true|false, \"delay\": \"250ms\"|\"auto\"}: " + err.Error())
	}
	route := strings.TrimSpace(req.Route)
	if route == "" {
		route = fleetstore.SwitchAllRoutes
	}
	if req.Paused == nil && req.Delay == nil {
		return "", nil, nil, errors.New("body: nothing to change: set paused or delay")
	}
	var delay *time.Duration
	if req.Delay != nil {
		d, err := fleetstore.ParseSwitchDelay(*req.Delay)
		if err != nil {
			return "", nil, nil, err
		}
		delay = &d
	}
	return route, req.Paused, delay, nil
}

// ServeSwitchAdmin serves a process's switches t (not nil): GET lists
// them, POST changes one (body as ParseSwitchAdminRequest
// reads it) and answers with the route's switch before and after and the
// list. Errors are {"error": "..."} with a 4xx status, as Caddy's admin API
// answers its own.
//
// What a web page in a browser on the host could send is refused before
// anything changes: a request whose Origin is not the endpoint's own (403;
// curl, scripts and llmhedge-ctl send none) and a POST whose body is not
// declared JSON (415: a page can send a cross-origin text/plain or form
// POST without asking the browser first, never an application/json one).
// The Host is the host's to check: Caddy's admin API does (see
// ServeSwitchAdminListener for a listener of one's own).
func ServeSwitchAdmin(t *Switches, w http.ResponseWriter, r *http.Request) {
	if msg := switchAdminForeignOrigin(r); msg != "" {
		writeSwitchAdminError(w, http.StatusForbidden, msg)
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		writeSwitchAdmin(w, http.StatusOK, switchAdminList{Switches: switchEntries(t)})
	case http.MethodPost:
		if msg := switchAdminNotJSON(r); msg != "" {
			writeSwitchAdminError(w, http.StatusUnsupportedMediaType, msg)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxSwitchAdminBody+1))
		if err != nil {
			writeSwitchAdminError(w, http.StatusBadRequest, "reading the body: "+err.Error())
			return
		}
		if int64(len(body)) > maxSwitchAdminBody {
			writeSwitchAdminError(w, http.StatusRequestEntityTooLarge, "body larger than 64KiB")
			return
		}
		route, paused, delay, err := ParseSwitchAdminRequest(body)
		if err != nil {
			writeSwitchAdminError(w, http.StatusBadRequest, err.Error())
			return
		}
		before, after := t.Update(route, paused, delay)
		writeSwitchAdmin(w, http.StatusOK, switchAdminChange{
			Route: route, Before: fleetstore.DescribeSwitch(before), After: fleetstore.DescribeSwitch(after), Switches: switchEntries(t),
		})
	default:
		w.Header().Set("Allow", "GET, POST")
		writeSwitchAdminError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed: GET lists the switches, POST changes one")
	}
}

// ServeSwitchAdminListener is ServeSwitchAdmin for an admin listener of
// the host's own (the Envoy server's), which nothing else guards: it also
// refuses (403) a Host header that is neither a loopback name or address
// ("localhost", 127.0.0.1, [::1]), nor the address the request came in on,
// nor one of allowedHosts ("name" for any port, "name:port" for one). A
// page of a name its owner points at 127.0.0.1 (DNS rebinding) is of the
// same origin as far as the browser knows, but sends its own name as Host.
// setting names the configuration that lists allowedHosts, for the error.
func ServeSwitchAdminListener(t *Switches, w http.ResponseWriter, r *http.Request, allowedHosts []string, setting string) {
	if !switchAdminHostAllowed(r, allowedHosts) {
		writeSwitchAdminError(w, http.StatusForbidden, "host "+strconv.Quote(r.Host)+
			" not allowed: use a loopback address (127.0.0.1, [::1], localhost) or list the name in "+setting)
		return
	}
	ServeSwitchAdmin(t, w, r)
}

// switchAdminForeignOrigin returns why r's Origin is refused, "" when it
// has none or its own: the Host it was sent to (which the host checks), or
// a loopback name or address with the port the request came in on.
// "null" (a sandboxed page, a file) is foreign.
func switchAdminForeignOrigin(r *http.Request) string {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return ""
	}
	refused := "origin " + strconv.Quote(origin) + " not allowed: the switch refuses requests from web pages of other origins (send none, as curl and scripts do)"
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return refused
	}
	if strings.EqualFold(u.Host, r.Host) {
		return ""
	}
	host, port := splitSwitchAdminHost(u.Host)
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	if isLoopbackHostName(host) && port == switchAdminLocalPort(r) {
		return ""
	}
	return refused
}

// switchAdminNotJSON returns why r's body is refused, "" when it is
// declared application/json (parameters such as charset allowed).
func switchAdminNotJSON(r *http.Request) string {
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err == nil && mt == "application/json" {
		return ""
	}
	if ct == "" {
		ct = "none"
	}
	return "content type " + ct + " not allowed: send the body with Content-Type: application/json"
}

// switchAdminHostAllowed reports whether r's Host is a loopback name or
// address, the address r came in on, or one of allowed.
func switchAdminHostAllowed(r *http.Request, allowed []string) bool {
	host, _ := splitSwitchAdminHost(r.Host)
	if host == "" {
		return false
	}
	if isLoopbackHostName(host) {
		return true
	}
	if ip := net.ParseIP(host); ip != nil {
		if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			if lh, _ := splitSwitchAdminHost(local.String()); ip.Equal(net.ParseIP(lh)) {
				return true
			}
		}
	}
	for _, a := range allowed {
		if strings.EqualFold(a, r.Host) || strings.EqualFold(strings.Trim(a, "[]"), host) {
			return true
		}
	}
	return false
}

// isLoopbackHostName reports whether host (no port, no brackets) is
// "localhost" or a loopback address.
func isLoopbackHostName(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// switchAdminLocalPort is the port r came in on ("" unknown): the
// listener's, else the Host's.
func switchAdminLocalPort(r *http.Request) string {
	if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if _, port := splitSwitchAdminHost(local.String()); port != "" {
			return port
		}
	}
	_, port := splitSwitchAdminHost(r.Host)
	return port
}

// splitSwitchAdminHost splits "host:port", "[v6]:port", "host" or "[v6]"
// into the host (no brackets) and the port ("" when none).
func splitSwitchAdminHost(hostport string) (string, string) {
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		return h, p
	}
	return strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]"), ""
}

func writeSwitchAdminError(w http.ResponseWriter, status int, msg string) {
	writeSwitchAdmin(w, status, map[string]string{"error": msg})
}

func writeSwitchAdmin(w http.ResponseWriter, status int, v interface{}) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
