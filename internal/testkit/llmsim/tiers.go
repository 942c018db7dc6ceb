package llmsim

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
)

// StartOn serves s on addr, e.g. "127.0.0.1:9001" (port 0: chosen by the
// system), so that configuration written for fixed ports needs no edits.
func (s *Server) StartOn(addr string) (*Running, error) {
	ts, err := listenOn(addr, s)
	if err != nil {
		return nil, err
	}
	return &Running{Server: s, URL: ts.URL, ts: ts}, nil
}

// listenOn starts an httptest server for h on addr.
func listenOn(addr string, h http.Handler) (*httptest.Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ts := httptest.NewUnstartedServer(h)
	ts.Listener.Close()
	ts.Listener = l
	ts.Start()
	return ts, nil
}

// Tiered is a simulated provider with a standard and a priority tier behind
// one URL, as OpenAI's and Anthropic's APIs are: the request body's
// "service_tier" chooses the tier (see PriorityRequested). Each tier is a
// Server of its own, with its own Name (which seeds its draws), Workload
// and counters; a priority tier is typically the same median with a lower
// tail. Set both fields before it serves requests.
type Tiered struct {
	Standard, Priority *Server
}

// PriorityTier is a priority tier's workload for the standard workload w:
// the same median with a lower tail, the lognormal's sigma halved and a
// tenth of the stalls.
func PriorityTier(w Workload) Workload {
	p := w.WithDefaults()
	if p.Sigma > 0 {
		p.Sigma /= 2
	}
	if p.StallProb > 0 {
		p.StallProb /= 10
	}
	return p
}

// PriorityRequested reports whether a request body at path asks for the
// priority tier: "service_tier": "priority" (OpenAI Chat Completions and
// Responses), or "service_tier": "auto" on the Messages API (Anthropic's
// value that lets an organisation with Priority Tier capacity use it;
// "standard_only" forbids it). Anthropic's API defaults to "auto"; the
// simulator treats a missing field as the standard tier, so that both
// tiers are asked for explicitly.
func PriorityRequested(path string, body []byte) bool {
	var fields struct {
		ServiceTier string `json:"service_tier"`
	}
	if json.Unmarshal(body, &fields) != nil {
		return false
	}
	if f, _ := FormatForPath(path); f == Messages {
		return fields.ServiceTier == "auto"
	}
	return fields.ServiceTier == "priority"
}

// ServeHTTP hands the request to the tier its body asks for.
func (t *Tiered) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, maxBody))
	r.Body = io.NopCloser(bytes.NewReader(body))
	tier := t.Standard
	if PriorityRequested(r.URL.Path, body) {
		tier = t.Priority
	}
	tier.ServeHTTP(w, r)
}

// RunningTiered is a Tiered provider listening on a loopback port.
type RunningTiered struct {
	*Tiered
	// URL is the base URL, e.g. http://127.0.0.1:41234.
	URL string
	ts  *httptest.Server
}

// Start serves t on 127.0.0.1, port chosen by the system.
func (t *Tiered) Start() *RunningTiered {
	ts := httptest.NewServer(t)
	return &RunningTiered{Tiered: t, URL: ts.URL, ts: ts}
}

// StartOn serves t on addr, e.g. "127.0.0.1:9001" (port 0: chosen by the
// system).
func (t *Tiered) StartOn(addr string) (*RunningTiered, error) {
	ts, err := listenOn(addr, t)
	if err != nil {
		return nil, err
	}
	return &RunningTiered{Tiered: t, URL: ts.URL, ts: ts}, nil
}

// Close closes every client connection and stops the server once the
// handlers in flight have returned.
func (r *RunningTiered) Close() {
	r.ts.CloseClientConnections()
	r.ts.Close()
}
