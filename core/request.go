package core

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// HeaderHedge lets a client opt out of hedging (`X-LLM-Hedge: off`).
// It is never forwarded upstream.
const HeaderHedge = "X-LLM-Hedge"

// HeaderAttempt carries the attempt number (0, 1, ...) to the upstream.
const HeaderAttempt = "X-LLM-Hedge-Attempt"

// preparedRequest is the client's request, read and checked once, from
// which every attempt's request is built.
type preparedRequest struct {
	orig      *http.Request
	body      []byte    // the buffered body (whole, when hedgeable)
	rest      io.Reader // non-nil when the body outgrew MaxBody: the unread remainder
	hedgeable bool      // a race may run
	why       string    // why not, when not
	stateful  bool      // the request may change state upstream
	clientKey bool      // the idempotency key came from the client
	key       string
	tenant    string
	// bodies[i] is the body for upstream i (the model rewritten), nil: body.
	bodies [][]byte
}

// badRequest is a client error found while preparing the request.
type badRequest struct {
	status int
	code   string
	msg    string
}

func (e *badRequest) Error() string { return e.msg }

// prepare reads and checks r. It never loses bytes: a body over MaxBody is
// kept as buffered prefix + unread rest and forwarded once.
func (h *Hedger) prepare(r *http.Request) (*preparedRequest, error) {
	p := &preparedRequest{orig: r, hedgeable: true}
	switch {
	case strings.EqualFold(strings.TrimSpace(r.Header.Get(HeaderHedge)), "off"):
		p.hedgeable = false
		p.why = "opted out"
	case !h.methodAllowed(r.Method):
		p.hedgeable = false
		p.why = "method"
	case !h.pathAllowed(r.URL.Path):
		p.hedgeable = false
		p.why = "path"
	}
	if r.Body != nil && r.Body != http.NoBody {
		buf, err := io.ReadAll(io.LimitReader(r.Body, h.cfg.MaxBody+1))
		if err != nil {
			if r.Context().Err() != nil {
				return nil, r.Context().Err()
			}
			return nil, &badRequest{http.StatusBadRequest, "invalid_request_body", "could not read the request body: " + err.Error()}
		}
		p.body = buf
		if int64(len(buf)) > h.cfg.MaxBody {
			p.rest = r.Body
			p.hedgeable = false
			p.why = "body over max_body"
		}
	}
	if err := h.idempotencyKey(p); err != nil {
		return nil, err
	}
	p.tenant = r.Header.Get(h.cfg.Budget.TenantHeader)
	if p.rest != nil {
		return p, nil
	}
	isJSON := len(bytes.TrimSpace(p.body)) > 0 && (looksJSON(r.Header.Get("Content-Type")) || h.rewritesModel)
	if isJSON {
		if !json.Valid(p.body) {
			return nil, &badRequest{http.StatusBadRequest, "invalid_json", "the request body is not valid JSON"}
		}
		p.stateful = mayChangeState(p.body, r.URL.Path)
	}
	if !h.rewritesModel || !isJSON {
		return p, nil
	}
	p.bodies = make([][]byte, len(h.cfg.Upstreams))
	for i, u := range h.cfg.Upstreams {
		if u.Model == "" {
			continue
		}
		b, err := rewriteModel(p.body, u.Model)
		if err != nil {
			return nil, &badRequest{http.StatusBadRequest, "invalid_json", "cannot set the model: " + err.Error()}
		}
		p.bodies[i] = b
	}
	return p, nil
}

func (h *Hedger) methodAllowed(m string) bool {
	for _, allowed := range h.cfg.Methods {
		if strings.EqualFold(allowed, m) {
			return true
		}
	}
	return false
}

func (h *Hedger) pathAllowed(path string) bool {
	if len(h.cfg.PathPrefixes) == 0 {
		return true
	}
	for _, prefix := range h.cfg.PathPrefixes {
		if strings.HasPrefix(path, prefix) {
			return true
		}
	}
	return false
}

func (h *Hedger) idempotencyKey(p *preparedRequest) error {
	key := p.orig.Header.Get(h.cfg.Idempotency.Header)
	if key == "" {
		p.key = newKey()
		return nil
	}
	if len(key) > 255 {
		return &badRequest{http.StatusBadRequest, "invalid_idempotency_key", "the idempotency key is longer than 255 characters"}
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return &badRequest{http.StatusBadRequest, "invalid_idempotency_key", "the idempotency key must be printable ASCII without spaces"}
		}
	}
	p.key = key
	p.clientKey = true
	return nil
}

func newKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "llmhedge-" + hex.EncodeToString(b[:])
}

// fingerprint identifies a request for idempotency conflicts.
func (p *preparedRequest) fingerprint() string {
	sum := sha256.New()
	io.WriteString(sum, p.orig.Method+" "+p.orig.URL.Path+"?"+p.orig.URL.RawQuery+"\n")
	sum.Write(p.body)
	return hex.EncodeToString(sum.Sum(nil))
}

func looksJSON(contentType string) bool {
	ct := strings.ToLower(contentType)
	return ct == "" || strings.Contains(ct, "json")
}

// The markers mayChangeState looks for, converted once.
var (
	keyStore      = []byte(`"store"`)
	keyBackground = []byte(`"background"`)
	keyTools      = []byte(`"tools"`)
	escapeU       = []byte(`\u`)
)

// mayChangeState reports whether a JSON request body may change state
// upstream, so that sending it twice is unsafe without an idempotency key:
// "store": true, "background": true, a Responses API call without
// "store": false (the API stores by default), or server-side tools that act
// (MCP, code interpreter, computer use, shell).
func mayChangeState(body []byte, path string) bool {
	isResponses := strings.HasSuffix(strings.TrimRight(path, "/"), "/responses")
	if !isResponses && !bytes.Contains(body, keyStore) && !bytes.Contains(body, keyBackground) &&
		!bytes.Contains(body, keyTools) && !bytes.Contains(body, escapeU) {
		return false // cheap and common: nothing to decode (escaped keys are decoded)
	}
	var doc struct {
		Store      *bool             `json:"store"`
		Background bool              `json:"background"`
		Tools      []json.RawMessage `json:"tools"`
	}
	if json.Unmarshal(body, &doc) != nil {
		return false
	}
	if doc.Store != nil && *doc.Store || doc.Background {
		return true
	}
	if doc.Store == nil && isResponses {
		return true
	}
	for _, raw := range doc.Tools {
		var tool struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(raw, &tool) != nil {
			continue
		}
		switch {
		case tool.Type == "mcp", tool.Type == "code_interpreter", tool.Type == "local_shell",
			tool.Type == "shell", tool.Type == "apply_patch", strings.HasPrefix(tool.Type, "computer_use"):
			return true
		}
	}
	return false
}

// rewriteModel sets the top-level "model" of a JSON object, keeping every
// other byte as it was (no re-encoding, so numbers and key order survive).
func rewriteModel(body []byte, model string) ([]byte, error) {
	quoted, _ := json.Marshal(model)
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("the body is not a JSON object")
	}
	open := int(dec.InputOffset())
	for dec.More() {
		keyTok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		afterKey := int(dec.InputOffset())
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		end := int(dec.InputOffset())
		if keyTok == "model" {
			start := afterKey
			for start < end && (body[start] == ':' || body[start] == ' ' || body[start] == '\t' || body[start] == '\n' || body[start] == '\r') {
				start++
			}
			out := make([]byte, 0, len(body)+len(quoted))
			out = append(out, body[:start]...)
			out = append(out, quoted...)
			return append(out, body[end:]...), nil
		}
	}
	out := make([]byte, 0, len(body)+len(quoted)+10)
	out = append(out, body[:open]...)
	out = append(out, `"model":`...)
	out = append(out, quoted...)
	rest := bytes.TrimLeft(body[open:], " \t\r\n")
	if len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, body[open:]...), nil
}

// hopHeaders are connection-level and never forwarded (RFC 9110 §7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopHeaders(h http.Header) {
	for _, v := range h["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// attemptRequest builds attempt `index`'s request to upstream `up`.
func (h *Hedger) attemptRequest(ctx context.Context, p *preparedRequest, up, index int) (*http.Request, error) {
	u := h.cfg.Upstreams[up]
	base := h.bases[up]
	target := *base
	target.Path = joinPath(base.Path, p.orig.URL.Path)
	target.RawPath = ""
	target.RawQuery = p.orig.URL.RawQuery
	var body io.Reader = http.NoBody
	length := int64(0)
	switch {
	case p.rest != nil:
		body = io.MultiReader(bytes.NewReader(p.body), p.rest)
		length = p.orig.ContentLength
	case p.bodies != nil && p.bodies[up] != nil:
		body = bytes.NewReader(p.bodies[up])
		length = int64(len(p.bodies[up]))
	case len(p.body) > 0:
		body = bytes.NewReader(p.body)
		length = int64(len(p.body))
	}
	req, err := http.NewRequestWithContext(ctx, p.orig.Method, target.String(), body)
	if err != nil {
		return nil, err
	}
	req.ContentLength = length
	if length < 0 {
		req.ContentLength = -1
	}
	req.Header = p.orig.Header.Clone()
	if req.Header == nil {
		req.Header = make(http.Header)
	}
	removeHopHeaders(req.Header)
	req.Header.Del(HeaderHedge)
	req.Header.Del("Content-Length")
	// The engine must read first events as plain text; the transport asks
	// for gzip itself and undoes it.
	req.Header.Del("Accept-Encoding")
	req.Header.Set(h.cfg.Idempotency.Header, p.key)
	req.Header.Set(HeaderAttempt, strconv.Itoa(index))
	if ip, _, err := net.SplitHostPort(p.orig.RemoteAddr); err == nil {
		if prior := req.Header.Get("X-Forwarded-For"); prior != "" {
			ip = prior + ", " + ip
		}
		req.Header.Set("X-Forwarded-For", ip)
	}
	if req.Header.Get("X-Forwarded-Proto") == "" {
		proto := "http"
		if p.orig.TLS != nil {
			proto = "https"
		}
		req.Header.Set("X-Forwarded-Proto", proto)
	}
	if req.Header.Get("X-Forwarded-Host") == "" && p.orig.Host != "" {
		req.Header.Set("X-Forwarded-Host", p.orig.Host)
	}
	for _, name := range u.DeleteHeaders {
		req.Header.Del(name)
	}
	for name, value := range u.SetHeaders {
		req.Header.Set(name, value)
	}
	return req, nil
}

func joinPath(a, b string) string {
	switch {
	case a == "" || a == "/":
		if b == "" {
			return "/"
		}
		return b
	case b == "" || b == "/":
		return a
	case strings.HasSuffix(a, "/") && strings.HasPrefix(b, "/"):
		return a + b[1:]
	case !strings.HasSuffix(a, "/") && !strings.HasPrefix(b, "/"):
		return a + "/" + b
	}
	return a + b
}
