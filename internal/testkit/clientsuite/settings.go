package clientsuite

import (
	"strconv"
)

// Setting is one of a route's settings beyond its delay, named as in the
// adapters' configurations. Value is "" for a flag that is on.
type Setting struct {
	Name, Value string
}

// Settings are the route's settings that differ from the defaults, in a
// fixed order, for an adapter's Start to write in its own syntax.
func (r Route) Settings() []Setting {
	var s []Setting
	if r.Timeout > 0 {
		s = append(s, Setting{Name: "timeout", Value: r.Timeout.String()})
	}
	if r.MaxAttempts > 0 {
		s = append(s, Setting{Name: "max_attempts", Value: strconv.Itoa(r.MaxAttempts)})
	}
	if r.EarlyHeaders != "" {
		s = append(s, Setting{Name: "early_headers", Value: r.EarlyHeaders})
	}
	if r.HedgeStoredResponses {
		s = append(s, Setting{Name: "hedge_stored_responses"})
	}
	return s
}

// Extra is the route's Settings written in an adapter's syntax: line
// writes one setting (with its line end), and Extra joins them.
func (r Route) Extra(line func(Setting) string) string {
	extra := ""
	for _, set := range r.Settings() {
		extra += line(set)
	}
	return extra
}
