package caddymodule

import (
	"math"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"

	"github.com/llmhedge/llmhedge/core"
)

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	llm_hedge [<matcher>] [<upstream_urls...>] {
//	    route <name>
//	    upstream <url> {
//	        name <name>
//	        header_up <field> <value>
//	        header_up -<field>
//	        model <model>
//	    }
//	    delay <duration>
//	    delay adaptive [<initial>] {
//	        quantile <0..1>
//	        min <duration>
//	        max <duration>
//	        window <samples>
//	        min_samples <samples>
//	    }
//	    max_attempts <n>
//	    timeout <duration>
//	    min_time_left <duration>
//	    max_body <size>
//	    max_prefix <size>
//	    max_line <size>
//	    methods <method...>
//	    paths <prefix...>
//	    first_event auto|openai-chat|openai-responses|anthropic|any
//	    idempotency {
//	        header <field>
//	        ttl <duration>|off
//	        max_entries <n>
//	        max_bytes <size>
//	        max_response_bytes <size>
//	        scope_headers <field...>
//	    }
//	    budget {
//	        ratio <0..1>|off
//	        burst <n>
//	        max_concurrent_hedges <n>|off
//	        cool_down <duration>
//	        max_cool_down <duration>
//	        overload_rate <0..1>
//	        overload_window <n>
//	        breaker_failures <n>
//	        breaker_open <duration>
//	        tenant_header <field>
//	        tenant_tokens_per_minute <n>
//	    }
//	    report_header [<field>]
//	    stream_error_event
//	    transport {
//	        dial_timeout <duration>
//	        response_header_timeout <duration>
//	        keepalive_idle_timeout <duration>
//	        max_idle_conns_per_host <n>
//	        versions 1.1|2|h2c...
//	        tls_insecure_skip_verify
//	        tls_server_name <name>
//	        tls_trusted_ca_certs <pem_files...>
//	    }
//	    log_level auto|info|debug
//	}
//
// Sizes accept units (4MiB, 256KiB). Upstream URLs given on the directive's
// line come first, in order, before upstream blocks.
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
		case "route":
			h.Route, err = p.one()
		case "upstream":
			err = h.parseUpstream(p)
		case "delay":
			err = h.parseDelay(p)
		case "max_attempts":
			h.MaxAttempts, err = p.integer(false)
		case "timeout":
			h.Timeout, err = p.duration(false)
		case "min_time_left":
			h.MinTimeLeft, err = p.duration(false)
		case "max_body":
			h.MaxBody, err = p.size()
		case "max_prefix":
			h.MaxPrefix, err = p.intSize()
		case "max_line":
			h.MaxLine, err = p.intSize()
		case "methods":
			h.Methods, err = p.atLeastOne()
			for i := range h.Methods {
				h.Methods[i] = strings.ToUpper(h.Methods[i])
			}
		case "paths":
			h.PathPrefixes, err = p.atLeastOne()
		case "first_event":
			h.FirstEvent, err = p.one()
		case "idempotency":
			err = h.parseIdempotency(p)
		case "budget":
			err = h.parseBudget(p)
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
		case "stream_error_event":
			h.StreamErrorEvent, err = true, p.none()
		case "transport":
			err = h.parseTransport(p)
		case "log_level":
			h.LogLevel, err = p.one()
		default:
			err = d.Errf("unrecognized llm_hedge option %q", option)
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
	return p.each(func(option string) (err error) {
		if dl.Mode != "adaptive" {
			return d.Errf("delay %s takes no block; options like %q belong to `delay adaptive`", values[0], option)
		}
		switch option {
		case "quantile":
			dl.Quantile, err = p.float(false)
		case "min":
			dl.Min, err = p.duration(false)
		case "max":
			dl.Max, err = p.duration(false)
		case "window":
			dl.Window, err = p.integer(false)
		case "min_samples":
			dl.MinSamples, err = p.integer(false)
		default:
			err = d.Errf("unrecognized delay option %q (want quantile, min, max, window or min_samples)", option)
		}
		return err
	})
}

// parseIdempotency reads the idempotency block.
func (h *Handler) parseIdempotency(p args) error {
	idem := &h.Idempotency
	return p.block(func(option string) (err error) {
		switch option {
		case "header":
			idem.Header, err = p.one()
		case "ttl":
			idem.TTL, err = p.duration(true)
		case "max_entries":
			idem.MaxEntries, err = p.integer(false)
		case "max_bytes":
			idem.MaxBytes, err = p.size()
		case "max_response_bytes":
			idem.MaxResponseBytes, err = p.intSize()
		case "scope_headers":
			idem.ScopeHeaders, err = p.atLeastOne()
		default:
			err = p.d.Errf("unrecognized idempotency option %q", option)
		}
		return err
	})
}

// parseBudget reads the budget block.
func (h *Handler) parseBudget(p args) error {
	b := &h.Budget
	return p.block(func(option string) (err error) {
		switch option {
		case "ratio":
			b.Ratio, err = p.float(true)
		case "burst":
			b.Burst, err = p.float(false)
		case "max_concurrent_hedges":
			b.MaxConcurrentHedges, err = p.integer(true)
		case "cool_down":
			b.CoolDown, err = p.duration(false)
		case "max_cool_down":
			b.MaxCoolDown, err = p.duration(false)
		case "overload_rate":
			b.OverloadRate, err = p.float(false)
		case "overload_window":
			b.OverloadWindow, err = p.integer(false)
		case "breaker_failures":
			b.BreakerFailures, err = p.integer(false)
		case "breaker_open":
			b.BreakerOpen, err = p.duration(false)
		case "tenant_header":
			b.TenantHeader, err = p.one()
		case "tenant_tokens_per_minute":
			var n int
			n, err = p.integer(false)
			b.TenantTokensPerMinute = int64(n)
		default:
			err = p.d.Errf("unrecognized budget option %q", option)
		}
		return err
	})
}

// parseTransport reads the transport block.
func (h *Handler) parseTransport(p args) error {
	if h.Transport == nil {
		h.Transport = &Transport{}
	}
	t := h.Transport
	return p.block(func(option string) (err error) {
		switch option {
		case "dial_timeout":
			t.DialTimeout, err = p.caddyDuration()
		case "response_header_timeout":
			t.ResponseHeaderTimeout, err = p.caddyDuration()
		case "keepalive_idle_timeout":
			t.KeepAliveIdleTimeout, err = p.caddyDuration()
		case "max_idle_conns_per_host":
			t.MaxIdleConnsPerHost, err = p.integer(false)
		case "versions":
			t.Versions, err = p.atLeastOne()
		case "tls_insecure_skip_verify":
			t.TLSInsecureSkipVerify, err = true, p.none()
		case "tls_server_name":
			t.TLSServerName, err = p.one()
		case "tls_trusted_ca_certs":
			t.TLSTrustedCACerts, err = p.atLeastOne()
		default:
			err = p.d.Errf("unrecognized transport option %q", option)
		}
		return err
	})
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

// caddyDuration parses a duration argument of the transport, which keeps
// Caddy's own duration type.
func (p args) caddyDuration() (caddy.Duration, error) {
	d, err := p.duration(false)
	return caddy.Duration(d), err
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
