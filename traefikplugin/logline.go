package traefikplugin

import (
	"encoding/json"
	"io"
	"strconv"

	"github.com/llmhedge/llmhedge/core"
)

// Traefik gives plugins no metrics registry, so each request is reported as
// one JSON line (and, with metricsPath, counted in metrics.go). Under
// Traefik the plugin's stdout and stderr are Traefik's own logger (DEBUG and
// ERROR level), which adds time and level.
//
// The line is {"msg":"llmhedge request","middleware":<name>, ...} followed
// by core.ReportLogFields, the keys Caddy and the Envoy server write too.
// Credentials never appear (upstreams are named, not their headers), nor
// idempotency keys (only their hash).

// logObserver writes one line per request to out.
type logObserver struct {
	middleware string
	out        io.Writer
}

// Observe implements core.Observer.
func (o *logObserver) Observe(r *core.Report) {
	b := make([]byte, 0, 512)
	b = append(b, `{"msg":"llmhedge request","middleware":`...)
	b = appendJSONString(b, o.middleware)
	b = appendLogFields(b, core.ReportLogFields(r))
	b = append(b, '}', '\n')
	// One Write per line: Traefik's logger turns each Write into one entry.
	o.out.Write(b)
}

// appendLogFields appends ,"key":value for every field of fs, in order.
func appendLogFields(b []byte, fs []core.LogField) []byte {
	for i := range fs {
		f := &fs[i]
		b = append(b, ',')
		b = appendJSONString(b, f.Key)
		b = append(b, ':')
		switch f.Kind {
		case core.LogString:
			b = appendJSONString(b, f.Str)
		case core.LogInt:
			b = strconv.AppendInt(b, f.Int, 10)
		case core.LogBool:
			b = strconv.AppendBool(b, f.Bool)
		case core.LogMillis:
			b = strconv.AppendFloat(b, f.Millis, 'f', -1, 64)
		case core.LogStrings:
			b = append(b, '[')
			for j, s := range f.Strs {
				if j > 0 {
					b = append(b, ',')
				}
				b = appendJSONString(b, s)
			}
			b = append(b, ']')
		case core.LogObjects:
			b = append(b, '[')
			for j, o := range f.Objects {
				if j > 0 {
					b = append(b, ',')
				}
				// The object's first field must not take a comma.
				inner := appendLogFields(make([]byte, 0, 128), o)
				b = append(b, '{')
				if len(inner) > 0 {
					b = append(b, inner[1:]...)
				}
				b = append(b, '}')
			}
			b = append(b, ']')
		default:
			b = append(b, "null"...)
		}
	}
	return b
}

// appendJSONString appends s as a JSON string (encoding/json's escaping).
func appendJSONString(b []byte, s string) []byte {
	q, err := json.Marshal(s)
	if err != nil {
		return append(b, `""`...)
	}
	return append(b, q...)
}
