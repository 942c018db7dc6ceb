package llmsim

import (
	"math"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/stats"
)

func TestTTFTDeterministic(t *testing.T) {
	w := Reference(7, 1)
	for i := 0; i < 100; i++ {
		id := "req-" + strconv.Itoa(i)
		if a, b := w.TTFT("A", id), w.TTFT("A", id); a != b {
			t.Fatalf("%s: two draws differ: %v %v", id, a, b)
		}
		if a, b := w.TTFT("A", id), Reference(7, 1).TTFT("A", id); a != b {
			t.Fatalf("%s: equal workloads differ: %v %v", id, a, b)
		}
	}
	if Reference(7, 1).TTFT("A", "x") == Reference(8, 1).TTFT("A", "x") {
		t.Fatal("different seeds gave the same draw")
	}
}

func TestTTFTScaled(t *testing.T) {
	full, fast := Reference(3, 1), Reference(3, 0.05)
	for i := 0; i < 50; i++ {
		id := strconv.Itoa(i)
		want := time.Duration(float64(full.TTFT("B", id)) * 0.05)
		if got := fast.TTFT("B", id); absDur(got-want) > time.Microsecond {
			t.Fatalf("%s: scaled TTFT %v, want %v", id, got, want)
		}
	}
	if got, want := fast.StreamTime(), 19*time.Millisecond; got != want {
		t.Fatalf("scaled stream time %v, want %v", got, want)
	}
	if got := fast.Total("B", "1") - fast.TTFT("B", "1"); got != fast.StreamTime() {
		t.Fatalf("Total - TTFT = %v, want %v", got, fast.StreamTime())
	}
}

// Independence across upstreams: the correlation of log TTFTs of two
// upstreams over the same ids is near zero, and equal draws are rare.
func TestTTFTIndependentAcrossUpstreams(t *testing.T) {
	w := Reference(11, 1)
	w.StallProb = -1
	const n = 20000
	xs, ys := make([]float64, n), make([]float64, n)
	same := 0
	for i := 0; i < n; i++ {
		id := "r" + strconv.Itoa(i)
		a, b := w.TTFT("A", id), w.TTFT("B", id)
		if a == b {
			same++
		}
		xs[i], ys[i] = math.Log(float64(a)), math.Log(float64(b))
	}
	if same > 0 {
		t.Fatalf("%d identical draws across upstreams", same)
	}
	if r := correlation(xs, ys); math.Abs(r) > 0.03 {
		t.Fatalf("correlation of A and B draws %.4f, want ~0", r)
	}
	// Consecutive ids of one upstream are independent too.
	if r := correlation(xs[1:], xs[:n-1]); math.Abs(r) > 0.03 {
		t.Fatalf("lag-1 correlation %.4f, want ~0", r)
	}
	// Stall draws of A and B are independent: both stall ~ 0.02^2.
	w.StallProb = 0.02
	both, stallA := 0, 0
	for i := 0; i < n; i++ {
		id := "r" + strconv.Itoa(i)
		sa, sb := w.Stalled("A", id), w.Stalled("B", id)
		if sa {
			stallA++
		}
		if sa && sb {
			both++
		}
	}
	// Independent: 0.02² of n = 8 expected; allow 4 standard deviations.
	if float64(both) > 0.0004*n+4*math.Sqrt(0.0004*n) {
		t.Fatalf("%d of %d requests stalled on both upstreams", both, n)
	}
	if stallA == 0 {
		t.Fatal("no stalls")
	}
}

func TestLognormalMedianAndSigma(t *testing.T) {
	w := Reference(1, 1)
	w.StallProb = -1
	const n = 20000
	logs := make([]float64, n)
	for i := 0; i < n; i++ {
		logs[i] = math.Log(w.TTFT("A", "m"+strconv.Itoa(i)).Seconds())
	}
	sort.Float64s(logs)
	median := math.Exp(logs[n/2])
	if math.Abs(median-0.6)/0.6 > 0.02 {
		t.Fatalf("median TTFT %.4fs, want 0.6s ±2%%", median)
	}
	mean, sd := meanSD(logs)
	if math.Abs(mean-math.Log(0.6)) > 0.01 {
		t.Fatalf("mean log TTFT %.4f, want %.4f", mean, math.Log(0.6))
	}
	if math.Abs(sd-0.3) > 0.01 {
		t.Fatalf("sigma %.4f, want 0.3", sd)
	}
}

func TestStallRate(t *testing.T) {
	w := Reference(2, 1)
	const n = 20000
	stalls := 0
	for i := 0; i < n; i++ {
		id := "s" + strconv.Itoa(i)
		d := w.TTFT("A", id)
		if w.Stalled("A", id) {
			stalls++
			if d < 10*time.Second || d >= 20*time.Second {
				t.Fatalf("stall of %v outside [10s, 20s)", d)
			}
		} else if d >= 10*time.Second {
			t.Fatalf("non-stalled draw of %v", d)
		}
	}
	rate := float64(stalls) / n
	// 0.02 ± 4 standard deviations (sd = sqrt(0.02*0.98/20000) ≈ 0.001).
	if math.Abs(rate-0.02) > 0.004 {
		t.Fatalf("stall rate %.4f, want 0.02", rate)
	}
}

// The non-stalled TTFT of a request does not depend on StallProb, so
// experiments that vary the stall rate compare the same base draws.
func TestStallProbKeepsBaseDraws(t *testing.T) {
	a, b := Reference(5, 1), Reference(5, 1)
	b.StallProb = -1
	for i := 0; i < 1000; i++ {
		id := strconv.Itoa(i)
		if !a.Stalled("A", id) && a.TTFT("A", id) != b.TTFT("A", id) {
			t.Fatalf("%s: %v vs %v", id, a.TTFT("A", id), b.TTFT("A", id))
		}
	}
}

func TestWithDefaults(t *testing.T) {
	got := Workload{}.WithDefaults()
	if got != Reference(0, 1) {
		t.Fatalf("zero workload defaults to %+v, want %+v", got, Reference(0, 1))
	}
	off := Workload{Sigma: -1, StallProb: -1, TokenGap: -1, PingEvery: -1, MedianTTFT: time.Second}.WithDefaults()
	if off.Sigma >= 0 || off.StallProb >= 0 || off.TokenGap >= 0 || off.PingEvery >= 0 {
		t.Fatalf("negative values did not stay off: %+v", off)
	}
	if again := off.WithDefaults(); again != off {
		t.Fatalf("WithDefaults is not idempotent: %+v then %+v", off, again)
	}
	if off.StreamTime() != 0 {
		t.Fatalf("no token gap: stream time %v", off.StreamTime())
	}
	if d := (Workload{Sigma: -1, StallProb: -1, MedianTTFT: time.Second}).TTFT("A", "x"); d != time.Second {
		t.Fatalf("TTFT without jitter %v, want 1s", d)
	}
}

func TestTrueQuantile(t *testing.T) {
	w := Reference(9, 0.05)
	p50 := w.TrueQuantile(0.5)
	// The median of the mixture is a little above the lognormal median.
	if want := 30 * time.Millisecond; absDur(p50-want) > want/50 {
		t.Fatalf("true p50 %v, want ~%v", p50, want)
	}
	// p99 falls inside the stall range: 2% of requests stall.
	if p99 := w.TrueQuantile(0.99); p99 < 500*time.Millisecond || p99 > time.Second {
		t.Fatalf("true p99 %v, want a scaled stall in [0.5s, 1s]", p99)
	}
	// p95 of a mixture with 2% stalls is the lognormal's 0.95/0.98 quantile:
	// median * exp(0.3 * z(0.9694)) with z ≈ 1.872.
	want := time.Duration(float64(30*time.Millisecond) * math.Exp(0.3*1.872))
	if p95 := w.TrueQuantile(0.95); absDur(p95-want) > want/50 {
		t.Fatalf("true p95 %v, want ~%v", p95, want)
	}
	if w.TrueQuantile(0.95) != w.TrueQuantile(0.95) {
		t.Fatal("TrueQuantile is not stable")
	}
}

func TestPeers(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		a, b, d                      time.Duration
		noHedge, ideal, seq, raceAll time.Duration
	}{
		{a: 500 * ms, b: 400 * ms, d: 800 * ms, noHedge: 500 * ms, ideal: 500 * ms, seq: 500 * ms, raceAll: 400 * ms},
		{a: 15000 * ms, b: 600 * ms, d: 800 * ms, noHedge: 15000 * ms, ideal: 1400 * ms, seq: 1400 * ms, raceAll: 600 * ms},
		{a: 1000 * ms, b: 600 * ms, d: 800 * ms, noHedge: 1000 * ms, ideal: 1000 * ms, seq: 1400 * ms, raceAll: 600 * ms},
		{a: 1000 * ms, b: 100 * ms, d: 800 * ms, noHedge: 1000 * ms, ideal: 900 * ms, seq: 900 * ms, raceAll: 100 * ms},
	}
	for _, c := range cases {
		if got := NoHedge(c.a); got != c.noHedge {
			t.Errorf("NoHedge(%v) = %v", c.a, got)
		}
		if got := IdealHedge(c.a, c.b, c.d); got != c.ideal {
			t.Errorf("IdealHedge(%v, %v, %v) = %v, want %v", c.a, c.b, c.d, got, c.ideal)
		}
		if got := Sequential(c.a, c.b, c.d); got != c.seq {
			t.Errorf("Sequential(%v, %v, %v) = %v, want %v", c.a, c.b, c.d, got, c.seq)
		}
		if got := RaceAll(c.a, c.b); got != c.raceAll {
			t.Errorf("RaceAll(%v, %v) = %v, want %v", c.a, c.b, got, c.raceAll)
		}
	}
}

// The reference workload shows the effect hedging is for: the ideal hedge at
// the true p95 cuts p99 from a stall to about d + median.
func TestReferencePeersOverDraws(t *testing.T) {
	w := Reference(42, 1)
	d := w.TrueQuantile(0.95)
	var none, ideal, seq []time.Duration
	for i := 0; i < 20000; i++ {
		id := strconv.Itoa(i)
		a, b := w.TTFT("A", id), w.TTFT("B", id)
		none = append(none, NoHedge(a))
		ideal = append(ideal, IdealHedge(a, b, d))
		seq = append(seq, Sequential(a, b, d))
	}
	sn, si, ss := stats.Summarize(none), stats.Summarize(ideal), stats.Summarize(seq)
	t.Logf("d=%v\nno hedge   %v\nideal      %v\nsequential %v", d, sn, si, ss)
	if sn.P99 < 10*time.Second {
		t.Fatalf("no-hedge p99 %v, want a stall", sn.P99)
	}
	if si.P99 > 2500*time.Millisecond {
		t.Fatalf("ideal-hedge p99 %v, want < 2.5s", si.P99)
	}
	if ss.P99 < si.P99 {
		t.Fatalf("sequential p99 %v beat the ideal hedge %v", ss.P99, si.P99)
	}
}

func correlation(xs, ys []float64) float64 {
	mx, sx := meanSD(xs)
	my, sy := meanSD(ys)
	var c float64
	for i := range xs {
		c += (xs[i] - mx) * (ys[i] - my)
	}
	return c / float64(len(xs)) / (sx * sy)
}

func meanSD(xs []float64) (float64, float64) {
	var s, ss float64
	for _, x := range xs {
		s += x
	}
	m := s / float64(len(xs))
	for _, x := range xs {
		ss += (x - m) * (x - m)
	}
	return m, math.Sqrt(ss / float64(len(xs)))
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// A request id's second arrival at a server draws for "id#2": a draw of
// its own, not the first arrival's again.
func TestRepeatedRequestDrawsAgain(t *testing.T) {
	w := Reference(1, 1)
	if got := drawID("req-1", 1); got != "req-1" {
		t.Fatalf("first arrival draws for %q, want req-1", got)
	}
	second := drawID("req-1", 2)
	if second != "req-1#2" {
		t.Fatalf("second arrival draws for %q, want req-1#2", second)
	}
	same := 0
	for i := 0; i < 100; i++ {
		id := "r" + strconv.Itoa(i)
		if w.TTFT("A", id) == w.TTFT("A", drawID(id, 2)) {
			same++
		}
	}
	if same != 0 {
		t.Fatalf("%d of 100 second arrivals drew the first arrival's TTFT, want 0", same)
	}
}
