package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"regexp"
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
	// Base is the URL without a trailing /v1 (what a proxy's upstream URL
	// is: the request path /v1/... is appended to it).
	Base string `json:"base_url"`
	// KeyEnv names the environment variable holding the API key; "" sends
	// no key. The key itself is never printed or written.
	KeyEnv string `json:"key_env,omitempty"`
	// Format is openai (Chat Completions) or anthropic (Messages).
	Format string `json:"format"`
	// Model, when set, replaces the "model" of every request body.
	Model string `json:"model,omitempty"`
}

// Path is the API path of the endpoint's format.
func (e endpoint) Path() string {
	if e.Format == formatAnthropic {
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

// parseEndpoint reads "name=...,url=...,key_env=...,format=...,model=...".
func parseEndpoint(spec string) (endpoint, error) {
	var e endpoint
	var rawURL string
	seen := map[string]bool{}
	for _, field := range strings.Split(spec, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(field), "=")
		if !ok {
			return e, fmt.Errorf("-endpoint %q: %q is not key=value (keys: name, url, key_env, format, model)", spec, field)
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
		default:
			return e, fmt.Errorf("-endpoint %q: unknown key %q (keys: name, url, key_env, format, model)", spec, key)
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
	// The API path is appended later; a base already ending in /v1 (as
	// OpenAI SDKs spell it) must not give /v1/v1.
	e.Base = strings.TrimSuffix(strings.TrimRight(rawURL, "/"), "/v1")
	if e.Name == "" {
		e.Name = u.Host
	}
	if strings.ContainsAny(e.Name, " \t\"'{}") {
		return e, fmt.Errorf("-endpoint %q: name %q must not contain spaces, quotes or braces", spec, e.Name)
	}
	if e.Format == "" {
		e.Format = formatOpenAI
	}
	return e, nil
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
	fs.Var(&endpoints, "endpoint", "`name=...,url=...,key_env=...,format=openai|anthropic[,model=...]`; repeat for each endpoint, the first is the primary")
	fs.StringVar(&o.RequestsFile, "requests", "", "JSONL `file` of requests: a chat body or {\"prompt\": ...} per line (default: a built-in set of short prompts)")
	fs.IntVar(&o.N, "n", 200, fmt.Sprintf("requests sent to EACH endpoint (hard cap, at most %d)", maxRequests))
	fs.IntVar(&o.Concurrency, "concurrency", 4, "requests in flight per endpoint")
	fs.Float64Var(&o.TargetExtra, "target-extra", 0.05, "extra load the hedge may add, as a fraction of requests (0.05 = 5 %)")
	fs.Float64Var(&o.PricePerMTok, "price-per-mtok", 0, "USD per million prompt tokens, for the spend estimate (0: not estimated)")
	fs.StringVar(&o.OutDir, "out", "llmhedge-tune-out", "`directory` for the chart, samples, results and configuration snippets")
	fs.BoolVar(&o.JSON, "json", false, "print the results as JSON on stdout (the plan and progress go to stderr)")
	fs.BoolVar(&o.Yes, "yes", false, "do not ask for confirmation before sending")
	fs.DurationVar(&o.Timeout, "timeout", 2*time.Minute, "deadline of one request, the whole streamed answer included")
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
	for _, e := range o.Endpoints {
		if names[e.Name] {
			errs = append(errs, fmt.Errorf("-endpoint name %q is used twice; give each a distinct name=", e.Name))
		}
		names[e.Name] = true
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
