package stream

import (
	"testing"
)

func TestJSONShape(t *testing.T) {
	for text, open := range map[string]bool{
		``:                      false,
		`  `:                    false,
		`{}`:                    false,
		`{"a":[1,2,{"b":"}"}]}`: false,
		`{"a":"\\"}`:            false,
		`{"a":"\\\"}`:           true,
		`{"a":[`:                true,
		`"str`:                  true,
		`123`:                   false,
	} {
		s := &Shape{}
		// Fed a byte at a time, as a worst case of chunking.
		for i := 0; i < len(text); i++ {
			FeedShape(s, []byte{text[i]})
		}
		if got := ShapeOpen(s); got != open {
			t.Errorf("ShapeOpen after %q = %v, want %v", text, got, open)
		}
	}
}
