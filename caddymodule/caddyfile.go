package caddymodule

import (
	"math"
	"reflect"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"

	"github.com/llmhedge/llmhedge/core"
)

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens; README.md
// ("Caddyfile") has the syntax. Every option of core.Config and
// core.TransportConfig without a syntax of its own here is spelled as its
// JSON name with one argument (a flag has none), so it needs no code here.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume the directive name
	for _, url := range d.RemainingArgs() {
		h.Upstreams = append(h.Upstreams, core.UpstreamConfig{URL: url})
	}
	p := args{d}
	for d.NextBlock(0) {
		option := d.Val()
		var err error
		switch option {
		case "upstream":
			err = h.parseUpstream(p)
		case "delay":
			err = h.parseDelay(p)
		case "methods":
			h.Methods, err = p.atLeastOne()
			for i := range h.Methods {
				h.Methods[i] = strings.ToUpper(h.Methods[i])
			}
		case "paths":
			h.PathPrefixes, err = p.atLeastOne()
		case "report_header":
			names := d.RemainingArgs()
			switch len(names) {
			case 0:
				h.ReportHeader = "Server-Timing"
			case 1:
				h.ReportHeader = names[0]
			default:
				err = d.Errf("report_header takes at most one header name, got %d", len(names))
			}
		case "transport":
			err = h.parseTransport(p)
		case "log_level":
			h.LogLevel, err = p.one()
		default:
			err = p.jsonOption(reflect.ValueOf(&h.Config).Elem(), "llm_hedge")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// parseUpstream reads `upstream <url> [{ ... }]`.
func (h *Handler) parseUpstream(p args) error {
	d := p.d
	url, err := p.one()
	if err != nil {
		return err
	}
	h.Upstreams = append(h.Upstreams, core.UpstreamConfig{URL: url})
	u := &h.Upstreams[len(h.Upstreams)-1] // the block appends no upstream
	return p.each(func(option string) (err error) {
		switch option {
		case "name":
			u.Name, err = p.one()
		case "model":
			u.Model, err = p.one()
		case "header_up":
			err = parseHeaderUp(u, p)
		default:
			err = d.Errf("unrecognized upstream option %q (want name, header_up or model)", option)
		}
		return err
	})
}

// parseHeaderUp reads `header_up <field> <value>` or `header_up -<field>`.
func parseHeaderUp(u *core.UpstreamConfig, p args) error {
	d := p.d
	fields := d.RemainingArgs()
	switch {
	case len(fields) == 1 && strings.HasPrefix(fields[0], "-") && len(fields[0]) > 1:
		u.DeleteHeaders = append(u.DeleteHeaders, fields[0][1:])
	case len(fields) == 2 && !strings.HasPrefix(fields[0], "-") && !strings.HasPrefix(fields[0], "+"):
		if u.SetHeaders == nil {
			u.SetHeaders = map[string]string{}
		}
		u.SetHeaders[fields[0]] = fields[1]
	default:
		return d.Errf("header_up: want `header_up <field> <value>` to set a header or `header_up -<field>` to delete one")
	}
	return nil
}

// parseDelay reads `delay <duration>` or `delay adaptive [<initial>] [{ ... }]`.
func (h *Handler) parseDelay(p args) error {
	d := p.d
	dl := &h.Delay
	values := d.RemainingArgs()
	switch {
	case len(values) == 1 && values[0] != "adaptive":
		v, err := caddy.ParseDuration(values[0])
		if err != nil {
			return d.Errf("delay %q: want a duration (e.g. 500ms) or adaptive: %v", values[0], err)
		}
		dl.Mode, dl.Fixed = core.DelayFixed, core.Duration(v)
	case len(values) >= 1 && len(values) <= 2 && values[0] == "adaptive":
		dl.Mode = core.DelayAdaptive
		if len(values) == 2 {
			v, err := caddy.ParseDuration(values[1])
			if err != nil {
				return d.Errf("delay adaptive %q: want the initial delay as a duration: %v", values[1], err)
			}
			dl.Fixed = core.Duration(v)
		}
	default:
		return d.Errf("delay: want `delay <duration>` or `delay adaptive [<initial>] { ... }`")
	}
	return p.each(func(option string) error {
		if dl.Mode != "adaptive" {
			return d.Errf("delay %s takes no block; options like %q belong to `delay adaptive`", values[0], option)
		}
		if option == "mode" || option == "fixed" || !fieldByJSONName(reflect.ValueOf(dl).Elem(), option).IsValid() {
			return d.Errf("unrecognized delay option %q (want quantile, min, max, window or min_samples)", option)
		}
		return p.jsonOption(reflect.ValueOf(dl).Elem(), "delay")
	})
}

// jsonOption reads the current option line into the field of the struct v
// (core.Config, one of its parts, or core.TransportConfig) whose JSON name it is, by
// the field's type; a struct field is a block of its own options. So every
// option spelled as its JSON name needs no code here.
func (p args) jsonOption(v reflect.Value, block string) error {
	option := p.d.Val()
	field := fieldByJSONName(v, option)
	if !field.IsValid() {
		return p.d.Errf("unrecognized %s option %q", block, option)
	}
	var err error
	switch to := field.Addr().Interface().(type) {
	case *core.Duration:
		*to, err = p.duration(offOptions[option])
	case *core.ByteSize:
		if intSizeOptions[option] {
			*to, err = p.intSize()
		} else {
			*to, err = p.size()
		}
	case *string:
		*to, err = p.one()
	case *[]string:
		*to, err = p.atLeastOne()
	case *int:
		*to, err = p.integer(offOptions[option])
	case *int64:
		var n int
		n, err = p.integer(offOptions[option])
		*to = int64(n)
	case *float64:
		*to, err = p.float(offOptions[option])
	case *bool:
		*to, err = true, p.none()
	default:
		if field.Kind() != reflect.Struct {
			return p.d.Errf("unrecognized %s option %q", block, option)
		}
		err = p.block(func(string) error { return p.jsonOption(field, option) })
	}
	return err
}

// offOptions may be "off" in a Caddyfile, which means -1.
var offOptions = map[string]bool{"ttl": true, "ratio": true, "max_concurrent_hedges": true, "early_headers": true}

// intSizeOptions are sizes that must fit an int32 (buffers of one request).
var intSizeOptions = map[string]bool{"max_prefix": true, "max_line": true, "max_response_bytes": true}

// fieldByJSONName is the field of the struct v whose JSON name is name, or
// the zero Value. Lists of structs (upstreams) have a syntax of their own.
func fieldByJSONName(v reflect.Value, name string) reflect.Value {
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		structList := f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct
		if strings.Split(f.Tag.Get("json"), ",")[0] == name && !structList {
			return v.Field(i)
		}
	}
	return reflect.Value{}
}

// parseTransport reads the transport block: each option is its JSON name.
func (h *Handler) parseTransport(p args) error {
	if h.Transport == nil {
		h.Transport = &core.TransportConfig{}
	}
	t := reflect.ValueOf(h.Transport).Elem()
	return p.block(func(string) error { return p.jsonOption(t, "transport") })
}

// args reads an option's arguments, with errors that name the option and
// the Caddyfile line.
type args struct{ d *caddyfile.Dispenser }

// each calls option for every option line of the block that follows the
// current line, if there is one, and stops at the first error.
func (p args) each(option func(name string) error) error {
	for nesting := p.d.Nesting(); p.d.NextBlock(nesting); {
		if err := option(p.d.Val()); err != nil {
			return err
		}
	}
	return nil
}

// block reads `<name> { ... }`: no arguments, then each option line.
func (p args) block(option func(name string) error) error {
	if err := p.none(); err != nil {
		return err
	}
	return p.each(option)
}

// none checks that the option has no arguments (a flag or a block opener).
func (p args) none() error {
	option := p.d.Val()
	if rest := p.d.RemainingArgs(); len(rest) > 0 {
		return p.d.Errf("%s takes no arguments, got %q", option, rest)
	}
	return nil
}

// one returns the option's single argument.
func (p args) one() (string, error) {
	option := p.d.Val()
	values := p.d.RemainingArgs()
	if len(values) != 1 {
		return "", p.d.Errf("%s takes exactly one argument, got %d", option, len(values))
	}
	return values[0], nil
}

// atLeastOne returns the option's arguments, of which there must be some.
func (p args) atLeastOne() ([]string, error) {
	option := p.d.Val()
	values := p.d.RemainingArgs()
	if len(values) == 0 {
		return nil, p.d.Errf("%s needs at least one argument", option)
	}
	return values, nil
}

// value returns the single argument, and whether it is "off" (when allowed).
func (p args) value(allowOff bool) (string, bool, error) {
	option := p.d.Val()
	v, err := p.one()
	if err != nil {
		return "", false, err
	}
	if v == "off" {
		if !allowOff {
			return "", false, p.d.Errf("%s cannot be off", option)
		}
		return v, true, nil
	}
	return v, false, nil
}

// duration parses a duration argument; "off" gives -1 when allowed.
func (p args) duration(allowOff bool) (core.Duration, error) {
	option := p.d.Val()
	v, off, err := p.value(allowOff)
	if err != nil || off {
		return -1, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, p.d.Errf("%s %q: want a duration such as 250ms or 2s: %v", option, v, err)
	}
	return core.Duration(dur), nil
}

// integer parses an integer argument; "off" gives -1 when allowed.
func (p args) integer(allowOff bool) (int, error) {
	option := p.d.Val()
	v, off, err := p.value(allowOff)
	if err != nil || off {
		return -1, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, p.d.Errf("%s %q: want an integer", option, v)
	}
	return n, nil
}

// float parses a number argument; "off" gives -1 when allowed.
func (p args) float(allowOff bool) (float64, error) {
	option := p.d.Val()
	v, off, err := p.value(allowOff)
	if err != nil || off {
		return -1, err
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, p.d.Errf("%s %q: want a number", option, v)
	}
	return f, nil
}

// size parses a byte size such as 4MiB or 65536.
func (p args) size() (core.ByteSize, error) {
	option := p.d.Val()
	v, err := p.one()
	if err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(v)
	if err != nil || n > math.MaxInt64 {
		return 0, p.d.Errf("%s %q: want a size such as 4MiB or 65536", option, v)
	}
	return core.ByteSize(n), nil
}

// intSize parses a byte size that must fit an int.
func (p args) intSize() (core.ByteSize, error) {
	option := p.d.Val()
	n, err := p.size()
	if err != nil {
		return 0, err
	}
	if n > math.MaxInt32 {
		return 0, p.d.Errf("%s %d is too large", option, n)
	}
	return n, nil
}
