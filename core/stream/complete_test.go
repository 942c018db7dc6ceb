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

func TestEndsWhole(t *testing.T) {
	for _, c := range []struct {
		tail string
		want bool
	}{
		{"data: {\"choices\":[]}\n\ndata: [DONE]\n\n", true},
		{"data: {\"choices\":[]}\r\n\r\ndata:[DONE]\r\n\r\n", true},
		{"data: {\"choices\":[]}\n\ndata: [DONE]\n", false}, // not yet ended
		{"data: {\"choices\":[]}\n\ndata: [DONE]", false},   // mid-line
		{"data: [DONE]\n\n", false},                         // may start before tail
		{"data: {\"choices\":[]}\n\nevent: x\ndata: [DONE]\n\n", false},
		{"data: {\"delta\":\"data: [DONE]\"}\n\n", false},
		{"x\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", true},
		{"x\n\ndata: {\"type\":\"message_stop\"}\n\n", true},
		{"x\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"message_stop\"}}\n\n", false},
		{"x\n\nevent: message_stop\ndata: {\"type\":\"ping\"}\n\n", false},
		{"x\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{}}\n\n", true},
		{"x\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"\\\"response.completed\\\"\"}\n\n", false},
		{"{\"done\":false}\n{\"model\":\"m\",\"done\":true}\n", true},
		{"{\"done\":false}\n{\"model\":\"m\",\"message\":{\"content\":\"\\\"done\\\":true\"},\"done\":false}\n", false},
		{"{\"done\":false}\n{\"model\":\"m\",\"done\":tr", false},
		{"{\"model\":\"m\",\"done\":true}\n", false}, // may start before tail
	} {
		if got := EndsWhole([]byte(c.tail)); got != c.want {
			t.Errorf("EndsWhole(%q) = %v, want %v", c.tail, got, c.want)
		}
	}
}
