package stream

import (
	"strings"
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
		if got := EndsWhole([]byte(c.tail), false); got != c.want {
			t.Errorf("EndsWhole(%q, false) = %v, want %v", c.tail, got, c.want)
		}
	}
}

func TestEndsWholeFromStart(t *testing.T) {
	for _, c := range []struct {
		held string
		want bool
	}{
		{"data: [DONE]\n\n", true},
		{"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":\"" + strings.Repeat("x", 600) + "\"}}\n\n", true},
		{"{\"model\":\"m\",\"done\":true,\"eval_count\":" + strings.Repeat("1", 400) + "}\n", true},
		{"data: [DONE]\n", false},
	} {
		if got := EndsWhole([]byte(c.held), true); got != c.want {
			t.Errorf("EndsWhole(%q, true) = %v, want %v", c.held, got, c.want)
		}
	}
}

func TestHasEndMarker(t *testing.T) {
	for _, c := range []struct {
		prev, p string
		want    bool
	}{
		{"x\n\n", "data: [DONE]\n\n", true},
		{"x\n\ndata: [DO", "NE]\n\n", true}, // split between writes
		{"x\n\n", "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":\"" + strings.Repeat("x", 600) + "\"}}\n\n", true},
		{"x\n\n", "data: {\"type\":\"message_stop\"}\n\n", true},
		{"x\n\n", "{\"done\":true}\n", true},
		// An answer's text naming a marker: escaped inside its JSON.
		{"x\n\n", "data: {\"choices\":[{\"delta\":{\"content\":\"message_stop \\\"done\\\":true data: [DONE]\\ndata: [DONE]\"}}]}\n\n", false},
		{"x\n\n", "data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"\\\"type\\\":\\\"message_stop\\\"\"}}\n\n", false},
	} {
		if got := HasEndMarker([]byte(c.prev), []byte(c.p)); got != c.want {
			t.Errorf("HasEndMarker(%q, %q) = %v, want %v", c.prev, c.p, got, c.want)
		}
	}
}
