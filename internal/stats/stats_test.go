package stats

import (
	"testing"
	"time"
)

func TestQuantileNearestRank(t *testing.T) {
	ds := make([]time.Duration, 100)
	for i := range ds {
		ds[i] = time.Duration(100-i) * time.Millisecond // 100ms … 1ms, unsorted
	}
	cases := []struct {
		q    float64
		want time.Duration
	}{
		{0, 1 * time.Millisecond},
		{0.01, 1 * time.Millisecond},
		{0.5, 50 * time.Millisecond},
		{0.95, 95 * time.Millisecond},
		{0.951, 96 * time.Millisecond},
		{0.99, 99 * time.Millisecond},
		{1, 100 * time.Millisecond},
		{2, 100 * time.Millisecond},
	}
	for _, c := range cases {
		if got := Quantile(ds, c.q); got != c.want {
			t.Errorf("Quantile(q=%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if ds[0] != 100*time.Millisecond {
		t.Fatal("Quantile modified its input")
	}
	if Quantile(nil, 0.5) != 0 {
		t.Fatal("Quantile of nothing is not zero")
	}
	three := []time.Duration{3, 1, 2}
	if got := Quantile(three, 0.5); got != 2 {
		t.Fatalf("median of 3 = %v, want 2", got)
	}
}

func TestSummarize(t *testing.T) {
	ds := make([]time.Duration, 1000)
	for i := range ds {
		ds[i] = time.Duration(i+1) * time.Millisecond
	}
	s := Summarize(ds)
	want := Summary{N: 1000, P50: 500 * time.Millisecond, P95: 950 * time.Millisecond, P99: 990 * time.Millisecond, Max: time.Second}
	if s != want {
		t.Fatalf("Summarize = %v, want %v", s, want)
	}
	if (Summarize(nil) != Summary{}) {
		t.Fatal("Summarize(nil) is not zero")
	}
	if got := s.String(); got != "n=1000 p50=500ms p95=950ms p99=990ms max=1s" {
		t.Fatalf("String = %q", got)
	}
}
