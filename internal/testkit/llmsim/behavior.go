package llmsim

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// HeaderBehavior is the request header that scripts behaviors per upstream
// through real proxies, e.g. "A=status:429,retry_after:2;B=reset_after:3".
// See ParseBehaviors.
const HeaderBehavior = "X-Sim-Behavior"

// Behavior scripts how a Server answers one request. The zero Behavior is a
// normal answer following the Workload. Its durations are wall-clock: the
// Workload's Scale does not apply to them.
type Behavior struct {
	// Status, when non-zero and not 200, answers at once (after SlowHeaders)
	// with this status and a JSON error body in the OpenAI shape
	// {"error":{"message","type","param","code"}}.
	Status int
	// RetryAfter is the Retry-After header, in seconds, sent with a 429 or
	// 503 Status. 0 means 1 for a 429 and none for a 503; < 0 means none.
	RetryAfter int
	// TTFT, when > 0, replaces the workload's draw for this request.
	TTFT time.Duration
	// Reset closes the connection abruptly, without the stream's terminator
	// (the client's read fails with an unexpected EOF), at the moment token
	// number ResetAfterTokens+1 would have been sent: ResetAfterTokens = 0
	// resets at the TTFT, after the preamble and pings but before any output.
	// A non-streaming request is reset when its answer would have been sent.
	Reset bool
	// ResetAfterTokens is the number of tokens sent before a reset. A value
	// > 0 implies Reset.
	ResetAfterTokens int
	// ErrorEventBeforeOutput sends, at the TTFT, the format's error event
	// instead of the first token, then ends the stream cleanly: "data:
	// {"error":{…}}" for Chat, "event: error" for Responses and Messages, an
	// {"error":…} line for Ollama. A non-streaming request gets a 500 error.
	ErrorEventBeforeOutput bool
	// DoneBeforeOutput ends the stream cleanly right after the preamble,
	// without output: "data: [DONE]" for Chat, the format's closing events
	// for the others. No effect on a non-streaming request.
	DoneBeforeOutput bool
	// Stall never sends a token: the stream keeps pinging, a non-streaming
	// request keeps waiting, until the client goes away.
	Stall bool
	// NoPings sends no keep-alive pings for this request.
	NoPings bool
	// SlowHeaders delays the status line and headers by this much.
	SlowHeaders time.Duration
}

// resets reports whether b resets the connection.
func (b Behavior) resets() bool { return b.Reset || b.ResetAfterTokens > 0 }

// String returns b in the option syntax of ParseBehaviors, e.g.
// "status:429,retry_after:2"; "" for the zero Behavior.
func (b Behavior) String() string {
	var opts []string
	if b.Status != 0 {
		opts = append(opts, "status:"+strconv.Itoa(b.Status))
	}
	if b.RetryAfter != 0 {
		opts = append(opts, "retry_after:"+strconv.Itoa(b.RetryAfter))
	}
	if b.TTFT > 0 {
		opts = append(opts, "ttft:"+b.TTFT.String())
	}
	if b.resets() {
		opts = append(opts, "reset_after:"+strconv.Itoa(b.ResetAfterTokens))
	}
	if b.ErrorEventBeforeOutput {
		opts = append(opts, "error_event")
	}
	if b.DoneBeforeOutput {
		opts = append(opts, "done_early")
	}
	if b.Stall {
		opts = append(opts, "stall")
	}
	if b.NoPings {
		opts = append(opts, "no_pings")
	}
	if b.SlowHeaders > 0 {
		opts = append(opts, "slow_headers:"+b.SlowHeaders.String())
	}
	return strings.Join(opts, ",")
}

// BehaviorHeader formats behaviors per upstream name as an X-Sim-Behavior
// value, names in sorted order: "A=status:429;B=stall". The name "*" applies
// to every upstream not named.
func BehaviorHeader(byUpstream map[string]Behavior) string {
	names := make([]string, 0, len(byUpstream))
	for name := range byUpstream {
		names = append(names, name)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, name := range names {
		parts = append(parts, name+"="+byUpstream[name].String())
	}
	return strings.Join(parts, ";")
}

// ParseBehaviors parses an X-Sim-Behavior value: entries "name=options"
// separated by ";", options separated by ",", each "key" or "key:value".
// The name "*" applies to every upstream not named. Keys:
//
//	status:N          Status
//	retry_after:N     RetryAfter (seconds)
//	ttft:DUR          TTFT (Go duration, e.g. 300ms)
//	reset_after:N     Reset after N tokens
//	error_event       ErrorEventBeforeOutput
//	done_early        DoneBeforeOutput (also done_before_output)
//	stall             Stall
//	no_pings          NoPings
//	slow_headers:DUR  SlowHeaders
func ParseBehaviors(v string) (map[string]Behavior, error) {
	out := map[string]Behavior{}
	for _, entry := range strings.Split(v, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, opts, ok := strings.Cut(entry, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("llmsim: behavior entry %q: want name=options", entry)
		}
		b, err := parseBehavior(opts)
		if err != nil {
			return nil, fmt.Errorf("llmsim: behavior for %q: %w", name, err)
		}
		out[name] = b
	}
	return out, nil
}

func parseBehavior(opts string) (Behavior, error) {
	var b Behavior
	for _, opt := range strings.Split(opts, ",") {
		opt = strings.TrimSpace(opt)
		if opt == "" {
			continue
		}
		key, val, hasVal := strings.Cut(opt, ":")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		var err error
		switch key {
		case "status":
			b.Status, err = strconv.Atoi(val)
		case "retry_after":
			b.RetryAfter, err = strconv.Atoi(val)
		case "ttft":
			b.TTFT, err = time.ParseDuration(val)
		case "reset_after":
			b.Reset = true
			b.ResetAfterTokens, err = strconv.Atoi(val)
		case "slow_headers":
			b.SlowHeaders, err = time.ParseDuration(val)
		case "error_event":
			b.ErrorEventBeforeOutput, err = flag(val, hasVal)
		case "done_early", "done_before_output":
			b.DoneBeforeOutput, err = flag(val, hasVal)
		case "stall":
			b.Stall, err = flag(val, hasVal)
		case "no_pings":
			b.NoPings, err = flag(val, hasVal)
		default:
			return b, fmt.Errorf("unknown option %q", key)
		}
		if err != nil {
			return b, fmt.Errorf("option %q: %w", opt, err)
		}
	}
	return b, nil
}

// flag reads a boolean option: present without a value means true.
func flag(val string, hasVal bool) (bool, error) {
	if !hasVal {
		return true, nil
	}
	return strconv.ParseBool(val)
}

// behaviorFor picks the header entry for upstream name, or "*".
func behaviorFor(byUpstream map[string]Behavior, name string) (Behavior, bool) {
	if b, ok := byUpstream[name]; ok {
		return b, true
	}
	b, ok := byUpstream["*"]
	return b, ok
}
