package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// API formats an endpoint speaks.
const (
	formatOpenAI    = "openai"
	formatAnthropic = "anthropic"
)

// Limits of the flags.
const (
	// maxRequests is the hard cap of -n: a typo must not turn into a large bill.
	maxRequests    = 10000
	maxConcurrency = 256
)

// endpoint is one -endpoint flag.
type endpoint struct {
	// Name labels the endpoint in the report and the snippets. Default: the
	// URL's host.
	Name string `json:"name"`
	// Base is the URL without the API path and without a trailing /v1
	// (what a proxy's upstream URL is: the request path /v1/... is
	// appended to it).
	Base string `json:"base_url"`
	// KeyEnv names the environment variable holding the API key; "" sends
	// no key. The key itself is never printed or written.
	KeyEnv string `json:"key_env,omitempty"`
	// Format is openai (Chat Completions) or anthropic (Messages).
	Format string `json:"format"`
	// Model, when set, replaces the "model" of every request body.
	Model string `json:"model,omitempty"`
	// Body holds extra top-level fields set in every request body
	// (body.KEY=VALUE), e.g. service_tier for a provider's priority tier.
	Body map[string]json.RawMessage `json:"body,omitempty"`
	// PriceIn and PriceOut are USD per million input and output tokens.
	PriceIn  float64 `json:"price_in_per_mtok,omitempty"`
	PriceOut float64 `json:"price_out_per_mtok,omitempty"`
	// Priority marks the provider's priority tier (tier=priority): it is
	// measured on its own for the strategy table and is never a hedge
	// target.
	Priority bool `json:"priority_tier,omitempty"`

	// priceInSet: price_in was given (else -price-per-mtok applies).
	priceInSet bool
}

// Path is the API path of the endpoint's format.
func (e endpoint) Path() string { return apiPath(e.Format) }

// apiPath is the API path of a format.
func apiPath(format string) string {
	if format == formatAnthropic {
		return "/v1/messages"
	}
	return "/v1/chat/completions"
}

// URL is where requests go.
func (e endpoint) URL() string { return e.Base + e.Path() }

// options are the parsed command line.
type options struct {
	Endpoints    []endpoint
	RequestsFile string
	N            int
	Concurrency  int
	TargetExtra  float64
	PricePerMTok float64
	OutDir       string
	JSON         bool
	Yes          bool
	Timeout      time.Duration
	// TargetP99 is the TTFT p99 the strategy table's winner must meet (0:
	// no target, no winner).
	TargetP99 time.Duration
}

// endpointList collects repeated -endpoint flags.
type endpointList []endpoint

func (l *endpointList) String() string {
	names := make([]string, len(*l))
	for i, e := range *l {
		names[i] = e.Name
	}
	return strings.Join(names, ",")
}

func (l *endpointList) Set(spec string) error {
	e, err := parseEndpoint(spec)
	if err != nil {
		return err
	}
	*l = append(*l, e)
	return nil
}

// envName is a portable environment variable name; snippets embed it in
// Caddy, Traefik and Envoy placeholders, so it must need no quoting.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// endpointKeys lists the keys of -endpoint for error messages.
const endpointKeys = "name, url, model, key_env, format, body.FIELD, price_in, price_out, tier"

// bodyPrefix starts an extra body field's key: body.service_tier=priority.
const bodyPrefix = "body."

// reservedBodyFields are set by the command itself (stream) or by other
// keys (model=), or are the requests themselves.
var reservedBodyFields = map[string]string{
	"stream":   "every request streams",
	"model":    "use model=",
	"messages": "the messages come from -requests",
}

// parseEndpoint reads "name=...,url=...,model=...,key_env=...,format=...,
// body.FIELD=...,price_in=...,price_out=...,tier=...".
func parseEndpoint(spec string) (endpoint, error) {
	var e endpoint
	var rawURL string
	seen := map[string]bool{}
	for _, field := range strings.Split(spec, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(field), "=")
		if !ok {
			return e, fmt.Errorf("-endpoint %q: %q is not key=value (keys: %s)", spec, field, endpointKeys)
		}
		if seen[key] {
			return e, fmt.Errorf("-endpoint %q: %s given twice", spec, key)
		}
		seen[key] = true
		switch key {
		case "name":
			e.Name = value
		case "url":
			rawURL = value
		case "key_env":
			if !envName.MatchString(value) {
				return e, fmt.Errorf("-endpoint %q: key_env %q is not an environment variable name (the key itself goes in the environment, not on the command line)", spec, value)
			}
			e.KeyEnv = value
		case "format":
			if value != formatOpenAI && value != formatAnthropic {
				return e, fmt.Errorf("-endpoint %q: format %q: want openai or anthropic", spec, value)
			}
			e.Format = value
		case "model":
			e.Model = value
		case "price_in", "price_out":
			price, err := strconv.ParseFloat(value, 64)
			if err != nil || price < 0 || price > 1e6 {
				return e, fmt.Errorf("-endpoint %q: %s %q: want USD per million tokens, e.g. 2.5", spec, key, value)
			}
			if key == "price_in" {
				e.PriceIn, e.priceInSet = price, true
			} else {
				e.PriceOut = price
			}
		case "tier":
			switch value {
			case "priority":
				e.Priority = true
			case "standard":
			default:
				return e, fmt.Errorf("-endpoint %q: tier %q: want standard or priority", spec, value)
			}
		default:
			name, isBody := strings.CutPrefix(key, bodyPrefix)
			if !isBody {
				return e, fmt.Errorf("-endpoint %q: unknown key %q (keys: %s)", spec, key, endpointKeys)
			}
			if name == "" {
				return e, fmt.Errorf("-endpoint %q: %q names no body field", spec, key)
			}
			if why, reserved := reservedBodyFields[name]; reserved {
				return e, fmt.Errorf("-endpoint %q: %s cannot be set: %s", spec, key, why)
			}
			if e.Body == nil {
				e.Body = map[string]json.RawMessage{}
			}
			e.Body[name] = bodyValue(value)
		}
	}
	if rawURL == "" {
		return e, fmt.Errorf("-endpoint %q: url= is required", spec)
	}
	u, err := url.Parse(rawURL)
	switch {
	case err != nil:
		return e, fmt.Errorf("-endpoint %q: url: %v", spec, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return e, fmt.Errorf("-endpoint %q: url %q: scheme must be http or https", spec, rawURL)
	case u.Host == "":
		return e, fmt.Errorf("-endpoint %q: url %q has no host", spec, rawURL)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return e, fmt.Errorf("-endpoint %q: url %q must not have a query, fragment or user info (put the key in key_env)", spec, rawURL)
	}
	if e.Name == "" {
		e.Name = u.Host
	}
	if strings.ContainsAny(e.Name, " \t\"'{}") {
		return e, fmt.Errorf("-endpoint %q: name %q must not contain spaces, quotes or braces", spec, e.Name)
	}
	if e.Format == "" {
		e.Format = formatOpenAI
	}
	base, err := baseURL(rawURL, e.Format)
	if err != nil {
		return e, fmt.Errorf("-endpoint %q: %v", spec, err)
	}
	e.Base = base
	return e, nil
}

// baseURL applies the URL rule: a URL whose path already ends with the
// format's API path (/v1/chat/completions, /v1/messages) is used as is;
// any other URL is a base, from which a trailing /v1 (as OpenAI SDKs spell
// it) is dropped, and the API path is appended. The base is returned.
func baseURL(rawURL, format string) (string, error) {
	trimmed := strings.TrimRight(rawURL, "/")
	if base, full := strings.CutSuffix(trimmed, apiPath(format)); full {
		return base, nil
	}
	for _, other := range []string{formatOpenAI, formatAnthropic} {
		if other != format && strings.HasSuffix(trimmed, apiPath(other)) {
			return "", fmt.Errorf("url %q ends with %s, the API path of format %s; add format=%s or give the base URL", rawURL, apiPath(other), other, other)
		}
	}
	return strings.TrimSuffix(trimmed, "/v1"), nil
}

// bodyValue reads an extra body field's value: JSON when it is valid JSON
// (a number, true, false, null, a quoted string, an object without commas),
// else the text as a JSON string.
func bodyValue(value string) json.RawMessage {
	if json.Valid([]byte(value)) {
		return json.RawMessage(value)
	}
	return mustJSON(value)
}

// parseFlags parses args. Errors say what is wrong with which flag.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	var endpoints endpointList
	fs := flag.NewFlagSet("llmhedge-tune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHeader)
		fs.PrintDefaults()
	}
	fs.Var(&endpoints, "endpoint", "`name=...,url=...,model=...[,key_env=...,format=openai|anthropic,body.FIELD=...,price_in=...,price_out=...,tier=priority]`; repeat for each endpoint, the first is the primary. "+
		"model= is required unless every -requests line names its model. url is a base URL (the format's API path /v1/chat/completions or /v1/messages is appended, a trailing /v1 dropped) or the full API URL, used as is")
	fs.StringVar(&o.RequestsFile, "requests", "", "JSONL `file` of requests: a chat body or {\"prompt\": ...} per line (default: a built-in set of short prompts)")
	fs.IntVar(&o.N, "n", 200, fmt.Sprintf("requests sent to EACH endpoint (hard cap, at most %d)", maxRequests))
	fs.IntVar(&o.Concurrency, "concurrency", 4, "requests in flight per endpoint")
	fs.Float64Var(&o.TargetExtra, "target-extra", 0.05, "extra load the hedge may add, as a fraction of requests (0.05 = 5 %)")
	fs.Float64Var(&o.PricePerMTok, "price-per-mtok", 0, "USD per million input tokens of every endpoint without price_in=, for the spend estimate and the strategy costs (0: not estimated)")
	fs.StringVar(&o.OutDir, "out", "llmhedge-tune-out", "`directory` for the chart, samples, results and configuration snippets")
	fs.BoolVar(&o.JSON, "json", false, "print the results as JSON on stdout (the plan and progress go to stderr)")
	fs.BoolVar(&o.Yes, "yes", false, "do not ask for confirmation before sending")
	fs.DurationVar(&o.Timeout, "timeout", 2*time.Minute, "deadline of one request, the whole streamed answer included")
	fs.DurationVar(&o.TargetP99, "target-p99", 0, "TTFT p99 to meet: the strategy table names the cheapest strategy that meets it (0: no winner)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (every setting is a flag; see -h)", fs.Arg(0))
	}
	o.Endpoints = endpoints
	var errs []error
	if len(o.Endpoints) == 0 {
		errs = append(errs, errors.New("at least one -endpoint is required"))
	}
	names := map[string]bool{}
	priority := 0
	for i, e := range o.Endpoints {
		if names[e.Name] {
			errs = append(errs, fmt.Errorf("-endpoint name %q is used twice; give each a distinct name=", e.Name))
		}
		names[e.Name] = true
		if e.Priority {
			priority++
			if i == 0 {
				errs = append(errs, fmt.Errorf("-endpoint %s: the first endpoint is the primary (standard tier); put the tier=priority endpoint after it", e.Name))
			}
		}
		if !e.priceInSet {
			o.Endpoints[i].PriceIn = o.PricePerMTok
		}
	}
	if priority > 1 {
		errs = append(errs, fmt.Errorf("%d endpoints have tier=priority; give it to one", priority))
	}
	if o.TargetP99 < 0 {
		errs = append(errs, fmt.Errorf("-target-p99 %v must not be negative", o.TargetP99))
	}
	if o.N < 1 || o.N > maxRequests {
		errs = append(errs, fmt.Errorf("-n %d: want 1 to %d requests per endpoint", o.N, maxRequests))
	}
	if o.Concurrency < 1 || o.Concurrency > maxConcurrency {
		errs = append(errs, fmt.Errorf("-concurrency %d: want 1 to %d", o.Concurrency, maxConcurrency))
	}
	if !(o.TargetExtra > 0 && o.TargetExtra < 1) {
		errs = append(errs, fmt.Errorf("-target-extra %v: want a fraction between 0 and 1 (0.05 = 5 %%)", o.TargetExtra))
	}
	if o.PricePerMTok < 0 {
		errs = append(errs, fmt.Errorf("-price-per-mtok %v must not be negative", o.PricePerMTok))
	}
	if o.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("-timeout %v must be positive", o.Timeout))
	}
	if o.OutDir == "" {
		errs = append(errs, errors.New("-out must name a directory"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return o, nil
}
