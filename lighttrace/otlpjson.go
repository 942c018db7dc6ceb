package lighttrace

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/llmhedge/llmhedge/core"
)

// OTLP/HTTP's JSON encoding of an ExportTraceServiceRequest
// (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding):
// lowerCamelCase keys, trace and span ids as hex strings, 64-bit integers
// (times, intValue) as decimal strings, enums as integers.
//
// Under Yaegi every interpreted statement costs: appending one string
// about 0.5 µs and 5 allocations, a call several times that. Filling
// OTLP structs for encoding/json, attribute by attribute, cost about 180
// µs and 900 allocations per span, and so did writing each attribute
// with appends (appendAttributes). So the common span's attributes are
// encoded by compiled code: encoding/json marshals the []core.LogField
// as it is ({"Key":..,"Kind":..,"Str":..,"Int":..,...}), and one
// strings.Replacer over the whole batch rewrites each field into OTLP's
// KeyValue by its kind (attrRewriter). The rewrite relies on what the
// engine's fields hold: a field sets its kind's member only (core's
// stringField, intField, ...). A batch where a field breaks that keeps
// one of the Go names, which encodeBatch looks for; it is then encoded
// again by appendAttributes. Spans with a string list or objects (rare:
// a request's denials) are written by appendAttributes from the start.

// ScopeName is the instrumentation scope of every span.
const ScopeName = "llmhedge"

// jsonEscapes are the bytes a JSON string must escape.
const jsonEscapes = "\"\\\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f" +
	"\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f"

// attrRewriter turns encoding/json's form of a core.LogField into an OTLP
// KeyValue. Its kinds' numbers are core's LogString (0), LogInt (1),
// LogBool (2) and LogMillis (3), pinned by TestLogFieldKindsAreTheRewritersOwn.
// A pattern cannot match inside a string value: there every quote is
// escaped, and each pattern has an unescaped one after its first byte.
var attrRewriter = strings.NewReplacer(
	`{"Key":`, `{"key":`,
	// A string: its tail holds the other members' zero values.
	`,"Kind":0,"Str":`, `,"value":{"stringValue":`,
	`,"Int":0,"Bool":false,"Millis":0,"Strs":null,"Objects":null}`, `}}`,
	// An integer, as a decimal string.
	`,"Kind":1,"Str":"","Int":`, `,"value":{"intValue":"`,
	`,"Bool":false,"Millis":0,"Strs":null,"Objects":null}`, `"}}`,
	`,"Kind":2,"Str":"","Int":0,"Bool":`, `,"value":{"boolValue":`,
	`,"Millis":0,"Strs":null,"Objects":null}`, `}}`,
	`,"Kind":3,"Str":"","Int":0,"Bool":false,"Millis":`, `,"value":{"doubleValue":`,
	`,"Strs":null,"Objects":null}`, `}}`,
)

// goNames are the Go member names that no rewritten attribute keeps.
var goNames = []string{`"Key":`, `"Kind":`, `"Str":`, `"Int":`, `"Bool":`, `"Millis":`, `"Strs":`, `"Objects":`}

// Marshalled members that send a span's attributes to appendAttributes.
var (
	listMember   = []byte(`"Strs":[`)
	objectMember = []byte(`"Objects":[`)
)

// encodeBatch is the JSON body of one post: the batch's spans under one
// resource (service.name) and the scope ScopeName.
func encodeBatch(service string, batch []span) string {
	body := attrRewriter.Replace(string(appendBatch(service, batch, true)))
	for _, name := range goNames {
		if strings.Contains(body, name) {
			// A field the rewrite does not know: every attribute by hand.
			return string(appendBatch(service, batch, false))
		}
	}
	return body
}

// appendBatch writes the batch; with rewrite, attributes in encoding/json's
// form for attrRewriter where it can, else in OTLP's.
func appendBatch(service string, batch []span, rewrite bool) []byte {
	b := make([]byte, 0, 256+2048*len(batch))
	b = append(b, `{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":`...)
	b = appendString(b, service)
	b = append(b, `}}]},"scopeSpans":[{"scope":{"name":"`+ScopeName+`"},"spans":[`...)
	for i := range batch {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendSpan(b, &batch[i], rewrite)
	}
	b = append(b, "]}]}]}"...)
	return b
}

// appendSpan appends one span. Ids are hex the tracer made; times are
// decimal strings; a failed span gets status code 2 (STATUS_CODE_ERROR)
// and its message, another none (unset).
func appendSpan(b []byte, s *span, rewrite bool) []byte {
	d := &s.data
	b = append(b, `{"traceId":"`...)
	b = append(b, s.traceID...)
	b = append(b, `","spanId":"`...)
	b = append(b, s.spanID...)
	if s.parentID != "" {
		b = append(b, `","parentSpanId":"`...)
		b = append(b, s.parentID...)
	}
	b = append(b, `","name":`...)
	b = appendString(b, d.Name)
	b = append(b, `,"kind":`...)
	b = strconv.AppendInt(b, int64(d.Kind), 10)
	b = append(b, `,"startTimeUnixNano":"`...)
	b = strconv.AppendInt(b, s.start.UnixNano(), 10)
	b = append(b, `","endTimeUnixNano":"`...)
	b = strconv.AppendInt(b, d.End.UnixNano(), 10)
	b = append(b, `","attributes":`...)
	attrs := d.Attributes
	marshalled := false
	if rewrite {
		m, err := json.Marshal(attrs) // fails on a NaN or infinite double
		if err == nil && !bytes.Contains(m, listMember) && !bytes.Contains(m, objectMember) {
			b = append(b, m...)
			marshalled = true
		}
	}
	if !marshalled {
		b = append(b, '[')
		b = appendAttributes(b, attrs)
		b = append(b, ']')
	}
	if d.Failed {
		b = append(b, `,"status":{"code":2,"message":`...)
		b = appendString(b, d.ErrorMessage)
		b = append(b, '}')
	}
	b = append(b, '}')
	return b
}

// appendAttributes appends attrs as OTLP KeyValues, each by its kind:
// stringValue, intValue (a decimal string), boolValue, doubleValue, a
// string list as arrayValue. Objects (the log line's attempt list) are
// left out: attempts are spans of their own. The loop calls no
// interpreted function for the common kinds: under Yaegi each call
// allocates its whole frame, which cost more than the rest of the loop.
func appendAttributes(b []byte, attrs []core.LogField) []byte {
	n := 0
	for i := range attrs {
		f := &attrs[i]
		kind := f.Kind
		if kind == core.LogObjects {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		key := f.Key
		if strings.ContainsAny(key, jsonEscapes) || !utf8.ValidString(key) {
			b = append(b, `{"key":`...)
			b = appendQuoted(b, key)
			b = append(b, `,"value":{`...)
		} else {
			b = append(b, `{"key":"`...)
			b = append(b, key...)
			b = append(b, `","value":{`...)
		}
		switch kind {
		case core.LogString:
			v := f.Str
			if strings.ContainsAny(v, jsonEscapes) || !utf8.ValidString(v) {
				b = append(b, `"stringValue":`...)
				b = appendQuoted(b, v)
			} else {
				b = append(b, `"stringValue":"`...)
				b = append(b, v...)
				b = append(b, '"')
			}
		case core.LogInt:
			b = append(b, `"intValue":"`...)
			b = strconv.AppendInt(b, f.Int, 10)
			b = append(b, '"')
		case core.LogBool:
			if f.Bool {
				b = append(b, `"boolValue":true`...)
			} else {
				b = append(b, `"boolValue":false`...)
			}
		case core.LogMillis:
			v := f.Millis
			if math.IsNaN(v) || math.IsInf(v, 0) {
				b = appendNonFinite(b, v)
			} else {
				b = append(b, `"doubleValue":`...)
				b = strconv.AppendFloat(b, v, 'g', -1, 64)
			}
		case core.LogStrings:
			b = appendStrings(b, f.Strs)
		}
		b = append(b, "}}"...)
	}
	return b
}

// appendNonFinite appends NaN or an infinity, which JSON numbers cannot
// be, as a stringValue.
func appendNonFinite(b []byte, v float64) []byte {
	b = append(b, `"stringValue":"`...)
	b = strconv.AppendFloat(b, v, 'g', -1, 64)
	return append(b, '"')
}

// appendStrings appends an arrayValue of strings.
func appendStrings(b []byte, strs []string) []byte {
	b = append(b, `"arrayValue":{"values":[`...)
	for i, s := range strs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"stringValue":`...)
		b = appendString(b, s)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// appendString appends s as a JSON string: as it is when it is valid
// UTF-8 with nothing to escape (two compiled checks), else as
// encoding/json writes it.
func appendString(b []byte, s string) []byte {
	if strings.ContainsAny(s, jsonEscapes) || !utf8.ValidString(s) {
		return appendQuoted(b, s)
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendQuoted appends s as encoding/json quotes it (invalid UTF-8
// becomes U+FFFD).
func appendQuoted(b []byte, s string) []byte {
	q, _ := json.Marshal(s)
	return append(b, q...)
}
