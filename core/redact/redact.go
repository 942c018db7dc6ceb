// Package redact keeps credentials out of text: error messages, reasons,
// logged URLs and kept upstream bodies.
package redact

import (
	"bytes"
	"net/url"
	"strings"
	"unicode/utf8"
)

// Error text never carries a credential: a URL's userinfo and query values
// are replaced by Mark (query keys stay, to say which parameter was
// there), and so is every configured header value. Upstream URLs reach text
// through Validate and through transport errors (`Post "http://…": dial …`);
// header values through upstream error events and bodies that quote them.
// The reasons of failed attempts (the report, so the adapters' logs) are
// also cleared of the client's own credential headers, which an upstream
// may echo back.

const Mark = "REDACTED"

// MinSecretLen: header values shorter than this are not replaced in text.
// They are not credentials (e.g. `1`, `on`), and replacing them would
// garble every number in a message.
const MinSecretLen = 4

// CredentialHeaders carry a caller's credential in the common APIs: the
// default idempotency scope, and redacted from reasons whatever the scope.
var CredentialHeaders = []string{"Authorization", "X-Api-Key", "Api-Key", "X-Goog-Api-Key"}

// longSecretLen: a configured header or query value this long is treated
// as a credential whatever its name; shorter ones only under a credential
// name (IsCredentialName). Redacting every short value would garble kept
// error bodies (`"retryable":true`, `?alt=json`) for nothing.
const longSecretLen = 16

// IsCredentialName reports whether a header or query parameter name says it
// carries a credential.
func IsCredentialName(name string) bool {
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

// URL returns a URL with its userinfo and every query value replaced
// and its fragment's text too. It works on the text, so it also redacts a
// URL that does not parse.
func URL(raw string) string {
	u := splitURL(raw)
	out := u.scheme
	if u.hasUser {
		out += Mark + "@"
	}
	out += u.rest
	if u.hasQuery {
		out += "?" + query(u.query)
	}
	if u.hasFrag {
		out += "#" + Mark
	}
	return out
}

// query keeps the keys of a raw query and replaces its values. A part
// without "=" is a value (`?sk-…`): a bare key is still a key.
func query(q string) string {
	parts := strings.Split(q, "&")
	for i, part := range parts {
		if eq := strings.IndexByte(part, '='); eq >= 0 {
			parts[i] = part[:eq+1] + Mark
		} else if part != "" {
			parts[i] = Mark
		}
	}
	return strings.Join(parts, "&")
}

// Text redacts every http(s) URL in a message, then every secret.
func Text(msg string, secrets []string) string {
	if strings.Contains(msg, "://") {
		msg = URLsIn(msg)
	}
	for _, s := range secrets {
		if strings.Contains(msg, s) {
			msg = strings.ReplaceAll(msg, s, Mark)
		}
	}
	return msg
}

// Body replaces every secret in an upstream's body, kept for the
// client: it returns body itself when there is none.
func Body(body []byte, secrets []string) []byte {
	for _, s := range secrets {
		if bytes.Contains(body, []byte(s)) {
			body = bytes.ReplaceAll(body, []byte(s), []byte(Mark))
		}
	}
	return body
}

// Reason redacts upstream text quoted in a reason, then cuts it to
// maxLen bytes: cut first, a key's start would survive the cut.
func Reason(reason string, secrets []string, maxLen int) string {
	reason = Text(reason, secrets)
	if len(reason) <= maxLen {
		return reason
	}
	end := maxLen
	for end > 0 && !utf8.RuneStart(reason[end]) {
		end--
	}
	return reason[:end] + "…"
}

// URLsIn redacts each URL in msg; a URL ends at a space or a quote
// (Go's errors quote URLs: `Post "http://host/path?key=v": …`).
func URLsIn(msg string) string {
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
		out.WriteString(URL(msg[start:end]))
		msg = msg[end:]
	}
}

func isSchemeByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'
}

// AppendHeader adds a header value to out, and the credential of a
// `<scheme> <credential>` value (`Bearer sk-…`) on its own, each when it is
// at least MinSecretLen long.
func AppendHeader(out []string, v string) []string {
	v = strings.TrimSpace(v)
	if len(v) >= MinSecretLen {
		out = append(out, v)
	}
	if _, cred, ok := strings.Cut(v, " "); ok {
		cred = strings.TrimSpace(cred)
		if len(cred) >= MinSecretLen {
			out = append(out, cred)
		}
	}
	return out
}

// AppendQuery adds the credentials in rawURL's query to out: values
// of credential-named parameters, and any value (a part without "=" is a
// value, as in query) at least longSecretLen long.
func AppendQuery(out []string, rawURL string) []string {
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
		if !(ok && IsCredentialName(name)) && len(v) < longSecretLen {
			continue
		}
		if len(v) >= MinSecretLen {
			out = append(out, v)
		}
		if dec, err := url.QueryUnescape(v); err == nil && dec != v && len(dec) >= MinSecretLen {
			out = append(out, dec)
		}
	}
	return out
}

// AppendSetHeader adds a configured header's value to out when it is a
// credential: under a credential name, or at least LongSecretLen long.
func AppendSetHeader(out []string, name, v string) []string {
	if IsCredentialName(name) || len(strings.TrimSpace(v)) >= longSecretLen {
		out = AppendHeader(out, v)
	}
	return out
}

// ParseError is url.Parse's complaint about raw without the URL it quotes,
// and with the parts of the URL that may be secret (as URL finds them)
// redacted.
func ParseError(err error, raw string) string {
	msg := err.Error()
	if ue, ok := err.(*url.Error); ok {
		msg = ue.Err.Error()
	}
	u := splitURL(raw)
	secrets := AppendQuery(nil, raw)
	if u.query != "" {
		secrets = append(secrets, u.query)
	}
	if u.userinfo != "" {
		secrets = append(secrets, u.userinfo)
		if _, password, ok := strings.Cut(u.userinfo, ":"); ok && password != "" {
			secrets = append(secrets, password)
		}
	}
	return Text(msg, secrets)
}
