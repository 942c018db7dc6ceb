package core

import (
	"encoding/json"
	"strings"
	"testing"
)

// sseEvent is one event an EventSource client dispatches.
type sseEvent struct {
	name string // "" for the default, "message"
	data string
}

// parseSSE parses a stream as the WHATWG EventSource rules do: lines end in
// \r\n, \r or \n; a blank line dispatches the event being built (if it has
// data); an event the stream ends inside is discarded.
func parseSSE(stream string) []sseEvent {
	var events []sseEvent
	var data []string
	name := ""
	for {
		i := strings.IndexAny(stream, "\r\n")
		if i < 0 {
			return events // an unterminated last line is never processed
		}
		line := stream[:i]
		if strings.HasPrefix(stream[i:], "\r\n") {
			i++
		}
		stream = stream[i+1:]
		switch {
		case line == "":
			if data != nil {
				events = append(events, sseEvent{name: name, data: strings.Join(data, "\n")})
			}
			data = nil
			name = ""
		case line[0] == ':':
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "data":
				data = append(data, value)
			case "event":
				name = value
			}
		}
	}
}

// An upstream that breaks off mid-line (or mid-event) after commit: with
// stream_error_event the client's EventSource parser still dispatches the
// error event, as the last event of the stream.
func TestStreamErrorEventAfterPartialLine(t *testing.T) {
	for name, partial := range map[string]string{
		"mid-line":           "data: {\"choices\":[{\"in",
		"after a line end":   "data: {\"choices\":[]}\n",
		"after a lone CR":    "data: {\"choices\":[]}\r",
		"after CRLF":         "data: {\"choices\":[]}\r\n",
		"at an event end":    "",
		"at a CR event end":  "data: {\"choices\":[]}\r\r",
		"mid event name":     "event: mess",
		"inside a comment":   ": keep-al",
		"after a data field": "data: {}\r\nid: 7\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			cfg.StreamErrorEvent = true
			hs := newHarness(t, cfg)
			out := hs.serve(chatRequest(""))
			a := hs.tr.next(t)
			a.respond(200, "text/event-stream")
			a.write(tokenChunk("one"))
			if partial != "" {
				a.write(partial)
			}
			a.reset()
			res := <-out
			if res.err != nil {
				t.Fatalf("Handle = %v, want nil (the error event ends the stream)", res.err)
			}
			events := parseSSE(bodyOf(res))
			if len(events) == 0 {
				t.Fatalf("no event dispatched from %q", bodyOf(res))
			}
			last := events[len(events)-1]
			if last.name != "error" {
				t.Fatalf("last event is %q with data %q, want the error event (body %q)", last.name, last.data, bodyOf(res))
			}
			var body errorBody
			if err := json.Unmarshal([]byte(last.data), &body); err != nil || body.Error.Code != "stream_failed" {
				t.Fatalf("error event data %q: code %q, err %v; want code stream_failed", last.data, body.Error.Code, err)
			}
			if strings.Contains(body.Error.Message, "reset") {
				t.Fatalf("body.Error.Message = %q, want it not to contain \"reset\"", body.Error.Message)
			} else if !strings.HasSuffix(body.Error.Message, " broke off its answer") {
				t.Fatalf("body.Error.Message = %q, want it to end with \" broke off its answer\"", body.Error.Message)
			}
			if events[0].data != strings.TrimSuffix(strings.TrimPrefix(tokenChunk("one"), "data: "), "\n\n") {
				t.Fatalf("first event data %q, want the delivered chunk", events[0].data)
			}
		})
	}
}

func TestSSEEventEnd(t *testing.T) {
	for tail, want := range map[string]string{
		"":            "\n\n",
		"data: x":     "\n\n",
		"data: x\n":   "\n",
		"data: x\r\n": "\n",
		"data: x\r":   "\n\n",
		"data: x\n\n": "",
		"data: x\r\r": "",
		"x\r\n\r\n":   "",
		"x\n\r\n":     "",
		"x\r\r\n":     "",
		"\n":          "\n",
		"x\n\r":       "",
	} {
		if got := sseEventEnd([]byte(tail)); got != want {
			t.Errorf("sseEventEnd(%q) = %q, want %q", tail, got, want)
		}
	}
}
