package core

import (
	"net/url"
	"strings"
)

// Error text never carries a credential: a URL's userinfo and query values
// are replaced by redactedMark (query keys stay, to say which parameter was
// there), and so is every configured header value. Upstream URLs reach text
// through Validate and through transport errors (`Post "http://…": dial …`);
// header values through upstream error events that quote them.

const redactedMark = "REDACTED"

// minSecretLen: header values shorter than this are not replaced in text.
// They are not credentials (e.g. `1`, `on`), and replacing them would
// garble every number in a message.
const minSecretLen = 4

// redactURL returns a URL with its userinfo and every query value replaced
// and its fragment dropped. It works on the text, so it also redacts a URL
// that does not parse.
func redactURL(raw string) string {
	rest := raw
	prefix := ""
	if i := strings.Index(rest, "://"); i >= 0 {
		prefix = rest[:i+3]
		rest = rest[i+3:]
	}
	authorityEnd := strings.IndexAny(rest, "/?#")
	if authorityEnd < 0 {
		authorityEnd = len(rest)
	}
	if at := strings.LastIndex(rest[:authorityEnd], "@"); at >= 0 {
		rest = redactedMark + rest[at:]
	}
	fragment := ""
	if i := strings.IndexByte(rest, '#'); i >= 0 {
		fragment = "#" + redactedMark
		rest = rest[:i]
	}
	query := ""
	if i := strings.IndexByte(rest, '?'); i >= 0 {
		query = "?" + redactQuery(rest[i+1:])
		rest = rest[:i]
	}
	return prefix + rest + query + fragment
}

// redactQuery keeps the keys of a raw query and replaces its values.
func redactQuery(q string) string {
	parts := strings.Split(q, "&")
	for i, part := range parts {
		if eq := strings.IndexByte(part, '='); eq >= 0 {
			parts[i] = part[:eq+1] + redactedMark
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
// header value, the credential of a `<scheme> <credential>` value
// (`Bearer sk-…`) on its own, and every value of an upstream URL's query
// (a provider key may travel there), raw and decoded.
func secretsOf(ups []UpstreamConfig) []string {
	var out []string
	for _, u := range ups {
		out = appendQuerySecrets(out, u.URL)
		for _, v := range u.SetHeaders {
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
		}
	}
	return out
}

// appendQuerySecrets adds the values of rawURL's query to out.
func appendQuerySecrets(out []string, rawURL string) []string {
	_, query, ok := strings.Cut(rawURL, "?")
	if !ok {
		return out
	}
	for _, pair := range strings.Split(query, "&") {
		_, v, _ := strings.Cut(pair, "=")
		if len(v) >= minSecretLen {
			out = append(out, v)
		}
		if dec, err := url.QueryUnescape(v); err == nil && dec != v && len(dec) >= minSecretLen {
			out = append(out, dec)
		}
	}
	return out
}
