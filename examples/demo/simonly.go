package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// serveSimOnly serves the simulated upstreams A and B on the ports of
// -sim-ports until ctx ends.
func serveSimOnly(ctx context.Context, w llmsim.Workload, opts options, stdout io.Writer) error {
	ports, err := parseSimPorts(opts.simPorts)
	if err != nil {
		return err
	}
	// A also has a priority tier, for llmhedge-tune's strategy table: a
	// request with "service_tier": "priority" (Messages API: "auto") gets
	// the same median with a lower tail.
	prio := llmsim.PriorityTier(w)
	a := &llmsim.Tiered{Standard: &llmsim.Server{Name: "A", Workload: w}, Priority: &llmsim.Server{Name: "A-priority", Workload: prio}}
	ra, err := a.StartOn("127.0.0.1:" + strconv.Itoa(ports[0]))
	if err != nil {
		return fmt.Errorf("upstream A: %w (choose other ports with -sim-ports, e.g. -sim-ports 0,0)", err)
	}
	defer ra.Close()
	rb, err := (&llmsim.Server{Name: "B", Workload: w}).StartOn("127.0.0.1:" + strconv.Itoa(ports[1]))
	if err != nil {
		return fmt.Errorf("upstream B: %w (choose other ports with -sim-ports, e.g. -sim-ports 0,0)", err)
	}
	defer rb.Close()
	urls := [2]string{ra.URL, rb.URL}
	fmt.Fprintf(stdout, "simulated upstreams (reference workload x%g, true TTFT p95 %s):\n  A %s\n  B %s\n"+
		"A's priority tier (body service_tier=priority; true TTFT p95 %s) is at A's URL.\nCtrl-C to stop.\n",
		opts.scale, w.TrueQuantile(0.95).Round(time.Millisecond/10), urls[0], urls[1], prio.TrueQuantile(0.95).Round(time.Millisecond/10))
	<-ctx.Done()
	return nil
}

// parseSimPorts reads "9001,9002": the ports of A and B, 0 for any.
func parseSimPorts(v string) ([2]int, error) {
	var ports [2]int
	parts := strings.Split(v, ",")
	if len(parts) != 2 {
		return ports, fmt.Errorf("-sim-ports %q: want two ports, A's and B's, e.g. 9001,9002", v)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 0 || n > 65535 {
			return ports, fmt.Errorf("-sim-ports %q: %q is not a port (0 to 65535)", v, p)
		}
		ports[i] = n
	}
	return ports, nil
}
