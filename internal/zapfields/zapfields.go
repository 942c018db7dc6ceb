// Package zapfields writes core's request log fields (core.ReportLogFields)
// as zap fields, for the adapters that log through zap (Caddy and the Envoy
// server), so their lines carry the same keys as the Traefik plugin's.
package zapfields

import (
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmhedge/llmhedge/core"
)

// Append appends fs to dst as zap fields.
func Append(dst []zap.Field, fs []core.LogField) []zap.Field {
	for i := range fs {
		f := &fs[i]
		switch f.Kind {
		case core.LogString:
			dst = append(dst, zap.String(f.Key, f.Str))
		case core.LogInt:
			dst = append(dst, zap.Int64(f.Key, f.Int))
		case core.LogBool:
			dst = append(dst, zap.Bool(f.Key, f.Bool))
		case core.LogMillis:
			dst = append(dst, zap.Float64(f.Key, f.Millis))
		case core.LogStrings:
			dst = append(dst, zap.Strings(f.Key, f.Strs))
		case core.LogObjects:
			dst = append(dst, zap.Array(f.Key, objectList(f.Objects)))
		}
	}
	return dst
}

type objectList [][]core.LogField

// MarshalLogArray implements zapcore.ArrayMarshaler.
func (l objectList) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for _, o := range l {
		if err := enc.AppendObject(object(o)); err != nil {
			return err
		}
	}
	return nil
}

type object []core.LogField

// MarshalLogObject implements zapcore.ObjectMarshaler.
func (o object) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	for _, f := range Append(nil, o) {
		f.AddTo(enc)
	}
	return nil
}
