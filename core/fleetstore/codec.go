package fleetstore

import (
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// The values the fleet stores: a generation's stream entries, an
// answer's head, a stored answer.

// StreamEntry is one entry of an XREAD reply: its id and its t/v/n fields.
type StreamEntry struct {
	ID    string
	Kind  string // h (head), d (data) or e (end)
	Value string
	Seq   int // from 1, the head first
}

// StreamEntries flattens an XREAD reply of one stream:
// [[name, [[id, [field, value, ...]], ...]]].
func StreamEntries(v RedisValue) []StreamEntry {
	var out []StreamEntry
	if v.Kind != RedisArray || len(v.Array) == 0 {
		return out
	}
	s := v.Array[0]
	if s.Kind != RedisArray || len(s.Array) < 2 {
		return out
	}
	for _, ev := range s.Array[1].Array {
		if len(ev.Array) < 2 {
			continue
		}
		e := StreamEntry{ID: ev.Array[0].Str}
		fields := ev.Array[1].Array
		for j := 0; j+1 < len(fields); j += 2 {
			switch fields[j].Str {
			case "t":
				e.Kind = fields[j+1].Str
			case "v":
				e.Value = fields[j+1].Str
			case "n":
				n, err := strconv.Atoi(fields[j+1].Str)
				if err == nil {
					e.Seq = n
				}
			}
		}
		out = append(out, e)
	}
	return out
}

// EncodeHead is an answer's status and headers as stored in a head
// entry and in front of a stored body: "<status>\n", one "Name: value\n"
// per value (sorted by name), "\n". Header values hold no newline.
func EncodeHead(status int, hdr http.Header) string {
	names := make([]string, 0, len(hdr))
	for k := range hdr {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString(strconv.Itoa(status))
	b.WriteByte('\n')
	for _, k := range names {
		for _, v := range hdr[k] {
			b.WriteString(k)
			b.WriteString(": ")
			b.WriteString(v)
			b.WriteByte('\n')
		}
	}
	b.WriteByte('\n')
	return b.String()
}

// DecodeHead reverses EncodeHead; rest is what follows the head.
func DecodeHead(text string) (status int, hdr http.Header, rest string, ok bool) {
	// Multi-value results into fresh locals only (Yaegi).
	line, s, found := strings.Cut(text, "\n")
	if !found {
		return 0, nil, "", false
	}
	n, err := strconv.Atoi(line)
	if err != nil || n < 100 || n > 999 {
		return 0, nil, "", false
	}
	hdr = make(http.Header)
	for {
		line, after, found := strings.Cut(s, "\n")
		if !found {
			return 0, nil, "", false
		}
		s = after
		if line == "" {
			break
		}
		name, value, ok := strings.Cut(line, ": ")
		if !ok {
			return 0, nil, "", false
		}
		hdr[name] = append(hdr[name], value)
	}
	return n, hdr, s, true
}

// DecodeDone decodes a stored answer (done value) of the request with
// fingerprint fp: the generation that answered (its holder; "" in values
// stored before it was recorded), status, headers and body.
func DecodeDone(done, fp string) (holder string, status int, hdr http.Header, body string, ok bool) {
	rest, found := strings.CutPrefix(done, fp+"\n")
	if !found {
		return "", 0, nil, "", false
	}
	if strings.HasPrefix(rest, "@") {
		line, after, cut := strings.Cut(rest, "\n")
		if !cut {
			return "", 0, nil, "", false
		}
		holder = line[1:]
		rest = after
	}
	st, h, b, good := DecodeHead(rest)
	return holder, st, h, b, good
}

// HoldsLease reports whether a read of the lease (ReadLease) names this
// lease value.
func HoldsLease(v RedisValue, leaseValue string) bool {
	return v.Kind == RedisString && v.Str == leaseValue
}

// EncodeDone is a stored answer (the done value) of the request with
// fingerprint fp, answered by holder's generation: DecodeDone's input.
func EncodeDone(fp, holder string, status int, hdr http.Header, body []byte) string {
	return fp + "\n@" + holder + "\n" + EncodeHead(status, hdr) + string(body)
}
