package envoyfilter

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http/httpguts"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// requestHead is what the request_headers message says about the request.
type requestHead struct {
	method    string
	path      string // :path, with the query
	authority string
	scheme    string
	header    http.Header
	// noBody: Envoy set end_of_stream on the headers, no body follows.
	noBody bool
}

// headerValue returns a header's value. Envoy sends values in raw_value
// (runtime flag envoy.reloadable_features.send_header_raw_value, on by
// default: mutation_utils.cc headersToProto); value is read only when
// raw_value is empty, for older data planes.
func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// parseRequestHead reads a request_headers message. :method is required;
// :path may be missing (CONNECT) or not start with / (OPTIONS *): such a
// request is no route's (originForm). Header names and values are checked
// because they go into upstream requests.
func parseRequestHead(msg *extprocv3.HttpHeaders) (*requestHead, error) {
	head := &requestHead{header: make(http.Header), noBody: msg.GetEndOfStream()}
	for _, h := range msg.GetHeaders().GetHeaders() {
		key, value := h.GetKey(), headerValue(h)
		if !validFieldValue(value) {
			return nil, fmt.Errorf("header %q has a control character in its value", key)
		}
		if strings.HasPrefix(key, ":") {
			switch key {
			case ":method":
				head.method = value
			case ":path":
				head.path = value
			case ":authority":
				head.authority = value
			case ":scheme":
				head.scheme = value
			}
			// Other pseudo-headers (:protocol) do not describe a request
			// we could hedge; they are ignored.
			continue
		}
		if !httpguts.ValidHeaderFieldName(key) {
			return nil, fmt.Errorf("header name %q is not a valid token", key)
		}
		head.header.Add(key, value)
	}
	switch {
	case head.method == "":
		return nil, fmt.Errorf("request_headers has no :method")
	case !httpguts.ValidHeaderFieldName(head.method):
		return nil, fmt.Errorf(":method %q is not a valid token", head.method)
	}
	if head.authority == "" {
		head.authority = head.header.Get("Host")
	}
	return head, nil
}

// originForm reports whether :path is an origin-form target ("/..."), the
// only kind a route can hedge. CONNECT has no :path and OPTIONS * has "*":
// those requests continue through Envoy untouched, whatever the routes say.
func (h *requestHead) originForm() bool { return strings.HasPrefix(h.path, "/") }

// pathOnly returns :path without its query.
func (h *requestHead) pathOnly() string {
	p, _, _ := strings.Cut(h.path, "?")
	return p
}

// newRequest builds the *http.Request core hedges, once per stream: the
// request takes h's header map over. Envoy's own x-envoy-* headers stay
// behind: they steer Envoy, and an upstream LLM API has no use for them.
func (h *requestHead) newRequest(body io.ReadCloser) (*http.Request, error) {
	u, err := url.ParseRequestURI(h.path)
	if err != nil || !strings.HasPrefix(h.path, "/") {
		return nil, fmt.Errorf(":path %q is not an origin-form request target", h.path)
	}
	scheme := h.scheme
	if scheme == "" {
		scheme = "http"
	}
	u.Scheme, u.Host = scheme, h.authority
	r := &http.Request{
		Method:     h.method,
		URL:        u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     h.header,
		Host:       h.authority,
		RequestURI: h.path,
	}
	for name := range r.Header {
		// Names are canonical (Header.Add): compare without a lower-cased copy.
		if len(name) >= len("x-envoy-") && strings.EqualFold(name[:len("x-envoy-")], "x-envoy-") {
			delete(r.Header, name)
		}
	}
	r.ContentLength = -1
	if cl := r.Header.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 {
			r.ContentLength = n
		}
	}
	if h.noBody || body == nil {
		r.Body, r.ContentLength = http.NoBody, 0
	} else {
		r.Body = body
	}
	return r, nil
}

// responseHeaderSkipped lists response headers that never go back to Envoy:
// hop-by-hop fields (RFC 9110 §7.6.1), which a local reply must not carry,
// and content-length, which Envoy computes for an ImmediateResponse and
// which a streamed answer does not know.
var responseHeaderSkipped = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true, "transfer-encoding": true,
	"upgrade": true, "te": true, "trailer": true, "content-length": true,
}

// forEachResponseHeader calls f for every header of h that may go to Envoy,
// with a lower-case name. x-envoy-* names are dropped: Envoy's mutation
// checker ignores them by default (mutation_rules.cc), so sending them only
// raises its rejected-mutation counter. Values Envoy would reject (control
// characters) are dropped too.
func forEachResponseHeader(h http.Header, f func(name, value string)) {
	for name, values := range h {
		lower := strings.ToLower(name)
		if responseHeaderSkipped[lower] || strings.HasPrefix(lower, "x-envoy-") || !httpguts.ValidHeaderFieldName(lower) {
			continue
		}
		for _, v := range values {
			if validFieldValue(v) {
				f(lower, v)
			}
		}
	}
}

// streamedHeaders is the headers_response of a StreamedImmediateResponse:
// the integer :status (>= 200, checked by Envoy's mutation checker,
// mutation_rules.cc isValidValue) and the answer's headers, values in
// raw_value.
func streamedHeaders(status int, h http.Header) *corev3.HeaderMap {
	m := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(status))}}}
	forEachResponseHeader(h, func(name, value string) {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: name, RawValue: []byte(value)})
	})
	return m
}

// immediateHeaders is the header mutation of an ImmediateResponse. The
// first value of a name overwrites Envoy's default (content-type is
// text/plain for a local reply); later values are appended. Envoy reads
// append_action only when it is not the zero value (APPEND_IF_EXISTS_OR_ADD)
// and otherwise the append flag, which defaults to false in ext_proc
// mutations (mutation_utils.cc applyHeaderMutations): so an appended value
// sets the flag, and an overwrite names its non-zero action.
func immediateHeaders(h http.Header) *extprocv3.HeaderMutation {
	m := &extprocv3.HeaderMutation{}
	seen := map[string]bool{}
	forEachResponseHeader(h, func(name, value string) {
		opt := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: name, RawValue: []byte(value)}}
		if seen[name] {
			opt.Append = wrapperspb.Bool(true)
		} else {
			opt.AppendAction = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		}
		seen[name] = true
		m.SetHeaders = append(m.SetHeaders, opt)
	})
	return m
}

// validFieldValue reports whether v may be a header value: no CR, LF or
// NUL (Envoy's HeaderUtility::headerValueIsValid rejects them too).
func validFieldValue(v string) bool { return !strings.ContainsAny(v, "\r\n\x00") }
