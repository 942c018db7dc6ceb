package core

import (
	"net/http"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/redact"
	"github.com/llmhedge/llmhedge/core/stream"
)

// Error text never carries a credential (package redact says how). These
// are the engine's lists of what to redact.

// reasonSecrets is what a failed attempt's reason must not quote: the
// configured secrets and the client's own credentials (the scope headers'
// values and redact.CredentialHeaders'). Built on the failure path only.
func reasonSecrets(h *Hedger, r *http.Request) []string {
	out := append([]string(nil), h.secrets...)
	hdr := r.Header
	if r.URL != nil && r.URL.RawQuery != "" {
		out = redact.AppendQuery(out, "?"+r.URL.RawQuery)
	}
	for _, name := range h.scopeHeaders {
		for _, v := range hdr[name] {
			out = redact.AppendHeader(out, v)
		}
	}
	for _, name := range redact.CredentialHeaders {
		for _, v := range hdr[name] {
			out = redact.AppendHeader(out, v)
		}
	}
	return out
}

// secretsOf lists what must never appear in error text: every configured
// header value that is a credential (see redact.AppendSetHeader) and the
// credentials of an upstream URL's query (a provider key may travel
// there), raw and decoded.
func secretsOf(ups []config.UpstreamConfig) []string {
	var out []string
	for _, u := range ups {
		out = redact.AppendQuery(out, u.URL)
		for name, v := range u.SetHeaders {
			out = redact.AppendSetHeader(out, name, v)
		}
	}
	return out
}

// redactReason redacts a failed attempt's reason and cuts it to MaxReason.
func redactReason(reason string, secrets []string) string {
	return redact.Reason(reason, secrets, stream.MaxReason)
}
