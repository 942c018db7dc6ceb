package envoydriver

import (
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// toHeaderMap encodes headers as Envoy sends them: pseudo-headers first,
// lower-case names, one entry per value, the value in raw_value
// (mutation_utils.cc headersToProto).
func toHeaderMap(pseudo [][2]string, h http.Header) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for _, p := range pseudo {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: p[0], RawValue: []byte(p[1])})
	}
	for name, values := range h {
		for _, v := range values {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: strings.ToLower(name), RawValue: []byte(v)})
		}
	}
	return m
}

// headerValue reads raw_value, as Envoy does.
func headerValue(h *corev3.HeaderValue) string { return string(h.GetRawValue()) }

// validValue is HeaderUtility::headerValueIsValid: no CR, LF or NUL.
func validValue(v string) bool { return !strings.ContainsAny(v, "\r\n\x00") }

// validName accepts lower-case header names and pseudo-headers.
func validName(n string) bool {
	if n == "" {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 ||
			c == ':' && i == 0 {
			continue
		}
		return false
	}
	return true
}

// localHeaders reads a StreamedImmediateResponse headers_response with the
// default mutation rules (mutation_rules.cc): :status must be an integer
// >= 200, x-envoy-* and other pseudo-headers are ignored, an invalid name
// or value fails.
func localHeaders(m *corev3.HeaderMap) (int, http.Header, bool) {
	status := 0
	h := http.Header{}
	for _, hv := range m.GetHeaders() {
		name, value := hv.GetKey(), headerValue(hv)
		if !validName(name) || !validValue(value) {
			return 0, nil, false
		}
		switch {
		case name == ":status":
			n, err := strconv.Atoi(value)
			if err != nil || n < 200 || n > 999 {
				return 0, nil, false
			}
			status = n
		case strings.HasPrefix(name, ":"), strings.HasPrefix(name, "x-envoy-"):
		default:
			h.Add(name, value)
		}
	}
	if status == 0 {
		return 0, nil, false
	}
	return status, h, true
}

// applyMutation applies a header mutation with the default rules: host,
// :authority, :scheme, :method and x-envoy-* are left alone; :path may be
// set.
func applyMutation(h http.Header, path *string, mut *extprocv3.HeaderMutation) {
	for _, name := range mut.GetRemoveHeaders() {
		if !protectedHeader(name) && !strings.HasPrefix(name, ":") {
			h.Del(name)
		}
	}
	for _, opt := range mut.GetSetHeaders() {
		name, value := strings.ToLower(opt.GetHeader().GetKey()), headerValue(opt.GetHeader())
		if protectedHeader(name) || !validValue(value) {
			continue
		}
		if name == ":path" {
			*path = value
			continue
		}
		if strings.HasPrefix(name, ":") {
			continue
		}
		// The zero append_action (APPEND_IF_EXISTS_OR_ADD) means "not
		// set": Envoy then reads the append flag, false by default in
		// ext_proc mutations (mutation_utils.cc applyHeaderMutations).
		switch opt.GetAppendAction() {
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if h.Get(name) == "" {
				h.Set(name, value)
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if h.Get(name) != "" {
				h.Set(name, value)
			}
		default:
			if opt.GetAppend().GetValue() {
				h.Add(name, value)
			} else {
				h.Set(name, value)
			}
		}
	}
}

func protectedHeader(name string) bool {
	name = strings.ToLower(name)
	return name == "host" || name == ":authority" || name == ":scheme" || name == ":method" ||
		strings.HasPrefix(name, "x-envoy-")
}
