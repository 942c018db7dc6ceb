// Package metricscheck checks an adapter's scrape against core.MetricDefs,
// so that the Caddy module, the Envoy server and the Traefik plugin are
// held to the same llm_hedge_* names, types and label names after the same
// traffic (Traffic).
package metricscheck

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmhedge/llmhedge/core"
)

// Traffic is what every adapter's scrape test sends through a route that
// hedges upstream A with upstream B (llmsim servers named A and B): two
// streaming chat requests, one by one,
//
//  1. with A stalling (X-Sim-Behavior "A=stall"): B's hedge wins, A loses;
//  2. with no behavior: A answers before the delay.
//
// The test waits until both are observed, then scrapes.
const Traffic = "request 1: A=stall, B's hedge wins; request 2: A answers"

// optional are the families Traffic does not produce (no request is denied
// a hedge, none is replayed or joined, no fleet is configured, no answer
// is invalid): checked when present.
var optional = map[string]bool{
	"llm_hedge_hedge_denials_total":              true,
	"llm_hedge_idempotent_requests_total":        true,
	"llm_hedge_fleet_up":                         true,
	"llm_hedge_fleet_operation_errors_total":     true,
	"llm_hedge_fleet_operation_duration_seconds": true,
	"llm_hedge_fleet_replicas":                   true,
	"llm_hedge_fleet_eviction_policy_safe":       true,
	"llm_hedge_invalid_answers_total":            true,
}

// Parse parses a Prometheus text exposition.
func Parse(t testing.TB, text string) map[string]*dto.MetricFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parsing the scrape: %v", err)
	}
	return families
}

// Check checks the scrape text of an adapter (source names it in
// failures) after Traffic on route with the given hedge delay: every
// family of core.MetricDefs is there (but the optional ones) with its type
// and exactly its label names, no other llm_hedge_* family is there but
// the adapter's own (extra), and the values are Traffic's.
func Check(t testing.TB, source, text, route string, delaySeconds float64, extra ...string) {
	t.Helper()
	families := Parse(t, text)
	known := map[string]bool{}
	for _, name := range extra {
		known[name] = true
	}
	for _, def := range core.MetricDefs() {
		known[def.Name] = true
		f, ok := families[def.Name]
		if !ok {
			if !optional[def.Name] {
				t.Errorf("%s: no %s", source, def.Name)
			}
			continue
		}
		if got := strings.ToLower(f.GetType().String()); got != def.Type {
			t.Errorf("%s: %s is a %s, want a %s", source, def.Name, got, def.Type)
		}
		want := sortedCopy(def.Labels)
		for _, m := range f.GetMetric() {
			if got := labelNames(m); strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("%s: %s has labels %v, want %v", source, def.Name, got, want)
				break
			}
		}
		if def.Type == core.MetricHistogram {
			checkBuckets(t, source, def, f)
		}
	}
	for name := range families {
		if strings.HasPrefix(name, "llm_hedge_") && !known[name] {
			t.Errorf("%s: %s is not one of core.MetricDefs", source, name)
		}
	}

	with := func(pairs ...string) map[string]string {
		m := map[string]string{"route": route}
		for i := 0; i+1 < len(pairs); i += 2 {
			m[pairs[i]] = pairs[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		// Both requests, whatever their outcome: a client that closes the
		// stream at [DONE] may be counted client_gone.
		{"llm_hedge_requests_total", with(), 2},
		{"llm_hedge_attempts_total", with("upstream", "A", "role", "primary", "result", "lost"), 1},
		{"llm_hedge_attempts_total", with("upstream", "B", "role", "hedge", "result", "won"), 1},
		{"llm_hedge_attempts_total", with("upstream", "A", "role", "primary", "result", "won"), 1},
		{"llm_hedge_hedges_started_total", with(), 1},
		{"llm_hedge_hedge_wins_total", with("upstream", "B", "role", "hedge"), 1},
		{"llm_hedge_ttft_seconds", with(), 2},
		{"llm_hedge_upstream_ttft_seconds", with("upstream", "A"), 1},
		{"llm_hedge_upstream_ttft_seconds", with("upstream", "B"), 1},
		{"llm_hedge_request_duration_seconds", with(), 2},
		{"llm_hedge_loser_cancel_seconds", with("upstream", "A"), 1},
		{"llm_hedge_current_delay_seconds", with(), delaySeconds},
		{"llm_hedge_hedges_in_flight", with(), 0},
	} {
		got, found := Value(families, tc.name, tc.labels)
		switch {
		case !found:
			t.Errorf("%s: no %s%v", source, tc.name, tc.labels)
		case math.Abs(got-tc.want) > 1e-9:
			t.Errorf("%s: %s%v = %v, want %v", source, tc.name, tc.labels, got, tc.want)
		}
	}
	if got, _ := Value(families, "llm_hedge_wasted_prompt_tokens_total", with()); got <= 0 {
		t.Errorf("%s: llm_hedge_wasted_prompt_tokens_total = %v, want > 0 (A's lost attempt)", source, got)
	}
}

// Value sums the samples of family name whose labels include every pair
// of want (a counter or gauge value, or a histogram's count).
func Value(families map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := families[name]
	if !ok {
		return 0, false
	}
	sum, found := 0.0, false
	for _, m := range f.GetMetric() {
		matched := 0
		for _, pair := range m.GetLabel() {
			if v, ok := want[pair.GetName()]; ok && v == pair.GetValue() {
				matched++
			}
		}
		if matched != len(want) {
			continue
		}
		found = true
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, found
}

func checkBuckets(t testing.TB, source string, def core.MetricDef, f *dto.MetricFamily) {
	t.Helper()
	for _, m := range f.GetMetric() {
		var got []string
		for _, b := range m.GetHistogram().GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) {
				got = append(got, fmt.Sprint(b.GetUpperBound()))
			}
		}
		var want []string
		for _, b := range def.Buckets {
			want = append(want, fmt.Sprint(b))
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: %s has buckets %v, want %v", source, def.Name, got, want)
			return
		}
	}
}

func labelNames(m *dto.Metric) []string {
	var names []string
	for _, pair := range m.GetLabel() {
		names = append(names, pair.GetName())
	}
	sort.Strings(names)
	return names
}

func sortedCopy(s []string) []string {
	c := append([]string(nil), s...)
	sort.Strings(c)
	return c
}
