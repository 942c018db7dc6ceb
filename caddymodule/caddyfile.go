package caddymodule

import (
	"math"
	"reflect"
	"strconv"
	"strings"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"
)

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens; README.md
// ("Caddyfile") has the syntax. Every option of the handler's JSON
// (config.Config, transport, log_level) without a syntax of its own here is
// spelled as its JSON name with one argument (a flag has none, a struct is
// a block), so a new option needs no code here.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume the directive name
	for _, url := range d.RemainingArgs() {
		h.Upstreams = append(h.Upstreams, config.UpstreamConfig{URL: url})
	}
	p := args{d}
	for d.NextBlock(0) {
		var err error
		switch d.Val() {
		case "upstream":
			err = h.parseUpstream(p)
		case "delay":
			err = h.parseDelay(p)
		case "paths": // the Caddyfile's name of path_prefixes
			h.PathPrefixes, err = p.atLeastOne()
		case "report_header":
			err = h.parseReportHeader(p)
		case "fleet":
			err = h.parseFleet(p)
		default:
			err = p.jsonOption(reflect.ValueOf(h).Elem(), "llm_hedge")
		}
		if err != nil {
			return err
		}
	}
	for i := range h.Methods {
		h.Methods[i] = strings.ToUpper(h.Methods[i])
	}
	return nil
}

// parseReportHeader reads `report_header [<field>]`: Server-Timing by default.
func (h *Handler) parseReportHeader(p args) error {
	names := p.d.RemainingArgs()
	switch len(names) {
	case 0:
		h.ReportHeader = "Server-Timing"
	case 1:
		h.ReportHeader = names[0]
	default:
		return p.d.Errf("report_header takes at most one header name, got %d", len(names))
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
	h.Upstreams = append(h.Upstreams, config.UpstreamConfig{URL: url})
	u := &h.Upstreams[len(h.Upstreams)-1] // the block appends no upstream
	return p.each(func(option string) (err error) {
		switch option {
		case "name":
			u.Name, err = p.one()
		case "model":
			u.Model, err = p.one()
		case "header_up":
			err = parseHeaderUp(u, p)
		case "prefer_margin":
			err = parsePreferMargin(u, p)
		default:
			err = d.Errf("unrecognized upstream option %q (want name, header_up, model or prefer_margin)", option)
		}
		return err
	})
}

// parsePreferMargin reads `prefer_margin <fraction>`: 0.25 or 25%.
func parsePreferMargin(u *config.UpstreamConfig, p args) error {
	value, err := p.one()
	if err != nil {
		return err
	}
	f, err := config.ParseFraction(value)
	if err != nil {
		return p.d.Errf("prefer_margin %q: want a fraction such as 0.25 or a percentage such as 25%%", value)
	}
	u.PreferMargin = f
	return nil
}

// parseHeaderUp reads `header_up <field> <value>` or `header_up -<field>`.
func parseHeaderUp(u *config.UpstreamConfig, p args) error {
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
		dl.Mode, dl.Fixed = config.DelayFixed, config.Duration(v)
	case len(values) >= 1 && len(values) <= 2 && values[0] == "adaptive":
		dl.Mode = config.DelayAdaptive
		if len(values) == 2 {
			v, err := caddy.ParseDuration(values[1])
			if err != nil {
				return d.Errf("delay adaptive %q: want the initial delay as a duration: %v", values[1], err)
			}
			dl.Fixed = config.Duration(v)
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
// (the handler, one of its parts, or config.TransportConfig) whose JSON name
// it is, by the field's type: a flag takes no argument, a list one or
// more, a struct (or a pointer to one) is a block of its own options, any
// other field one argument.
func (p args) jsonOption(v reflect.Value, block string) error {
	option := p.d.Val()
	field := fieldByJSONName(v, option)
	if field.Kind() == reflect.Pointer && field.Type().Elem().Kind() == reflect.Struct {
		if field.IsNil() {
			field.Set(reflect.New(field.Type().Elem()))
		}
		field = field.Elem()
	}
	switch field.Kind() {
	case reflect.Bool:
		field.SetBool(true)
		return p.none()
	case reflect.Slice:
		values, err := p.atLeastOne()
		field.Set(reflect.ValueOf(values)) // []string: fieldByJSONName has no other lists
		return err
	case reflect.Struct:
		return p.block(func(string) error { return p.jsonOption(field, option) })
	case reflect.String, reflect.Int, reflect.Int64, reflect.Float64:
	default:
		return p.d.Errf("unrecognized %s option %q", block, option)
	}
	value, err := p.one()
	if err != nil {
		return err
	}
	switch to := field.Addr().Interface().(type) {
	case *string:
		*to = value
	case *config.ByteSize:
		*to, err = p.size(option, value, intSizeOptions[option])
	default:
		if field.Kind() == reflect.String {
			field.SetString(value) // a string type of core's (validate_failure, validate_schema)
			return nil
		}
		if value == "off" && !offOptions[option] {
			return p.d.Errf("%s cannot be off", option)
		}
		err = p.number(option, field, value)
	}
	return err
}

// offOptions may be "off" in a Caddyfile, which means -1.
var offOptions = map[string]bool{"ttl": true, "ratio": true, "max_concurrent_hedges": true, "early_headers": true}

// intSizeOptions are sizes that must fit an int32 (buffers of one request).
var intSizeOptions = map[string]bool{"max_prefix": true, "max_line": true, "max_response_bytes": true}

// fieldByJSONName is the field of the struct v, or of a struct embedded in
// it, whose JSON name is name, or the zero Value. Lists other than of
// strings (upstreams) have a syntax of their own.
func fieldByJSONName(v reflect.Value, name string) reflect.Value {
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			if inner := fieldByJSONName(v.Field(i), name); inner.IsValid() {
				return inner
			}
		}
		otherList := f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() != reflect.String
		if f.IsExported() && strings.Split(f.Tag.Get("json"), ",")[0] == name && !otherList {
			return v.Field(i)
		}
	}
	return reflect.Value{}
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

// number parses value into the numeric field (a duration, an integer or a
// float); "off" is -1.
func (p args) number(option string, field reflect.Value, value string) error {
	if value == "off" {
		field.Set(reflect.ValueOf(-1).Convert(field.Type()))
		return nil
	}
	if _, ok := field.Addr().Interface().(*config.Duration); ok {
		d, err := caddy.ParseDuration(value)
		if err != nil {
			return p.d.Errf("%s %q: want a duration such as 250ms or 2s: %v", option, value, err)
		}
		field.SetInt(int64(d))
		return nil
	}
	if field.Kind() == reflect.Float64 {
		f, err := strconv.ParseFloat(value, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return p.d.Errf("%s %q: want a number", option, value)
		}
		field.SetFloat(f)
		return nil
	}
	n, err := strconv.Atoi(value)
	if err != nil {
		return p.d.Errf("%s %q: want an integer", option, value)
	}
	field.SetInt(int64(n))
	return nil
}

// size parses a byte size such as 4MiB or 65536; fitInt: it must fit an int32.
func (p args) size(option, value string, fitInt bool) (config.ByteSize, error) {
	n, err := humanize.ParseBytes(value)
	if err != nil || n > math.MaxInt64 {
		return 0, p.d.Errf("%s %q: want a size such as 4MiB or 65536", option, value)
	}
	if fitInt && n > math.MaxInt32 {
		return 0, p.d.Errf("%s %d is too large", option, n)
	}
	return config.ByteSize(n), nil
}
