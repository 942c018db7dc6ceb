package redisproc

import (
	"sort"
	"strconv"
	"strings"
)

// Calls are a server's calls per command (lower case, as INFO commandstats
// names them: "evalsha", "config|resetstat"), the calls a script makes
// inside it included.
type Calls map[string]int64

// ParseCalls reads the output of INFO commandstats.
func ParseCalls(info string) Calls {
	calls := Calls{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		calls[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return calls
}

// Since is c less before (nil: nothing before), keeping the commands that
// changed and dropping those whose name starts with one of ignore (a
// test's own INFO, HELLO or CONFIG).
func (c Calls) Since(before Calls, ignore ...string) Calls {
	out := Calls{}
	for name, n := range c {
		d := n - before[name]
		if d == 0 || hasAnyPrefix(name, ignore) {
			continue
		}
		out[name] = d
	}
	return out
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// Total is the sum of the calls.
func (c Calls) Total() int64 {
	var n int64
	for _, v := range c {
		n += v
	}
	return n
}

// String is "name=calls" per command, by name.
func (c Calls) String() string {
	names := make([]string, 0, len(c))
	for name := range c {
		names = append(names, name)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, name := range names {
		parts[i] = name + "=" + strconv.FormatInt(c[name], 10)
	}
	return strings.Join(parts, " ")
}
