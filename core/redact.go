package core

import (
	"bytes"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"
)

// Error text never carries a credential: a URL's userinfo and query values
// are replaced by redactedMark (query keys stay, to say which parameter was
// there), and so is every configured header value. Upstream URLs reach text
// through Validate and through transport errors (`Post "http://…": dial …`);
// header values through upstream error events and bodies that quote them.
// The reasons of failed attempts (the report, so the adapters' logs) are
// also cleared of the client's own credential headers, which an upstream
// may echo back.

const redactedMark = "REDACTED"

// minSecretLen: header values shorter than this are not replaced in text.
// They are not credentials (e.g. `1`, `on`), and replacing them would
// garble every number in a message.
const minSecretLen = 4

// credentialHeaders carry a caller's credential in the common APIs: the
// default idempotency scope, and redacted from reasons whatever the scope.
var credentialHeaders = []string{"Authorization", "X-Api-Key", "Api-Key", "X-Goog-Api-Key"}

// longSecretLen: a configured header or query value this long is treated
// as a credential whatever its name; shorter ones only under a credential
// name (credentialName). Redacting every short value would garble kept
// error bodies (`"retryable":true`, `?alt=json`) for nothing.
const longSecretLen = 16

// credentialName reports whether a header or query parameter name says it
// carries a credential.
func credentialName(name string) bool {
	n := strings.ToLower(name)
	if n == "sig" || n == "code" {
		return true
	}
	for _, part := range []string{"auth", "key", "token", "secret", "signature", "password", "passwd", "cookie", "credential", "session"} {
		if strings.Contains(n, part) {
			return true
		}
	}
	return false
}

// urlParts is a URL's text cut into its parts, without parsing it: a URL
// that does not parse is still taken apart.
type urlParts struct {
	scheme   string // up to and including "://", "" when absent
	userinfo string // before the authority's last "@", without it
	hasUser  bool
	rest     string // host, port and path
	query    string // without "?"
	hasQuery bool
	hasFrag  bool // the fragment itself is never needed
}

func splitURL(raw string) urlParts {
	var u urlParts
	rest := raw
	if i := strings.Index(rest, "://"); i >= 0 {
		u.scheme = rest[:i+3]
		rest = rest[i+3:]
	}
	authorityEnd := strings.IndexAny(rest, "/?#")
	if authorityEnd < 0 {
		authorityEnd = len(rest)
	}
	if at := strings.LastIndex(rest[:authorityEnd], "@"); at >= 0 {
		u.userinfo = rest[:at]
		u.hasUser = true
		rest = rest[at+1:]
	}
	if i := strings.IndexByte(rest, '#'); i >= 0 {
		u.hasFrag = true
		rest = rest[:i]
	}
	if i := strings.IndexByte(rest, '?'); i >= 0 {
		u.query = rest[i+1:]
		u.hasQuery = true
		rest = rest[:i]
	}
	u.rest = rest
	return u
}

// redactURL returns a URL with its userinfo and every query value replaced
// and its fragment's text too. It works on the text, so it also redacts a
// URL that does not parse.
func redactURL(raw string) string {
	u := splitURL(raw)
	out := u.scheme
	if u.hasUser {
		out += redactedMark + "@"
	}
	out += u.rest
	if u.hasQuery {
		out += "?" + redactQuery(u.query)
	}
	if u.hasFrag {
		out += "#" + redactedMark
	}
	return out
}

// redactQuery keeps the keys of a raw query and replaces its values. A part
// without "=" is a value (`?sk-…`): a bare key is still a key.
func redactQuery(q string) string {
	parts := strings.Split(q, "&")
	for i, part := range parts {
		if eq := strings.IndexByte(part, '='); eq >= 0 {
			parts[i] = part[:eq+1] + redactedMark
		} else if part != "" {
			parts[i] = redactedMark
		}
	}
	return strings.Join(parts, "&")
}

// redactText redacts every http(s) URL in a message, then every secret.
func redactText(msg string, secrets []string) string {
	if strings.Contains(msg, "://") {
		msg = redactURLsIn(msg)
	}
	for _, s := range secrets {
		if strings.Contains(msg, s) {
			msg = strings.ReplaceAll(msg, s, redactedMark)
		}
	}
	return msg
}

// redactBody replaces every secret in an upstream's body, kept for the
// client: it returns body itself when there is none.
func redactBody(body []byte, secrets []string) []byte {
	for _, s := range secrets {
		if bytes.Contains(body, []byte(s)) {
			body = bytes.ReplaceAll(body, []byte(s), []byte(redactedMark))
		}
	}
	return body
}

// redactReason redacts upstream text quoted in a reason, then cuts it to
// maxReason bytes: cut first, a key's start would survive the cut.
func redactReason(reason string, secrets []string) string {
	reason = redactText(reason, secrets)
	if len(reason) <= maxReason {
		return reason
	}
	end := maxReason
	for end > 0 && !utf8.RuneStart(reason[end]) {
		end--
	}
	return reason[:end] + "…"
}

// reasonSecrets is what a failed attempt's reason must not quote: the
// configured secrets and the client's own credentials (the scope headers'
// values and credentialHeaders'). Built on the failure path only.
func reasonSecrets(h *Hedger, r *http.Request) []string {
	out := append([]string(nil), h.secrets...)
	hdr := r.Header
	if r.URL != nil && r.URL.RawQuery != "" {
		out = appendQuerySecrets(out, "?"+r.URL.RawQuery)
	}
	for _, name := range h.scopeHeaders {
		for _, v := range hdr[name] {
			out = appendHeaderSecrets(out, v)
		}
	}
	for _, name := range credentialHeaders {
		for _, v := range hdr[name] {
			out = appendHeaderSecrets(out, v)
		}
	}
	return out
}

// redactURLsIn redacts each URL in msg; a URL ends at a space or a quote
// (Go's errors quote URLs: `Post "http://host/path?key=v": …`).
func redactURLsIn(msg string) string {
	var out strings.Builder
	for {
		i := strings.Index(msg, "://")
		if i < 0 {
			out.WriteString(msg)
			return out.String()
		}
		start := i
		for start > 0 && isSchemeByte(msg[start-1]) {
			start--
		}
		end := i + 3
		for end < len(msg) && !strings.ContainsRune(" \t\r\n\"'`<>", rune(msg[end])) {
			end++
		}
		out.WriteString(msg[:start])
		out.WriteString(redactURL(msg[start:end]))
		msg = msg[end:]
	}
}

func isSchemeByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'
}

// secretsOf lists what must never appear in error text: every configured
// header value that is a credential (see appendHeaderSecrets) and the
// credentials of an upstream URL's query (a provider key may travel
// there), raw and decoded.
func secretsOf(ups []UpstreamConfig) []string {
	var out []string
	for _, u := range ups {
		out = appendQuerySecrets(out, u.URL)
		for name, v := range u.SetHeaders {
			if credentialName(name) || len(strings.TrimSpace(v)) >= longSecretLen {
				out = appendHeaderSecrets(out, v)
			}
		}
	}
	return out
}

// appendHeaderSecrets adds a header value to out, and the credential of a
// `<scheme> <credential>` value (`Bearer sk-…`) on its own, each when it is
// at least minSecretLen long.
func appendHeaderSecrets(out []string, v string) []string {
	v = strings.TrimSpace(v)
	if len(v) >= minSecretLen {
		out = append(out, v)
	}
	if _, cred, ok := strings.Cut(v, " "); ok {
		cred = strings.TrimSpace(cred)
		if len(cred) >= minSecretLen {
			out = append(out, cred)
		}
	}
	return out
}

// appendQuerySecrets adds the credentials in rawURL's query to out: values
// of credential-named parameters, and any value (a part without "=" is a
// value, as in redactQuery) at least longSecretLen long.
func appendQuerySecrets(out []string, rawURL string) []string {
	u := splitURL(rawURL)
	if !u.hasQuery {
		return out
	}
	for _, pair := range strings.Split(u.query, "&") {
		v := pair
		name, after, ok := strings.Cut(pair, "=")
		if ok {
			v = after
		}
		if !(ok && credentialName(name)) && len(v) < longSecretLen {
			continue
		}
		if len(v) >= minSecretLen {
			out = append(out, v)
		}
		if dec, err := url.QueryUnescape(v); err == nil && dec != v && len(dec) >= minSecretLen {
			out = append(out, dec)
		}
	}
	return out
}
