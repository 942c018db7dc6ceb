package stream

import (
	"encoding/json"
	"strings"
	"testing"
)

// Each keyword of the subset, passing and failing; a failure names the path
// and the wrong value.
func TestSchemaSubset(t *testing.T) {
	person := `{"type":"object","required":["name","age"],"additionalProperties":false,
		"properties":{"name":{"type":"string"},"age":{"type":"integer"},
		"tags":{"type":"array","items":{"type":"string","enum":["a","b"]}},
		"kind":{"anyOf":[{"type":"null"},{"const":"x"}]},
		"extra":{"type":["string","number"]}}}`
	cases := []struct {
		name, schema, value, want string // want "" passes, else a substring of the message
	}{
		{"valid", person, `{"name":"Ada","age":36,"tags":["a"],"kind":null,"extra":2}`, ""},
		{"integer written 1.0", person, `{"name":"Ada","age":36.0}`, ""},
		{"wrong type", person, `{"name":"Ada","age":"36"}`, `$.age: got string "36", want integer`},
		{"fraction is no integer", person, `{"name":"Ada","age":36.5}`, `$.age: got number 36.5, want integer`},
		{"missing required", person, `{"name":"Ada"}`, `$: required property "age" is missing`},
		{"additional property", person, `{"name":"Ada","age":1,"zz":1}`, `property "zz" is not allowed`},
		{"enum in items", person, `{"name":"Ada","age":1,"tags":["a","c"]}`, `$.tags[1]: got string "c", want one of string "a", string "b"`},
		{"anyOf", person, `{"name":"Ada","age":1,"kind":"y"}`, `$.kind: matches none of anyOf's 2 schemas`},
		{"type list", person, `{"name":"Ada","age":1,"extra":true}`, `$.extra: got boolean true, want string or number`},
		{"top-level type", person, `[1]`, `$: got array of 1, want object`},
		{"additionalProperties schema", `{"type":"object","additionalProperties":{"type":"number"}}`, `{"a":1,"b":"x"}`, `$.b: got string "x", want number`},
		{"false schema", `{"properties":{"a":false}}`, `{"a":1}`, `$.a: the schema allows no value here, got number 1`},
		{"true schema", `true`, `{"anything":[1,2]}`, ""},
		{"unknown keywords ignored", `{"type":"string","minLength":10,"pattern":"^x"}`, `"short"`, ""},
		{"null", `{"type":"null"}`, `0`, `$: got number 0, want null`},
		{"boolean", `{"type":"boolean"}`, `"true"`, `$: got string "true", want boolean`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var schema, value interface{}
			if err := json.Unmarshal([]byte(c.schema), &schema); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(c.value), &value); err != nil {
				t.Fatal(err)
			}
			got := schemaViolation(schema, value)
			if c.want == "" && got != "" {
				t.Fatalf("schemaViolation = %q, want none", got)
			} else if c.want != "" && !strings.Contains(got, c.want) {
				t.Fatalf("schemaViolation = %q, want it to contain %q", got, c.want)
			}
		})
	}
}

// A value nested deeper than the limit is refused, not followed.
func TestSchemaDepthLimit(t *testing.T) {
	schema := map[string]interface{}{}
	s := schema
	var v interface{} = 1.0
	for i := 0; i < schemaDepthLimit+5; i++ {
		next := map[string]interface{}{}
		s["items"] = next
		s = next
		v = []interface{}{v}
	}
	if got := schemaViolation(schema, v); !strings.Contains(got, "nested deeper than") {
		t.Fatalf("schemaViolation = %q, want the depth limit", got)
	}
}
