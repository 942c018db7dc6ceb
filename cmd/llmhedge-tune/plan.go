package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

// plan is what the command will send: every endpoint gets the same N
// requests, request i built from source line i mod len(lines).
type plan struct {
	opts *options
	// source describes where the requests come from.
	source string
	// bodies[e][k] is source line k as sent to endpoint e.
	bodies [][][]byte
	// keys[e] is endpoint e's API key ("" for none). Never printed.
	keys []string
}

// newPlan loads the requests, builds every endpoint's bodies and reads the
// keys from the environment, so that every input problem shows up before a
// single request is sent.
func newPlan(o *options) (*plan, error) {
	p := &plan{opts: o}
	var reqs []chatRequest
	if o.RequestsFile != "" {
		var err error
		if reqs, err = loadRequests(o.RequestsFile); err != nil {
			return nil, err
		}
		p.source = fmt.Sprintf("%s (%d requests)", o.RequestsFile, len(reqs))
	} else {
		reqs = builtinRequests()
		p.source = fmt.Sprintf("built-in set of %d short prompts", len(reqs))
	}
	if len(reqs) < o.N {
		p.source += fmt.Sprintf(", request i uses number i mod %d", len(reqs))
	}
	for _, e := range o.Endpoints {
		bodies := make([][]byte, len(reqs))
		for k, r := range reqs {
			b, err := bodyFor(r, e)
			if err != nil {
				return nil, err
			}
			bodies[k] = b
		}
		p.bodies = append(p.bodies, bodies)
		key := ""
		if e.KeyEnv != "" {
			key = os.Getenv(e.KeyEnv)
			if key == "" {
				return nil, fmt.Errorf("endpoint %s: environment variable %s (key_env) is not set or empty", e.Name, e.KeyEnv)
			}
		}
		p.keys = append(p.keys, key)
	}
	return p, nil
}

// body is request i as sent to endpoint e.
func (p *plan) body(e, i int) []byte {
	b := p.bodies[e]
	return b[i%len(b)]
}

// total is the number of requests of the whole run: the hard cap.
func (p *plan) total() int { return p.opts.N * len(p.opts.Endpoints) }

// promptTokens estimates the prompt tokens of the run as body bytes / 4,
// core's rule for tenant budgets, rounded up here (core rounds down) so the
// spend estimate errs high. spend is their price at each endpoint's
// price_in (or -price-per-mtok).
func (p *plan) promptTokens() (tokens int64, spend float64) {
	for e, ep := range p.opts.Endpoints {
		var n int64
		for i := 0; i < p.opts.N; i++ {
			n += estimateTokens(p.body(e, i))
		}
		tokens += n
		spend += float64(n) * ep.PriceIn / 1e6
	}
	return tokens, spend
}

// role names what endpoint i is for.
func role(eps []endpoint, i int) string {
	switch {
	case i == 0:
		return "primary"
	case eps[i].Priority:
		return "priority tier"
	}
	return "secondary"
}

// print writes the plan: endpoints, the hard cap, and the estimated spend.
func (p *plan) print(w io.Writer) {
	o := p.opts
	fmt.Fprintf(w, "Plan: %d requests to each of %d endpoint(s) = %d requests at most (hard cap), %d in flight per endpoint, timeout %v each.\n",
		o.N, len(o.Endpoints), p.total(), o.Concurrency, o.Timeout)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  endpoint\trole\tPOST\tkey\tmodel")
	for i, e := range o.Endpoints {
		key := "(none)"
		if e.KeyEnv != "" {
			key = "$" + e.KeyEnv
		}
		model := e.Model
		if model == "" {
			model = "(from the requests)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", e.Name, role(o.Endpoints, i), e.URL(), key, model)
	}
	tw.Flush()
	fmt.Fprintf(w, "Requests: %s.\n", p.source)
	tokens, spend := p.promptTokens()
	if spend > 0 {
		fmt.Fprintf(w, "Estimated prompt tokens: %s (body bytes / 4); spend ≈ $%.4f at each endpoint's input price (price_in, else -price-per-mtok; output tokens not included).\n",
			thousands(tokens), spend)
	} else {
		fmt.Fprintf(w, "Estimated prompt tokens: %s (body bytes / 4); spend not estimated (set price_in= on the endpoints or -price-per-mtok).\n", thousands(tokens))
	}
	fmt.Fprintf(w, "Results go to %s.\n", o.OutDir)
}

// confirm asks on w and reads the answer from r; only yes proceeds.
func confirm(r io.Reader, w io.Writer) bool {
	fmt.Fprint(w, "Send these requests? [y/N] ")
	answer, _ := bufio.NewReader(r).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return true
	}
	return false
}

// thousands writes n with comma separators: 1234567 -> 1,234,567.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
