package config

import "strconv"

// Text for messages about JSON values: the options' errors and the
// answers' validity checks say the same thing the same way.

// DescribeJSON names a decoded value for a message: its type and, for a
// scalar, the value itself (strings cut at 40 bytes).
func DescribeJSON(v interface{}) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean " + strconv.FormatBool(x)
	case float64:
		return "number " + strconv.FormatFloat(x, 'g', -1, 64)
	case string:
		return "string " + QuoteCut(x, 40)
	case []interface{}:
		return "array of " + strconv.Itoa(len(x))
	case map[string]interface{}:
		return "object"
	}
	return "value"
}

// QuoteCut quotes s, cut to at most n bytes (on a rune boundary).
func QuoteCut(s string, n int) string {
	if len(s) <= n {
		return strconv.Quote(s)
	}
	cut := n
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…"
}
