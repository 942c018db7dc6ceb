package lighttrace

import (
	"net/http"
	"strings"
	"testing"
)

// These tests use the standard library only and no select, so that `yaegi
// test` runs them interpreted, as Traefik runs the package.

const (
	clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpan  = "00f067aa0ba902b7"
	clientTP    = "00-" + clientTrace + "-" + clientSpan + "-01"
)

func TestParseTraceparent(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		ok      bool
		sampled bool
	}{
		{"valid sampled", clientTP, true, true},
		{"valid not sampled", "00-" + clientTrace + "-" + clientSpan + "-00", true, false},
		{"other flags with sampled bit", "00-" + clientTrace + "-" + clientSpan + "-03", true, true},
		{"other flags without sampled bit", "00-" + clientTrace + "-" + clientSpan + "-02", true, false},
		{"future version with more fields", "01-" + clientTrace + "-" + clientSpan + "-01-extra", true, true},
		{"future version, same length", "cc-" + clientTrace + "-" + clientSpan + "-01", true, true},
		{"version ff", "ff-" + clientTrace + "-" + clientSpan + "-01", false, false},
		{"version not hex", "0g-" + clientTrace + "-" + clientSpan + "-01", false, false},
		{"version 00 with more fields", clientTP + "-extra", false, false},
		{"future version, no dash after flags", "01-" + clientTrace + "-" + clientSpan + "-01x", false, false},
		{"all-zero trace id", "00-" + zeroTraceID + "-" + clientSpan + "-01", false, false},
		{"all-zero span id", "00-" + clientTrace + "-" + zeroSpanID + "-01", false, false},
		{"upper-case hex", "00-" + strings.ToUpper(clientTrace) + "-" + clientSpan + "-01", false, false},
		{"bad hex in trace id", "00-4bf92f3577b34da6a3ce929d0e0e473z-" + clientSpan + "-01", false, false},
		{"bad hex in span id", "00-" + clientTrace + "-00f067aa0ba902bz-01", false, false},
		{"bad hex in flags", "00-" + clientTrace + "-" + clientSpan + "-0x", false, false},
		{"short trace id", "00-" + clientTrace[:31] + "-" + clientSpan + "-01", false, false},
		{"long trace id", "00-" + clientTrace + "0-" + clientSpan + "-01", false, false},
		{"short span id", "00-" + clientTrace + "-" + clientSpan[:15] + "-01", false, false},
		{"short flags", "00-" + clientTrace + "-" + clientSpan + "-1", false, false},
		{"dashes elsewhere", "00_" + clientTrace + "-" + clientSpan + "-01", false, false},
		{"empty", "", false, false},
	}
	for _, c := range cases {
		p, ok := parseTraceparent(c.in)
		if ok != c.ok {
			t.Errorf("%s: parseTraceparent(%q) ok = %v, want %v", c.name, c.in, ok, c.ok)
			continue
		}
		if !ok {
			continue
		}
		if p.traceID != clientTrace || p.spanID != clientSpan {
			t.Errorf("%s: trace %q span %q, want %q %q", c.name, p.traceID, p.spanID, clientTrace, clientSpan)
		}
		if p.sampled != c.sampled {
			t.Errorf("%s: sampled = %v, want %v", c.name, p.sampled, c.sampled)
		}
	}
}

func TestRequestParentReadsTheHeaders(t *testing.T) {
	h := http.Header{}
	h["Traceparent"] = []string{" " + clientTP + " "}
	h["Tracestate"] = []string{"congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7"}
	p, state, ok := requestParent(h)
	if !ok || p.spanID != clientSpan {
		t.Fatalf("requestParent = %+v, %v; want the client's span %s", p, ok, clientSpan)
	}
	if state != "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7" {
		t.Errorf("tracestate %q, want both lines joined with a comma", state)
	}
	// Two traceparent headers are invalid, and so is the tracestate.
	h["Traceparent"] = []string{clientTP, clientTP}
	if _, state, ok := requestParent(h); ok || state != "" {
		t.Errorf("two traceparents: ok %v, tracestate %q; want invalid and no tracestate", ok, state)
	}
	h["Traceparent"] = []string{"00-garbage"}
	if _, state, ok := requestParent(h); ok || state != "" {
		t.Errorf("malformed traceparent: ok %v, tracestate %q; want invalid and no tracestate", ok, state)
	}
}

func TestNewIDsAreWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		id := newSpanID()
		if len(id) != 16 || !isLowerHex(id) || id == zeroSpanID {
			t.Fatalf("span id %q: want 16 lower-case hex digits, not all zero", id)
		}
		if seen[id] {
			t.Fatalf("span id %q drawn twice", id)
		}
		seen[id] = true
	}
}
