package resp

import (
	"bufio"
	"strconv"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core/fleetstore"
)

func parse(t *testing.T, wire string) (fleetstore.RedisValue, error, error) {
	t.Helper()
	return readReply(bufio.NewReader(strings.NewReader(wire)))
}

func TestAppendCommand(t *testing.T) {
	got := string(appendCommand(nil, []string{"SET", "k", "a\r\nb", ""}))
	want := "*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n$0\r\n\r\n"
	if got != want {
		t.Fatalf("appendCommand = %q, want %q", got, want)
	}
}

func TestReadReplyTypes(t *testing.T) {
	cases := []struct {
		name, wire string
		want       string // describe() of the value
	}{
		{"simple", "+OK\r\n", `"OK"`},
		{"integer", ":-42\r\n", "-42"},
		{"bulk", "$5\r\na\r\nbc\r\n", `"a\r\nbc"`},
		{"empty bulk", "$0\r\n\r\n", `""`},
		{"nil bulk", "$-1\r\n", "nil"},
		{"nil array", "*-1\r\n", "nil"},
		{"empty array", "*0\r\n", "[]"},
		{"nested", "*3\r\n:1\r\n*2\r\n$1\r\na\r\n$-1\r\n*0\r\n", `[1 ["a" nil] []]`},
		{"resp3 null", "_\r\n", "nil"},
		{"resp3 bool", "#t\r\n", "1"},
		{"resp3 double", ",3.5\r\n", `"3.5"`},
		{"resp3 verbatim", "=8\r\ntxt:abcd\r\n", `"abcd"`},
		{"resp3 map", "%1\r\n+k\r\n:2\r\n", `["k" 2]`},
		{"resp3 set", "~2\r\n:1\r\n:2\r\n", "[1 2]"},
		{"resp3 attribute", "|1\r\n+ttl\r\n:3\r\n+v\r\n", `"v"`},
	}
	for _, c := range cases {
		v, replyErr, ioErr := parse(t, c.wire)
		if ioErr != nil || replyErr != nil {
			t.Errorf("%s: errors %v / %v", c.name, replyErr, ioErr)
			continue
		}
		if got := describe(v); got != c.want {
			t.Errorf("%s: value %s, want %s", c.name, got, c.want)
		}
	}
}

func TestReadReplyErrors(t *testing.T) {
	_, replyErr, ioErr := parse(t, "-WRONGTYPE Operation against a key\r\n")
	if ioErr != nil {
		t.Fatal(ioErr)
	}
	rerr, ok := replyErr.(*Error)
	if !ok || rerr.Code() != "WRONGTYPE" {
		t.Fatalf("reply error = %v, want a *Error with code WRONGTYPE", replyErr)
	}
	// An error inside an array is reported after the array is consumed.
	r := bufio.NewReader(strings.NewReader("*2\r\n-ERR one\r\n:1\r\n+NEXT\r\n"))
	_, replyErr, ioErr = readReply(r)
	if ioErr != nil || replyErr == nil || replyErr.Error() != "ERR one" {
		t.Fatalf("nested error: reply error %v, io error %v; want ERR one", replyErr, ioErr)
	}
	v, _, _ := readReply(r)
	if v.Str != "NEXT" {
		t.Fatalf("reply after the array = %q, want NEXT (the reader stays in step)", v.Str)
	}
	_, replyErr, _ = parse(t, "!9\r\nERR bulky\r\n")
	if replyErr == nil || replyErr.Error() != "ERR bulky" {
		t.Fatalf("RESP3 blob error = %v, want ERR bulky", replyErr)
	}
}

func TestReadReplyProtocolErrors(t *testing.T) {
	bad := map[string]string{
		"unknown type":      "?x\r\n",
		"no CR":             "+OK\n",
		"bad integer":       ":12a\r\n",
		"bad bulk length":   "$x\r\n",
		"huge bulk":         "$999999999999\r\n",
		"bulk missing CRLF": "$2\r\nabcd",
		"huge array":        "*99999999999\r\n",
		"truncated":         "*2\r\n:1\r\n",
		"empty line":        "\r\n",
		"deep nesting":      strings.Repeat("*1\r\n", maxNesting+2) + ":1\r\n",
	}
	for name, wire := range bad {
		if _, _, ioErr := parse(t, wire); ioErr == nil {
			t.Errorf("%s (%q): no error, want a protocol or read error", name, wire)
		}
	}
}

// describe renders a value compactly for comparisons in tests.
func describe(v fleetstore.RedisValue) string {
	switch v.Kind {
	case fleetstore.RedisNil:
		return "nil"
	case fleetstore.RedisString:
		return strconv.Quote(v.Str)
	case fleetstore.RedisInt:
		return strconv.FormatInt(v.Int, 10)
	case fleetstore.RedisArray:
		parts := make([]string, 0, len(v.Array))
		for _, e := range v.Array {
			parts = append(parts, describe(e))
		}
		return "[" + strings.Join(parts, " ") + "]"
	}
	return "?"
}
