// Package corehandler builds core's hedging handler for the yaegistress
// tests. The tests run this same source compiled (the control) and
// interpreted by Yaegi v0.16.1, so the interpreter executes the real core
// code, from this constructor down to every attempt goroutine.
package corehandler

import (
	"net/http"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
)

// New returns core's handler for two upstreams named A and B at the URLs a
// and b, hedging after a fixed delay. Every attempt goes through transport.
// observe, if not nil, receives each request's outcome, the number of
// attempts it started beyond the first and the winning upstream's name (""
// when none won). Its type is unnamed so that the interpreted New converts
// to the same Go func type as the compiled one.
func New(a, b string, delay time.Duration, transport http.RoundTripper,
	observe func(outcome string, hedges int, winner string)) (http.Handler, error) {
	cfg := config.Config{
		Route: "yaegistress",
		Upstreams: []config.UpstreamConfig{
			{Name: "A", URL: a},
			{Name: "B", URL: b},
		},
		Delay:       config.DelayConfig{Mode: config.DelayFixed, Fixed: config.Duration(delay)},
		MaxAttempts: 2,
	}
	opts := core.Options{Transport: transport}
	if observe != nil {
		opts.Observer = core.ObserverFunc(func(r *core.Report) {
			winner := ""
			if w := r.WinnerAttempt(); w != nil {
				winner = w.Upstream
			}
			observe(r.Outcome, r.HedgesStarted, winner)
		})
	}
	h, err := core.New(cfg, opts)
	if err != nil {
		return nil, err
	}
	return h, nil
}
