package core

import (
	"strings"
	"testing"
	"time"
)

// recordedSink keeps every sample as "name{v1,v2} value".
type recordedSink struct {
	defs    []MetricDef
	samples []string
}

func (s *recordedSink) Record(metric int, labels []string, v float64) {
	s.samples = append(s.samples, s.defs[metric].Name+"{"+strings.Join(labels, ",")+"} "+formatSample(v))
}

func formatSample(v float64) string {
	return time.Duration(v * float64(time.Second)).String()
}

// hedgeWonReport is a request whose hedge on B won after A stalled.
func hedgeWonReport() *Report {
	return &Report{
		Route: "chat", Outcome: OutcomeOK, Status: 200, Hedged: true, Winner: 1,
		TTFT: 80 * time.Millisecond, Total: 200 * time.Millisecond, Delay: 50 * time.Millisecond,
		HedgesStarted: 1, Denials: []string{DenyBudget}, WastedPromptTokens: 12, KeyHash: "0123456789abcdef", Idempotency: IdempotencyLed,
		Attempts: []AttemptReport{
			{Index: 0, Upstream: "A", Role: RolePrimary, Result: ResultLost, Status: 200, CancelLatency: time.Millisecond},
			{Index: 1, Upstream: "B", Role: RoleHedge, Result: ResultWon, Status: 200, Started: 50 * time.Millisecond, TTFT: 30 * time.Millisecond},
		},
	}
}

func TestReportMetrics(t *testing.T) {
	sink := &recordedSink{defs: MetricDefs()}
	ReportMetrics(hedgeWonReport(), sink)
	want := []string{
		"llm_hedge_requests_total{chat,ok} 1s",
		"llm_hedge_request_duration_seconds{chat,ok} 200ms",
		"llm_hedge_attempts_total{chat,A,primary,lost} 1s",
		"llm_hedge_loser_cancel_seconds{chat,A} 1ms",
		"llm_hedge_attempts_total{chat,B,hedge,won} 1s",
		"llm_hedge_upstream_ttft_seconds{chat,B} 30ms",
		"llm_hedge_hedges_started_total{chat} 1s",
		"llm_hedge_hedge_denials_total{chat,budget} 1s",
		"llm_hedge_wasted_prompt_tokens_total{chat} 12s",
		"llm_hedge_ttft_seconds{chat} 80ms",
		"llm_hedge_hedge_wins_total{chat,B,hedge} 1s",
	}
	if got := strings.Join(sink.samples, "\n"); got != strings.Join(want, "\n") {
		t.Errorf("samples\n%s\nwant\n%s", got, strings.Join(want, "\n"))
	}

	replay := &Report{Route: "chat", Outcome: OutcomeReplayed, Status: 200, Winner: -1}
	sink.samples = nil
	ReportMetrics(replay, sink)
	if got := strings.Join(sink.samples, "\n"); !strings.Contains(got, "llm_hedge_idempotent_requests_total{chat,replayed} 1s") {
		t.Errorf("got = %q, want it to contain \"llm_hedge_idempotent_requests_total{chat,replayed} 1s\"", got)
	} else if strings.Contains(got, "llm_hedge_ttft_seconds") {
		t.Errorf("got = %q, want it not to contain \"llm_hedge_ttft_seconds\"", got)
	}
}

// TestMetricDefs: every sample names a declared metric with one value per
// label, and the declared names follow Prometheus' conventions.
func TestMetricDefs(t *testing.T) {
	defs := MetricDefs()
	seen := map[string]bool{}
	for i, d := range defs {
		if seen[d.Name] {
			t.Errorf("metric %d: %s declared twice", i, d.Name)
		}
		seen[d.Name] = true
		if !strings.HasPrefix(d.Name, "llm_hedge_") {
			t.Errorf("metric %s: want the llm_hedge_ prefix", d.Name)
		}
		isTotal := strings.HasSuffix(d.Name, "_total")
		if isTotal != (d.Type == MetricCounter) {
			t.Errorf("metric %s is a %s: want _total on counters only", d.Name, d.Type)
		}
		if (d.Type == MetricHistogram) != (len(d.Buckets) > 0) {
			t.Errorf("metric %s is a %s with %d buckets", d.Name, d.Type, len(d.Buckets))
		}
		if d.Type == MetricHistogram && !strings.HasSuffix(d.Name, "_seconds") {
			t.Errorf("histogram %s: want seconds", d.Name)
		}
	}
	if defs[MetricCurrentDelay].Name != "llm_hedge_current_delay_seconds" {
		t.Errorf("defs[MetricCurrentDelay].Name = %q, want \"llm_hedge_current_delay_seconds\"", defs[MetricCurrentDelay].Name)
	} else if defs[MetricHedgesInFlight].Name != "llm_hedge_hedges_in_flight" {
		t.Errorf("defs[MetricHedgesInFlight].Name = %q, want \"llm_hedge_hedges_in_flight\"", defs[MetricHedgesInFlight].Name)
	}
	sink := &countingSink{defs: defs, t: t}
	r := hedgeWonReport()
	ReportMetrics(r, sink)
	r.Outcome = OutcomeJoined
	ReportMetrics(r, sink)
}

type countingSink struct {
	defs []MetricDef
	t    *testing.T
}

func (s *countingSink) Record(metric int, labels []string, v float64) {
	if d := s.defs[metric]; len(labels) != len(d.Labels) || d.Type == MetricGauge {
		s.t.Errorf("%s (%s) recorded with %d label values, want %d", d.Name, d.Type, len(labels), len(d.Labels))
	}
}

func TestReportLogFields(t *testing.T) {
	fields := ReportLogFields(hedgeWonReport())
	var keys []string
	byKey := map[string]LogField{}
	for _, f := range fields {
		keys = append(keys, f.Key)
		byKey[f.Key] = f
	}
	want := "route outcome status hedged attempts hedges_started delay_ms total_ms winner_attempt winner_upstream winner_role ttft_ms denials wasted_prompt_tokens idempotency_key_hash idempotency attempt_list"
	if got := strings.Join(keys, " "); got != want {
		t.Errorf("keys %s\nwant %s", got, want)
	}
	if _, ok := byKey["early_headers"]; ok {
		t.Errorf("early_headers logged for a race that held its headers")
	}
	early := hedgeWonReport()
	early.EarlyHeaders = true
	if f := ReportLogFields(early); len(f) < 13 || f[12].Key != "early_headers" || !f[12].Bool {
		t.Errorf("early_headers is not logged after ttft_ms when the headers went out early")
	}
	if f := byKey["winner_attempt"]; f.Kind != LogInt {
		t.Errorf("f.Kind = %v, want %v", f.Kind, LogInt)
	} else if f.Int != 1 {
		t.Errorf("f.Int = %v, want 1", f.Int)
	}
	if f := byKey["winner_upstream"]; f.Str != "B" {
		t.Errorf("winner_upstream = %q, want B", f.Str)
	}
	if f := byKey["ttft_ms"]; f.Kind != LogMillis {
		t.Errorf("f.Kind = %v, want %v", f.Kind, LogMillis)
	} else if f.Millis != 80 {
		t.Errorf("f.Millis = %v, want 80", f.Millis)
	}
	list := byKey["attempt_list"].Objects
	if len(list) != 2 {
		t.Fatalf("attempt_list has %d attempts, want 2", len(list))
	}
	var loser []string
	for _, f := range list[0] {
		loser = append(loser, f.Key)
	}
	if got := strings.Join(loser, " "); got != "index upstream role result status started_ms cancel_ms" {
		t.Errorf("the loser's keys %s, want index upstream role result status started_ms cancel_ms", got)
	}

	none := ReportLogFields(&Report{Route: "chat", Outcome: OutcomeUpstreamError, Status: 502, Winner: -1})
	for _, f := range none {
		if strings.HasPrefix(f.Key, "winner") {
			t.Errorf("f.Key = %q, want it not to start with \"winner\"", f.Key)
		} else if f.Key == "ttft_ms" {
			t.Errorf("f.Key = \"ttft_ms\", want != \"ttft_ms\"")
		} else if f.Key == "idempotency_key_hash" {
			t.Errorf("f.Key = \"idempotency_key_hash\", want != \"idempotency_key_hash\"")
		}
	}
}
