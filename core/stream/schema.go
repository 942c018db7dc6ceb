package stream

import (
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/llmhedge/llmhedge/core/config"
)

// A subset JSON-schema validator for the json_schema check: standard
// library only and Yaegi-safe, so that every adapter (Traefik's
// interpreted one too) checks the same way. It reads the schema as decoded
// JSON and checks these keywords: type (one name or a list), required,
// properties, additionalProperties (false or a schema), enum, const, items
// (one schema), anyOf, and the boolean schemas true and false. Every other
// keyword is ignored, so a value that breaks only those passes: $ref and
// $defs, allOf, oneOf, not, pattern, format, minLength/maxLength,
// minimum/maximum (and their exclusive forms), multipleOf, minItems/maxItems,
// uniqueItems, prefixItems, minProperties/maxProperties, patternProperties,
// dependentRequired, if/then/else.

// schemaDepthLimit bounds the nesting the validator follows, so that a
// deeply nested value or schema cannot exhaust the stack.
const schemaDepthLimit = 64

// schemaViolation returns "" when v satisfies schema, else one sentence that
// names where (a JSON path from $) and the wrong value.
func schemaViolation(schema, v interface{}) string {
	msg := checkSchema(schema, v, "$", 0)
	return msg
}

// checkSchema is schemaViolation at path, depth levels down.
func checkSchema(schema, v interface{}, path string, depth int) string {
	if depth > schemaDepthLimit {
		return path + ": nested deeper than " + strconv.Itoa(schemaDepthLimit) + " levels"
	}
	switch s := schema.(type) {
	case bool:
		if !s {
			return path + ": the schema allows no value here, got " + config.DescribeJSON(v)
		}
		return ""
	case map[string]interface{}:
		return checkSchemaObject(s, v, path, depth)
	}
	return "" // not a schema: nothing to check
}

// checkSchemaObject checks v against one schema object, keyword by keyword.
func checkSchemaObject(s map[string]interface{}, v interface{}, path string, depth int) string {
	if t, ok := s["type"]; ok {
		if msg := checkType(t, v, path); msg != "" {
			return msg
		}
	}
	if c, ok := s["const"]; ok && !jsonEqual(c, v) {
		return path + ": got " + config.DescribeJSON(v) + ", want " + config.DescribeJSON(c)
	}
	if e, ok := s["enum"].([]interface{}); ok {
		if msg := checkEnum(e, v, path); msg != "" {
			return msg
		}
	}
	if branches, ok := s["anyOf"].([]interface{}); ok && len(branches) > 0 {
		if msg := checkAnyOf(branches, v, path, depth); msg != "" {
			return msg
		}
	}
	switch x := v.(type) {
	case map[string]interface{}:
		return checkObject(s, x, path, depth)
	case []interface{}:
		if items, ok := s["items"]; ok {
			for i, item := range x {
				if msg := checkSchema(items, item, path+"["+strconv.Itoa(i)+"]", depth+1); msg != "" {
					return msg
				}
			}
		}
	}
	return ""
}

// checkType checks the type keyword: one type name or a list of them.
func checkType(t, v interface{}, path string) string {
	switch tt := t.(type) {
	case string:
		if hasType(tt, v) {
			return ""
		}
		return path + ": got " + config.DescribeJSON(v) + ", want " + tt
	case []interface{}:
		names := make([]string, 0, len(tt))
		for _, n := range tt {
			name, _ := n.(string)
			if hasType(name, v) {
				return ""
			}
			names = append(names, name)
		}
		return path + ": got " + config.DescribeJSON(v) + ", want " + strings.Join(names, " or ")
	}
	return ""
}

// hasType reports whether v is of the JSON-schema type name. An integer is
// a number without a fractional part (1.0 counts, as the standard says).
func hasType(name string, v interface{}) bool {
	switch name {
	case "object":
		_, ok := v.(map[string]interface{})
		return ok
	case "array":
		_, ok := v.([]interface{})
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(float64)
		return ok
	case "integer":
		f, ok := v.(float64)
		return ok && f == math.Trunc(f) && !math.IsInf(f, 0)
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	}
	return true // an unknown type name is not checked
}

// checkEnum checks that v equals one of the enum's values.
func checkEnum(e []interface{}, v interface{}, path string) string {
	for _, allowed := range e {
		if jsonEqual(allowed, v) {
			return ""
		}
	}
	shown := make([]string, 0, len(e))
	for i, allowed := range e {
		if i == 5 {
			shown = append(shown, "…")
			break
		}
		shown = append(shown, config.DescribeJSON(allowed))
	}
	return path + ": got " + config.DescribeJSON(v) + ", want one of " + strings.Join(shown, ", ")
}

// checkAnyOf checks that v satisfies at least one of the schemas; the
// message quotes the first branch's complaint.
func checkAnyOf(branches []interface{}, v interface{}, path string, depth int) string {
	first := ""
	for i, branch := range branches {
		msg := checkSchema(branch, v, path, depth+1)
		if msg == "" {
			return ""
		}
		if i == 0 {
			first = msg
		}
	}
	return path + ": matches none of anyOf's " + strconv.Itoa(len(branches)) + " schemas (the first: " + first + ")"
}

// checkObject checks required, properties and additionalProperties.
func checkObject(s map[string]interface{}, obj map[string]interface{}, path string, depth int) string {
	if req, ok := s["required"].([]interface{}); ok {
		for _, r := range req {
			name, _ := r.(string)
			if _, present := obj[name]; !present {
				return path + ": required property " + strconv.Quote(name) + " is missing"
			}
		}
	}
	props, _ := s["properties"].(map[string]interface{})
	additional, hasAdditional := s["additionalProperties"]
	// Sorted, so that the same answer always names the same property.
	names := make([]string, 0, len(obj))
	for name := range obj {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		value := obj[name]
		sub := path + "." + name
		if ps, ok := props[name]; ok {
			if msg := checkSchema(ps, value, sub, depth+1); msg != "" {
				return msg
			}
			continue
		}
		if !hasAdditional {
			continue
		}
		if allowed, isBool := additional.(bool); isBool && !allowed {
			return path + ": property " + strconv.Quote(name) + " is not allowed (additionalProperties is false)"
		}
		if msg := checkSchema(additional, value, sub, depth+1); msg != "" {
			return msg
		}
	}
	return ""
}

// jsonEqual compares two decoded JSON values.
func jsonEqual(a, b interface{}) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case float64:
		y, ok := b.(float64)
		return ok && x == y
	case string:
		y, ok := b.(string)
		return ok && x == y
	case []interface{}:
		y, ok := b.([]interface{})
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !jsonEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]interface{}:
		y, ok := b.(map[string]interface{})
		if !ok || len(x) != len(y) {
			return false
		}
		for k, xv := range x {
			yv, present := y[k]
			if !present || !jsonEqual(xv, yv) {
				return false
			}
		}
		return true
	}
	return false
}
