package core

// Yaegi loads this file as it does firstevent_fuzz_test.go and never runs
// the fuzz target; TestModelRewriteCannotBeBypassed and
// TestStateKeysCannotBeHidden check the same properties on fixed bodies.

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// FuzzRequestJSON checks the request-side JSON handling, for any body and
// model: scanBody rejects exactly the invalid JSON and the bodies with a
// duplicated or miscased guarded key; after a rewrite a standard decoder
// (exact or case-insensitive) sees exactly the configured model and every
// other top-level key keeps its bytes; a body that a standard decoder reads
// as storing or running in the background is judged stateful.
//
//	go test -run='^$' -fuzz=FuzzRequestJSON -fuzztime=20s ./core
func FuzzRequestJSON(f *testing.F) {
	for _, body := range []string{
		`{"model":"gpt-x","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"a","model":"b"}`,
		`{"mod\u0065l":"a","n": 1.50 }`,
		`{"MODEL":"b","messages":[{"model":"nested"}]}`,
		` { } `,
		`{}`,
		`[1,2]`,
		`"model"`,
		`{"store":true,"store":false}`,
		`{"ſtore":false,"model":"m"}`,
		`{"tools":[{"type":"m\u0063p"}],"background":true}`,
		`{"model":null,"x":{"model":1}}`,
		`{"a":1,}`,
		`{"a":1} {}`,
		`{"bacKground":true}`,
		`{"Stream":true,"model":"m"}`,
	} {
		f.Add([]byte(body), "allowed")
		f.Add([]byte(body), "we\"ird\u2028\xff")
	}
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		keys, err := scanBody(body)
		valid := json.Valid(body)
		if valid && plainJSON(body) && (err != nil || keys.store != nil || keys.background != nil || keys.tools != nil) {
			t.Fatalf("plainJSON(%q) = true, but scanBody finds %v or a state key", body, err)
		}
		ambiguous, listed := referenceGuardedProblem(body)
		switch {
		case !valid:
			if err != errInvalidJSON {
				t.Fatalf("scanBody(%q) = %v, want invalid_json", body, err)
			}
			return
		case err != nil:
			if !ambiguous {
				t.Fatalf("scanBody(%q) = %v, but no guarded key is duplicated or miscased", body, err)
			}
			return
		case ambiguous:
			t.Fatalf("scanBody(%q) accepted a duplicated or miscased guarded key", body)
		}
		if !keys.object {
			return
		}
		checkStateful(t, body, keys)
		out := rewriteAt(body, keys, model)
		checkRewritten(t, body, out, model, listed)
	})
}

// topKey is one top-level key of a JSON object and its value's bytes.
type topKey struct {
	key, raw string
}

// referenceGuardedProblem lists a valid object's top-level keys and says
// whether a guarded key is given twice or in another spelling, the way
// a test can: a decoder loop and bytes.EqualFold.
func referenceGuardedProblem(body []byte) (bool, []topKey) {
	if !json.Valid(body) || !bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{")) {
		return false, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.Token()
	var listed []topKey
	count := map[string]int{}
	ambiguous := false
	for dec.More() {
		tok, _ := dec.Token()
		key := tok.(string)
		var raw json.RawMessage
		dec.Decode(&raw)
		listed = append(listed, topKey{key, string(raw)})
		for _, g := range guardedKeys {
			if bytes.EqualFold([]byte(key), []byte(g)) {
				count[g]++
				if key != g || count[g] > 1 {
					ambiguous = true
				}
			}
		}
	}
	return ambiguous, listed
}

// checkStateful: what a standard decoder reads as "store": true or
// "background": true is judged stateful.
func checkStateful(t *testing.T, body []byte, keys *bodyKeys) {
	var doc struct {
		Store      *bool
		Background *bool
	}
	if json.Unmarshal(body, &doc) != nil {
		return // e.g. "store": "yes"; upstreams reject it
	}
	readsTrue := doc.Store != nil && *doc.Store || doc.Background != nil && *doc.Background
	if readsTrue && !keysChangeState(keys, "/v1/chat/completions") {
		t.Fatalf("body %q stores or runs in the background but was judged stateless", body)
	}
}

// checkRewritten: out is valid JSON whose model is model to an exact and
// a case-insensitive decoder, and every other top-level key is unchanged.
func checkRewritten(t *testing.T, body, out []byte, model string, before []topKey) {
	var want string
	quoted, _ := json.Marshal(model)
	json.Unmarshal(quoted, &want) // invalid UTF-8 becomes U+FFFD, as any decoder sees it
	var exact map[string]json.RawMessage
	if err := json.Unmarshal(out, &exact); err != nil {
		t.Fatalf("rewrite of %q gave invalid JSON %q: %v", body, out, err)
	}
	var got string
	if err := json.Unmarshal(exact["model"], &got); err != nil || got != want {
		t.Fatalf("rewrite of %q: model %q, want %q", body, exact["model"], want)
	}
	var folded struct{ Model string }
	if err := json.Unmarshal(out, &folded); err != nil || folded.Model != want {
		t.Fatalf("rewrite of %q: a case-insensitive decoder reads model %q, want %q", body, folded.Model, want)
	}
	if _, err := scanBody(out); err != nil {
		t.Fatalf("rewrite of %q gave %q, which scanBody rejects: %v", body, out, err)
	}
	_, after := referenceGuardedProblem(out)
	if a, b := withoutModel(before), withoutModel(after); a != b {
		t.Fatalf("rewrite of %q changed other keys:\n%s\nbecame\n%s", body, a, b)
	}
}

// withoutModel renders the keys other than model, one per line.
func withoutModel(keys []topKey) string {
	var b strings.Builder
	for _, k := range keys {
		if k.key != "model" {
			b.WriteString(k.key + "=" + k.raw + "\n")
		}
	}
	return b.String()
}
