package main

import (
	"encoding/json"
	"fmt"
	"net"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	_ "github.com/llmhedge/llmhedge/caddymodule"
)

// site is one variant served by the in-process Caddy.
type site struct {
	name   string
	url    string
	hedged bool
	delay  time.Duration // 0: adaptive
}

// startCaddy loads a Caddy config with three servers on free loopback ports.
func startCaddy(upA, upB string, delay time.Duration) ([]site, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	sites := []site{
		{name: "caddy reverse_proxy", url: fmt.Sprintf("http://127.0.0.1:%d", ports[0])},
		{name: "llm_hedge fixed delay", url: fmt.Sprintf("http://127.0.0.1:%d", ports[1]), hedged: true, delay: delay},
		{name: "llm_hedge adaptive", url: fmt.Sprintf("http://127.0.0.1:%d", ports[2]), hedged: true},
	}
	hostport := func(u string) string { return u[len("http://"):] }
	upstreams := []map[string]any{{"url": upA, "name": "A"}, {"url": upB, "name": "B"}}
	server := func(port int, handler map[string]any) map[string]any {
		return map[string]any{
			"listen":          []string{fmt.Sprintf("127.0.0.1:%d", port)},
			"routes":          []any{map[string]any{"handle": []any{handler}}},
			"automatic_https": map[string]any{"disable": true},
		}
	}
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{
			"plain": server(ports[0], map[string]any{
				"handler":        "reverse_proxy",
				"flush_interval": -1,
				"upstreams":      []any{map[string]any{"dial": hostport(upA)}, map[string]any{"dial": hostport(upB)}},
				"load_balancing": map[string]any{"selection_policy": map[string]any{"policy": "round_robin"}},
			}),
			"fixed": server(ports[1], map[string]any{
				"handler": "llm_hedge", "route": "fixed", "upstreams": upstreams,
				"delay": map[string]any{"fixed": delay.String()},
			}),
			"adaptive": server(ports[2], map[string]any{
				"handler": "llm_hedge", "route": "adaptive", "upstreams": upstreams,
				"delay": map[string]any{"mode": "adaptive", "fixed": (2 * delay).String(), "min": "1ms"},
			}),
		}}},
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	if err := caddy.Load(raw, true); err != nil {
		return nil, fmt.Errorf("starting caddy: %w", err)
	}
	return sites, nil
}

func stopCaddy() { _ = caddy.Stop() }

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
