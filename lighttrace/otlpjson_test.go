package lighttrace

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
)

// attrRewriter's patterns name core's kinds by number.
func TestLogFieldKindsAreTheRewritersOwn(t *testing.T) {
	for _, k := range []struct {
		name      string
		got, want int
	}{{"LogString", core.LogString, 0}, {"LogInt", core.LogInt, 1}, {"LogBool", core.LogBool, 2}, {"LogMillis", core.LogMillis, 3}} {
		if k.got != k.want {
			t.Errorf("core.%s = %d, attrRewriter's patterns say %d", k.name, k.got, k.want)
		}
	}
}

// decodedBody is a post's body as generic JSON, failing t when it is not
// JSON.
func decodedBody(t *testing.T, body string) map[string]interface{} {
	t.Helper()
	var v map[string]interface{}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("body is not JSON: %v: %s", err, body)
	}
	return v
}

// The rewritten encoding is the hand-written one, for every kind and for
// strings that need escaping.
func TestRewrittenAttributesEqualHandWritten(t *testing.T) {
	r := hedgedReport(time.Now())
	r.Denials = nil // a string list is always written by hand
	r.Route = "r\"quoted\\\n\t<&>é\x01"
	batch := []span{{traceID: clientTrace, spanID: clientSpan, start: r.Start, data: core.SpanOf(r)}}
	for i := range r.Attempts {
		batch = append(batch, span{traceID: clientTrace, spanID: newSpanID(), parentID: clientSpan, start: r.Start, data: core.AttemptSpanOf(r, i)})
	}
	fast := encodeBatch("svc", batch)
	if strings.Contains(fast, `"Kind":`) {
		t.Fatalf("the batch was not rewritten: %s", fast)
	}
	slow := string(appendBatch("svc", batch, false))
	if f, s := decodedBody(t, fast), decodedBody(t, slow); !reflect.DeepEqual(f, s) {
		t.Fatalf("rewritten and hand-written bodies differ:\nrewritten:    %s\nhand-written: %s", fast, slow)
	}
	spans, _, _ := otlpSpans(t, decodedBody(t, fast))
	if got := attrs(t, spans[0])["llmhedge.route"]["stringValue"]; got != r.Route {
		t.Errorf("route %q came back as %q", r.Route, got)
	}
}

// A field that sets another kind's member, or a double JSON cannot
// hold, is still encoded right: by hand.
func TestOddFieldsAreWrittenByHand(t *testing.T) {
	odd := []core.LogField{
		{Key: "a", Kind: core.LogString, Str: "x", Int: 7}, // a stray member
		{Key: "b", Kind: core.LogMillis, Millis: math.NaN()},
		{Key: "c", Kind: core.LogStrings, Strs: []string{"p", "q"}},
		{Key: "d", Kind: core.LogInt, Int: -3},
	}
	for i, fields := range [][]core.LogField{odd[:1], odd[1:2], odd[2:3], odd} {
		batch := []span{{traceID: clientTrace, spanID: clientSpan, start: time.Now(),
			data: core.SpanData{Name: core.SpanRequest, Kind: core.SpanKindInternal, End: time.Now(), Attributes: fields}}}
		body := encodeBatch("svc", batch)
		spans, _, _ := otlpSpans(t, decodedBody(t, body))
		got := attrs(t, spans[0])
		for _, f := range fields {
			var want map[string]interface{}
			switch f.Key {
			case "a":
				want = map[string]interface{}{"stringValue": "x"}
			case "b":
				want = map[string]interface{}{"stringValue": "NaN"}
			case "c":
				want = map[string]interface{}{"arrayValue": map[string]interface{}{"values": []interface{}{
					map[string]interface{}{"stringValue": "p"}, map[string]interface{}{"stringValue": "q"}}}}
			case "d":
				want = map[string]interface{}{"intValue": "-3"}
			}
			if !reflect.DeepEqual(got[f.Key], want) {
				t.Errorf("case %d: attribute %s = %v, want %v; body %s", i, f.Key, got[f.Key], want, body)
			}
		}
	}
}
