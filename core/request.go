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
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/llmhedge/llmhedge/core/config"
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
	tenant    string // read only when tenants are capped
	streams   bool   // the body asks for a stream ("stream": true); on the fast path only looked for when early headers are on
	// bodies[i] is the body for upstream i (the model rewritten), nil: body.
	bodies [][]byte
	// checks are the validity check bits of this request (validate.go),
	// schema the one json_schema checks against.
	checks int
	schema interface{}
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
//
// Under Yaegi every call allocates the callee's whole frame and every
// selector, operator and result is a slot of its own, so the common case
// (a hedgeable JSON request without a key of the client's) runs inline
// here, with what it reads more than twice in locals, and each rare case
// in a function of its own.
func prepare(h *Hedger, r *http.Request) (*preparedRequest, error) {
	p := &preparedRequest{orig: r, hedgeable: true}
	hdr := r.Header
	// whyNotHedgeable's common case: a method configured as spelled, no
	// path prefixes, no X-LLM-Hedge header.
	if !h.methods[r.Method] || h.pathPrefixes || hdr.Get(canonicalHedge) != "" {
		notHedgeable(h, p)
	}
	var buf []byte // p.body, also in a local: a selector is a slot
	if body := r.Body; body != nil && body != http.NoBody {
		// readBody, inline.
		var err error
		buf, err = io.ReadAll(io.LimitReader(body, h.bodyReadLimit))
		if err != nil {
			return nil, bodyReadError(r, err)
		}
		p.body = buf
		if len(buf) > h.maxBody {
			bodyTooLong(p, body)
		}
	}
	// idempotencyKey, inline: a generated key (16 random bytes in hex)
	// unless the client sent one.
	if key := hdr.Get(h.keyHeader); key != "" {
		if err := clientKey(p, key); err != nil {
			return nil, err
		}
	} else {
		var random [16]byte
		_, _ = rand.Read(random[:])
		p.key = "llmhedge-" + hex.EncodeToString(random[:])
	}
	if h.requestOptions || len(hdr[canonicalValidate]) > 0 {
		if err := prepareOptions(h, p); err != nil {
			return nil, err
		}
	}
	if p.rest != nil {
		return unreadRest(h, p)
	}
	if len(bytes.TrimSpace(buf)) == 0 {
		return p, nil // no JSON to check
	}
	if h.rewritesModel {
		return checkedJSON(h, p)
	}
	// looksJSON's common case inline, the others in its call.
	if ct := hdr.Get("Content-Type"); ct != "application/json" && !looksJSON(ct) {
		return p, nil
	}
	if !plainJSON(buf) {
		return checkedJSON(h, p)
	}
	// The common case, settled by a few compiled scans: with early
	// headers on, the decoding that finds "stream" checks the JSON too.
	if h.earlyHeaders > 0 && bytes.Contains(buf, keyStream) {
		// Whether it asks for a stream (see streamProbe).
		var probe streamProbe
		if err := json.Unmarshal(buf, &probe); err == nil {
			p.streams = string(probe.Stream) == "true"
		} else if isSyntaxError(err) {
			return nil, errInvalidJSON
		}
	} else if !json.Valid(buf) {
		return nil, errInvalidJSON
	}
	// responsesPath, inline: no "store" in the body, so that API stores.
	p.stateful = !h.hedgeStored && strings.HasSuffix(strings.TrimRight(r.URL.Path, "/"), "/responses")
	return p, nil
}

// prepareOptions reads what the route's options or the client's headers
// ask of a request beyond the common case: its tenant when tenants are
// capped, its validity checks when the route or the client sets some.
// (prepare's rare branches are functions of their own: under Yaegi every
// slot of a frame is allocated on each call, taken branch or not.)
func prepareOptions(h *Hedger, p *preparedRequest) error {
	if h.tenantCaps {
		p.tenant = tenantOf(h, p.orig)
	}
	if p.hedgeable && (h.validates || len(p.orig.Header[canonicalValidate]) > 0) {
		return prepareValidation(h, p)
	}
	return nil
}

// isSyntaxError reports whether a decoding error says the JSON is
// malformed (not merely that a value did not fit its field).
func isSyntaxError(err error) bool {
	_, syntax := err.(*json.SyntaxError)
	return syntax
}

// notHedgeable records why p may not be raced, if it may not.
func notHedgeable(h *Hedger, p *preparedRequest) {
	p.why = whyNotHedgeable(h, p.orig)
	if p.why != "" {
		p.hedgeable = false
	}
}

// bodyTooLong marks p, whose body outgrew MaxBody, not hedgeable, with
// the unread rest of the client's body to forward once.
func bodyTooLong(p *preparedRequest, rest io.Reader) {
	p.rest = rest
	p.hedgeable = false
	p.why = "body over max_body"
}

// checkedJSON ends prepare for a JSON body that needs checkJSON.
func checkedJSON(h *Hedger, p *preparedRequest) (*preparedRequest, error) {
	if err := checkJSON(h, p, p.orig.URL.Path); err != nil {
		return nil, err
	}
	return p, nil
}

// tenantOf names r's tenant. (prepare's rare branches are functions of
// their own: under Yaegi every slot of a frame is allocated on each call,
// and h.cfg.Budget would copy the whole BudgetConfig into one.)
func tenantOf(h *Hedger, r *http.Request) string {
	return r.Header.Get(h.cfg.Budget.TenantHeader)
}

// unreadRest ends prepare for a body over MaxBody, forwarded once as it
// comes, unless the route rewrites the model.
func unreadRest(h *Hedger, p *preparedRequest) (*preparedRequest, error) {
	if h.rewritesModel {
		return nil, tooLargeToRewrite(h)
	}
	return p, nil
}

// checkJSON reads what prepare needs of a JSON body with scanBody: whether
// it may change state, and each upstream's body with its model set.
func checkJSON(h *Hedger, p *preparedRequest, path string) error {
	keys, err := scanBody(p.body)
	if err != nil {
		return err
	}
	p.stateful = keysChangeState(keys, path)
	if p.stateful && h.cfg.HedgeStoredResponses {
		p.stateful = changesMoreThanStore(keys)
	}
	p.streams = string(keys.stream) == "true"
	if h.rewritesModel {
		return rewriteModels(h, p, keys)
	}
	return nil
}

// tooLargeToRewrite refuses a body over MaxBody on a route that rewrites
// the model: forwarded unread, it would reach the model the operator
// replaced. (Its own function: under Yaegi prepare's frame stays small.)
func tooLargeToRewrite(h *Hedger) error {
	return &badRequest{http.StatusRequestEntityTooLarge, "request_too_large",
		"the request body is larger than " + strconv.FormatInt(int64(h.cfg.MaxBody), 10) +
			" bytes, the most this route reads to set the model"}
}

// Hedgeable reports whether r may be raced as far as the rules that need
// no body decide: the client's opt-out, the configured methods and paths.
// An adapter that hands other requests to its next handler asks it first.
func (h *Hedger) Hedgeable(r *http.Request) bool { return whyNotHedgeable(h, r) == "" }

// ForNext reports whether an adapter that can hand requests to its next
// handler (the proxy's own service, which rewrites nothing) may hand it r:
// r is not hedgeable. A client's opt-out alone does not qualify on a route
// where an upstream rewrites the model, or the client would reach its own
// model through next: that request goes to Handle, whose single unhedged
// attempt rewrites it.
func (h *Hedger) ForNext(r *http.Request) bool {
	if whyNotOnRoute(h, r) != "" {
		return true
	}
	return optedOut(r) && !h.rewritesModel
}

// whyNotHedgeable returns why r may not be raced ("" when it may): the
// client opted out, or its method or path is not configured.
func whyNotHedgeable(h *Hedger, r *http.Request) string {
	if optedOut(r) {
		return "opted out"
	}
	return whyNotOnRoute(h, r)
}

// optedOut reports whether the client sent X-LLM-Hedge: off.
func optedOut(r *http.Request) bool {
	opt := r.Header.Get(canonicalHedge) // compiled: fewer slots than indexing here
	return opt != "" && strings.EqualFold(strings.TrimSpace(opt), "off")
}

// whyNotOnRoute returns "method" or "path" when r's method or path is not
// configured for hedging, else "".
func whyNotOnRoute(h *Hedger, r *http.Request) string {
	if !h.methods[r.Method] && !methodAllowed(h, r.Method) {
		return "method"
	}
	if len(h.cfg.PathPrefixes) > 0 && !pathAllowed(h, r.URL.Path) {
		return "path"
	}
	return ""
}

// methodAllowed matches m against the configured methods ignoring case
// (h.methods has their exact spellings).
func methodAllowed(h *Hedger, m string) bool {
	for _, allowed := range h.cfg.Methods {
		if strings.EqualFold(allowed, m) {
			return true
		}
	}
	return false
}

func pathAllowed(h *Hedger, path string) bool {
	for _, prefix := range h.cfg.PathPrefixes {
		if strings.HasPrefix(path, prefix) {
			return true
		}
	}
	return false
}

// bodyReadError is the error for a client body that could not be read:
// the client's own when it left, else a bad request.
func bodyReadError(r *http.Request, err error) error {
	if cerr := r.Context().Err(); cerr != nil {
		return cerr
	}
	return &badRequest{http.StatusBadRequest, "invalid_request_body", "could not read the request body: " + err.Error()}
}

// rewriteModels prepares the body of every upstream that sets its own model.
func rewriteModels(h *Hedger, p *preparedRequest, keys *bodyKeys) error {
	if !keys.object {
		return &badRequest{http.StatusBadRequest, "invalid_json", "cannot set the model: the body is not a JSON object"}
	}
	p.bodies = make([][]byte, len(h.cfg.Upstreams))
	for i, u := range h.cfg.Upstreams {
		if u.Model != "" {
			p.bodies[i] = rewriteAt(p.body, keys, u.Model)
		}
	}
	return nil
}

// clientKey checks and adopts the client's idempotency key.
func clientKey(p *preparedRequest, key string) error {
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

// fingerprint identifies a request for idempotency conflicts: its method,
// path, query and body, each length-prefixed so that no two requests
// share an input.
func (p *preparedRequest) fingerprint() string {
	sum := sha256.New()
	orig := p.orig
	writeField(sum, orig.Method)
	writeField(sum, orig.URL.Path)
	writeField(sum, orig.URL.RawQuery)
	sum.Write(p.body)
	return hex.EncodeToString(sum.Sum(nil))
}

// idempotencyIdentity is what the idempotency table is keyed by: a SHA-256
// of the route (routeScope), the caller (callerHash) and the client's key,
// each length-prefixed; the raw key never reaches the store.
func idempotencyIdentity(h *Hedger, p *preparedRequest) string {
	sum := sha256.New()
	io.WriteString(sum, h.routeScope)
	writeField(sum, callerHash(h, p))
	writeField(sum, p.key)
	return hex.EncodeToString(sum.Sum(nil))
}

// callerHash names the caller: a SHA-256 of the values of every scope
// header, in configured order. Every value is length-prefixed and every
// header's value count written, so that no two callers share an input.
func callerHash(h *Hedger, p *preparedRequest) string {
	sum := sha256.New()
	hdr := p.orig.Header
	for _, name := range h.scopeHeaders {
		values := hdr[name]
		io.WriteString(sum, strconv.Itoa(len(values))+"#")
		for _, v := range values {
			writeField(sum, v)
		}
	}
	return hex.EncodeToString(sum.Sum(nil))
}

// routeScope is what tells a route's keyed requests from another route's
// in a shared fleet: the route's name and, for each upstream, its URL,
// model and the headers it sets (hashed with the rest: a credential never
// leaves the process). Two deployments on one Redis with the same route
// name still differ by their upstreams or credentials; two that match in
// all of these send the same request to the same place, and may share it.
func routeScope(cfg *config.Config) string {
	sum := sha256.New()
	writeField(sum, cfg.Route)
	for i := range cfg.Upstreams {
		u := &cfg.Upstreams[i]
		writeField(sum, u.URL)
		writeField(sum, u.Model)
		names := make([]string, 0, len(u.SetHeaders))
		for name := range u.SetHeaders {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			writeField(sum, name)
			writeField(sum, u.SetHeaders[name])
		}
	}
	return hex.EncodeToString(sum.Sum(nil)) + "#"
}

// writeField writes s length-prefixed.
func writeField(w io.Writer, s string) {
	io.WriteString(w, strconv.Itoa(len(s))+":"+s)
}

// KeyHash is how reports and logs name an idempotency key: the first 16
// hex digits of the SHA-256 of the key alone (not of the caller), so that
// an operator given a key can find its requests while the key itself is
// never logged.
func KeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

func looksJSON(contentType string) bool {
	if contentType == "application/json" || contentType == "" {
		return true // the common cases, without a copy
	}
	return jsonMediaType(contentType)
}

// jsonMediaType reports whether a Content-Type names JSON, in any case.
func jsonMediaType(contentType string) bool {
	return strings.Contains(strings.ToLower(contentType), "json")
}

// guardedKeys are the top-level keys of a JSON body that the engine reads
// or rewrites. Upstreams disagree with each other, and with a first-match
// reader, on a key sent twice (most decode the last), and Go decoders
// (Ollama's among them) match keys ignoring case: so each guarded key may
// appear at most once, spelled in lowercase once unescaped ("mod\u0065l"
// is "model"), or the request is rejected before any upstream sees it.
var guardedKeys = []string{"model", "stream", "store", "background", "tools", "conversation"}

// Indexes into guardedKeys.
const (
	guardModel        = 0
	guardStream       = 1
	guardStore        = 2
	guardBackground   = 3
	guardTools        = 4
	guardConversation = 5
)

// The spellings plainJSON looks for, converted once.
var (
	keyModel        = []byte(`"model"`)
	keyStream       = []byte(`"stream"`)
	keyStore        = []byte(`"store"`)
	keyBackground   = []byte(`"background"`)
	keyTools        = []byte(`"tools"`)
	keyConversation = []byte(`"conversation"`)
	longS           = []byte("\u017f") // "ſ" folds to "s"; bytes.ToLower keeps it
)

// plainJSON reports, with a few compiled scans and no decoding, that a
// body cannot hold a guarded key twice, in another case or escaped, nor a
// store, background or tools key: scanBody would then find nothing, and
// json.Valid is all the checking the body needs. A key that folds to a
// guarded one holds no escape, so it appears in the lowered body as the
// guarded key does (bytes.ToLower also maps the Kelvin sign to "k").
func plainJSON(body []byte) bool {
	if bytes.Contains(body, escapeU) || bytes.Contains(body, longS) {
		return false
	}
	lower := bytes.ToLower(body)
	if bytes.Contains(lower, keyStore) || bytes.Contains(lower, keyBackground) || bytes.Contains(lower, keyTools) ||
		bytes.Contains(lower, keyConversation) {
		return false
	}
	models := bytes.Count(body, keyModel)
	if models > 1 || bytes.Count(lower, keyModel) != models {
		return false
	}
	streams := bytes.Count(body, keyStream)
	return streams <= 1 && bytes.Count(lower, keyStream) == streams
}

// responsesPath reports whether a request goes to the OpenAI Responses API.
func responsesPath(path string) bool {
	return strings.HasSuffix(strings.TrimRight(path, "/"), "/responses")
}

// bodyKeys is what the engine reads of a JSON body: where the top-level
// "model" value is, and the raw values of the keys that may change state.
type bodyKeys struct {
	object       bool // the body is a JSON object
	open         int  // offset just past the object's opening brace
	hasModel     bool
	modelStart   int // body[modelStart:modelEnd] is the model's value
	modelEnd     int
	store        []byte // raw values, nil when absent
	background   []byte
	tools        []byte
	stream       []byte
	conversation []byte
}

var errInvalidJSON = &badRequest{http.StatusBadRequest, "invalid_json", "the request body is not valid JSON"}

// scanBody checks a JSON body and finds its guarded keys. It rejects
// invalid JSON and a guarded key that is duplicated or not in lowercase.
// The decoding is the standard library's; only the top-level loop runs
// per key, which keeps it cheap under Yaegi.
func scanBody(body []byte) (*bodyKeys, error) {
	k := &bodyKeys{}
	lead := bytes.TrimLeft(body, " \t\r\n")
	if len(lead) == 0 || lead[0] != '{' {
		if !json.Valid(body) {
			return nil, errInvalidJSON
		}
		return k, nil
	}
	k.object = true
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil {
		return nil, errInvalidJSON
	}
	k.open = int(dec.InputOffset())
	var seen [6]bool
	var raw json.RawMessage // reused: values are located by offset, not copied
	var problem error       // the first ambiguous key; invalid JSON says more
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, errInvalidJSON
		}
		key, _ := tok.(string)
		afterKey := int(dec.InputOffset())
		if err := dec.Decode(&raw); err != nil {
			return nil, errInvalidJSON
		}
		g := guardedKey(key)
		if g < 0 {
			continue
		}
		if problem == nil {
			problem = checkGuarded(key, g, seen[g])
		}
		seen[g] = true
		end := int(dec.InputOffset())
		start := valueStart(body, afterKey, end)
		keepGuarded(k, g, body, start, end)
	}
	if _, err := dec.Token(); err != nil {
		return nil, errInvalidJSON
	}
	if rest := bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return nil, errInvalidJSON
	}
	if problem != nil {
		return nil, problem
	}
	return k, nil
}

// guardedKey returns the index in guardedKeys of the key that key is, or
// is to a decoder that ignores case, or -1.
func guardedKey(key string) int {
	for i, g := range guardedKeys {
		if key == g {
			return i
		}
	}
	// A key folds to g only with as many runes as g has, each at most 3
	// bytes ("ſ" folds to "s", "K" (Kelvin) to "k").
	if len(key) < 4 || len(key) > 30 {
		return -1
	}
	for i, g := range guardedKeys {
		if strings.EqualFold(key, g) {
			return i
		}
	}
	return -1
}

// checkGuarded rejects a second or a miscased guarded key.
func checkGuarded(key string, g int, seen bool) error {
	want := guardedKeys[g]
	if key != want {
		return &badRequest{http.StatusBadRequest, "ambiguous_key",
			"the request body has the top-level key " + strconv.Quote(key) + "; spell it " + strconv.Quote(want)}
	}
	if seen {
		return &badRequest{http.StatusBadRequest, "duplicate_key",
			"the request body has the top-level key " + strconv.Quote(want) + " more than once"}
	}
	return nil
}

// valueStart skips the colon and blanks between a key and its value.
func valueStart(body []byte, i, end int) int {
	for i < end && (body[i] == ':' || body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r') {
		i++
	}
	return i
}

// keepGuarded records where guarded key g's value is.
func keepGuarded(k *bodyKeys, g int, body []byte, start, end int) {
	switch g {
	case guardModel:
		k.hasModel = true
		k.modelStart = start
		k.modelEnd = end
	case guardStore:
		k.store = body[start:end]
	case guardBackground:
		k.background = body[start:end]
	case guardTools:
		k.tools = body[start:end]
	case guardStream:
		k.stream = body[start:end]
	case guardConversation:
		k.conversation = body[start:end]
	}
}

// mayChangeState reports whether a JSON request body may change state
// upstream (see keysChangeState); false for a body scanBody rejects.
func mayChangeState(body []byte, path string) bool {
	keys, err := scanBody(body)
	if err != nil {
		return false
	}
	return keysChangeState(keys, path)
}

// keysChangeState reports whether a request may change state upstream, so
// that sending it twice is unsafe without an idempotency key:
// "store": true, "background": true, a Responses API call without
// "store": false (the API stores by default), or server-side tools that act
// (MCP, code interpreter, computer use, shell).
func keysChangeState(k *bodyKeys, path string) bool {
	if !k.object {
		return false
	}
	if string(k.store) == "true" || string(k.background) == "true" || k.conversation != nil && string(k.conversation) != "null" {
		return true
	}
	if string(k.store) != "false" && responsesPath(path) {
		return true
	}
	return k.tools != nil && toolsMayAct(k.tools)
}

// Tool types that act on the provider's side, as JSON strings.
var actingTools = [][]byte{[]byte(`"mcp"`), []byte(`"code_interpreter"`), []byte(`"local_shell"`),
	[]byte(`"shell"`), []byte(`"apply_patch"`), []byte(`"computer_use`)}

var escapeU = []byte(`\u`)

// toolsMayAct reports whether a tools value names a tool type that acts.
// Conservatively, any string in it that is such a type counts, wherever it
// stands: a tool's "type" might be given twice or in another case, and
// upstreams would not agree on which one holds.
func toolsMayAct(tools []byte) bool {
	for _, name := range actingTools {
		if bytes.Contains(tools, name) {
			return true
		}
	}
	if !bytes.Contains(tools, escapeU) {
		return false
	}
	return escapedToolsMayAct(tools) // rare: read every string unescaped
}

// escapedToolsMayAct is toolsMayAct for a value with \u escapes.
func escapedToolsMayAct(tools []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(tools))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		s, ok := tok.(string)
		if !ok {
			continue
		}
		if s == "mcp" || s == "code_interpreter" || s == "local_shell" || s == "shell" || s == "apply_patch" ||
			strings.HasPrefix(s, "computer_use") {
			return true
		}
	}
}

// rewriteModel sets the top-level "model" of a JSON object, keeping every
// other byte as it was (no re-encoding, so numbers and key order survive).
// It fails on what scanBody rejects and on a body that is not an object.
func rewriteModel(body []byte, model string) ([]byte, error) {
	keys, err := scanBody(body)
	if err != nil {
		return nil, err
	}
	if !keys.object {
		return nil, errors.New("the body is not a JSON object")
	}
	return rewriteAt(body, keys, model), nil
}

// rewriteAt returns body with model as its top-level "model" value, the
// key's place found by scanBody.
func rewriteAt(body []byte, k *bodyKeys, model string) []byte {
	quoted, _ := json.Marshal(model)
	if k.hasModel {
		out := make([]byte, 0, len(body)+len(quoted))
		out = append(out, body[:k.modelStart]...)
		out = append(out, quoted...)
		return append(out, body[k.modelEnd:]...)
	}
	open := k.open
	out := make([]byte, 0, len(body)+len(quoted)+10)
	out = append(out, body[:open]...)
	out = append(out, `"model":`...)
	out = append(out, quoted...)
	rest := bytes.TrimLeft(body[open:], " \t\r\n")
	if len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, body[open:]...)
}

// hopHeaders are connection-level and never forwarded (RFC 9110 §7.6.1),
// in canonical form: they are deleted from the map directly, which under
// Yaegi is far cheaper than a call to Header.Del.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// Canonical forms of the header names the engine sets or removes on every
// attempt, for the same reason.
var (
	canonicalHedge   = http.CanonicalHeaderKey(HeaderHedge)
	canonicalAttempt = http.CanonicalHeaderKey(HeaderAttempt)
)

// removeHopHeaders deletes the hop-by-hop headers from h, and those its
// Connection header names. One delete per name rather than a loop over
// hopHeaders: under Yaegi each
// iteration of a loop costs several interpreted steps, and this runs twice
// per request. TestRemoveHopHeadersMatchesList keeps the two the same.
func removeHopHeaders(h http.Header) {
	if conn := h["Connection"]; len(conn) > 0 {
		removeConnectionOptions(h, conn)
	}
	delete(h, "Connection")
	delete(h, "Proxy-Connection")
	delete(h, "Keep-Alive")
	delete(h, "Proxy-Authenticate")
	delete(h, "Proxy-Authorization")
	delete(h, "Te")
	delete(h, "Trailer")
	delete(h, "Transfer-Encoding")
	delete(h, "Upgrade")
}

// removeConnectionOptions deletes the headers a Connection header names.
func removeConnectionOptions(h http.Header, conn []string) {
	for _, v := range conn {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
}

// joinQuery puts the upstream URL's own query (e.g. Azure's api-version, a
// provider key) before the client's, as httputil.ReverseProxy does.
func joinQuery(upstream, client string) string {
	if upstream == "" {
		return client
	}
	if client == "" {
		return upstream
	}
	return upstream + "&" + client
}

// attemptRequest builds attempt `index`'s request to upstream `up`.
func attemptRequest(h *Hedger, ctx context.Context, p *preparedRequest, up, index int) (*http.Request, error) {
	// Under Yaegi every field selector takes a frame slot of its own, so
	// chains used more than once are read once into locals.
	orig := p.orig
	client := orig.URL
	plain := h.plainBase[up]
	target := *h.bases[up] // RawPath is base's: "" unless setEscapedPath sets it
	if plain && client.RawPath == "" && client.Path != "" {
		target.Path = client.Path
		target.RawQuery = client.RawQuery
	} else {
		setTargetURL(h, &target, client, up)
	}
	// NewRequestWithContext takes the length of a bytes.Reader's body
	// itself; attemptBody's other bodies set it after.
	var body io.Reader = http.NoBody
	if p.rest != nil || p.bodies != nil {
		body = attemptBody(p, up)
	} else if len(p.body) > 0 {
		body = bytes.NewReader(p.body)
	}
	req, err := http.NewRequestWithContext(ctx, orig.Method, target.String(), body)
	if err != nil {
		return nil, err
	}
	if p.rest != nil {
		setUnreadLength(req, p)
	}
	hdr := orig.Header.Clone()
	if hdr == nil {
		hdr = make(http.Header)
	}
	req.Header = hdr
	removeHopHeaders(hdr)
	delete(hdr, canonicalHedge)
	delete(hdr, canonicalValidate)
	delete(hdr, "Content-Length")
	// The engine must read first events as plain text; the transport asks
	// for gzip itself and undoes it.
	delete(hdr, "Accept-Encoding")
	hdr[h.keyHeader] = []string{p.key}
	hdr[canonicalAttempt] = []string{strconv.Itoa(index)}
	// The X-Forwarded-* headers a reverse proxy sets, inline: under Yaegi
	// a call allocates the callee's whole frame. (hdr.Get is a compiled
	// call: it costs fewer frame slots than indexing the values here.)
	if ip, _, err := net.SplitHostPort(orig.RemoteAddr); err == nil {
		if prior := hdr.Get("X-Forwarded-For"); prior != "" {
			ip = prior + ", " + ip
		}
		hdr["X-Forwarded-For"] = []string{ip}
	}
	if hdr.Get("X-Forwarded-Proto") == "" || hdr.Get("X-Forwarded-Host") == "" {
		setForwardedOrigin(hdr, orig) // a proxy in front (Traefik) has set both
	}
	if !plain {
		editHeaders(h, hdr, up)
	}
	return req, nil
}

// setTargetURL sets the path and query of target, a copy of upstream up's
// URL, for the client's URL: the upstream's path joined with the client's
// (in their escaped forms when either has one), the upstream's query
// before the client's. (attemptRequest's long way, for an upstream that is
// not plainBase: its own function, as under Yaegi every slot of a frame is
// allocated on each call.)
func setTargetURL(h *Hedger, target, client *url.URL, up int) {
	base := h.bases[up]
	path := client.Path
	if client.RawPath != "" || base.RawPath != "" {
		setEscapedPath(h, target, client, up)
	} else if h.rootBase[up] && path != "" {
		target.Path = path
	} else {
		target.Path = joinPath(base.Path, path)
	}
	target.RawQuery = joinQuery(base.RawQuery, client.RawQuery)
}

// attemptBody returns the body an attempt to upstream up sends when the
// client's body is not simply p.body: the buffered prefix and the unread
// rest (its length is setUnreadLength's), or the body with upstream up's
// model.
func attemptBody(p *preparedRequest, up int) io.Reader {
	var r io.Reader = http.NoBody
	switch {
	case p.rest != nil:
		r = io.MultiReader(bytes.NewReader(p.body), p.rest)
	case p.bodies != nil && p.bodies[up] != nil:
		r = bytes.NewReader(p.bodies[up])
	case len(p.body) > 0:
		r = bytes.NewReader(p.body)
	}
	return r
}

// setUnreadLength sets the length of an attempt that forwards the client's
// body as it comes (p.rest): the client's own, -1 when unknown.
func setUnreadLength(req *http.Request, p *preparedRequest) {
	req.ContentLength = p.orig.ContentLength
	if req.ContentLength < 0 {
		req.ContentLength = -1
	}
}

// setForwardedOrigin sets X-Forwarded-Proto and X-Forwarded-Host when
// missing.
func setForwardedOrigin(hdr http.Header, orig *http.Request) {
	if hdr.Get("X-Forwarded-Proto") == "" {
		proto := "http"
		if orig.TLS != nil {
			proto = "https"
		}
		hdr["X-Forwarded-Proto"] = []string{proto}
	}
	if hdr.Get("X-Forwarded-Host") == "" && orig.Host != "" {
		hdr["X-Forwarded-Host"] = []string{orig.Host}
	}
}

// editHeaders applies upstream up's configured header changes.
func editHeaders(h *Hedger, hdr http.Header, up int) {
	u := &h.cfg.Upstreams[up]
	for _, name := range u.DeleteHeaders {
		hdr.Del(name)
	}
	for name, value := range u.SetHeaders {
		hdr.Set(name, value)
	}
}

// setEscapedPath sets target's path to upstream up's joined with the client's
// when either is not in its default encoding (a RawPath is set, e.g. for
// %2F): joined from the escaped forms, so that the upstream gets the
// client's encoding and not a "/" where it sent %2F.
func setEscapedPath(h *Hedger, target, client *url.URL, up int) {
	base := h.bases[up]
	raw := client.EscapedPath()
	if !h.rootBase[up] || raw == "" {
		raw = joinPath(base.EscapedPath(), raw)
	}
	path, err := url.PathUnescape(raw)
	if err != nil {
		// Not reached: both parts are valid escapes.
		target.Path = joinPath(base.Path, client.Path)
		target.RawPath = ""
		return
	}
	target.Path = path
	target.RawPath = raw
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
