package main

import (
	"testing"
	"time"
)

func TestHedgeOfOnePair(t *testing.T) {
	const d = 100 * time.Millisecond
	okS := func(ttft, total time.Duration) sample { return sample{Sent: true, TTFT: ttft, Total: total} }
	failS := func(at time.Duration) sample { return sample{Sent: true, Err: "x", Kind: "status 500", FailedAt: at} }
	fatal := failS(5 * time.Millisecond)
	fatal.Fatal = true
	cases := []struct {
		name            string
		a, b            sample
		ttft, total     time.Duration
		ok, started     bool
		raceTTFT        time.Duration
		raceOK, raceHit bool
	}{
		{"primary before the delay", okS(80*ms1, 120*ms1), okS(10*ms1, 50*ms1), 80 * ms1, 120 * ms1, true, false, 10 * ms1, true, true},
		{"backup wins after the delay", okS(900*ms1, 950*ms1), okS(30*ms1, 70*ms1), 130 * ms1, 170 * ms1, true, true, 30 * ms1, true, true},
		{"primary still wins after the delay", okS(120*ms1, 160*ms1), okS(50*ms1, 90*ms1), 120 * ms1, 160 * ms1, true, true, 50 * ms1, true, true},
		{"tie goes to the primary", okS(150*ms1, 160*ms1), okS(50*ms1, 90*ms1), 150 * ms1, 160 * ms1, true, true, 50 * ms1, true, true},
		{"early failure hedges at once", failS(20 * ms1), okS(30*ms1, 70*ms1), 50 * ms1, 90 * ms1, true, true, 30 * ms1, true, true},
		{"late failure hedges at the delay", failS(400 * ms1), okS(30*ms1, 70*ms1), 130 * ms1, 170 * ms1, true, true, 30 * ms1, true, true},
		{"fatal client error is not hedged", fatal, okS(30*ms1, 70*ms1), 0, 0, false, false, 0, false, false},
		{"backup fails", okS(300*ms1, 340*ms1), failS(10 * ms1), 300 * ms1, 340 * ms1, true, true, 300 * ms1, true, true},
		{"both fail", failS(10 * ms1), failS(10 * ms1), 0, 0, false, true, 0, false, true},
		{"backup cut after output: no total", okS(900*ms1, 0), sample{Sent: true, TTFT: 20 * ms1, Err: "cut"}, 120 * ms1, 0, true, true, 20 * ms1, true, true},
	}
	for _, c := range cases {
		ttft, total, ok, started := hedge(c.a, c.b, d)
		if ttft != c.ttft || total != c.total || ok != c.ok || started != c.started {
			t.Errorf("%s: hedge = %v %v %v %v, want %v %v %v %v", c.name, ttft, total, ok, started, c.ttft, c.total, c.ok, c.started)
		}
		rt, _, rok, rstarted := hedge(c.a, c.b, 0)
		if rt != c.raceTTFT || rok != c.raceOK || rstarted != c.raceHit {
			t.Errorf("%s: race-all = %v %v %v, want %v %v %v", c.name, rt, rok, rstarted, c.raceTTFT, c.raceOK, c.raceHit)
		}
	}
}

const ms1 = time.Millisecond

func TestPickDelay(t *testing.T) {
	var primary []sample
	var done []int
	for i := 1; i <= 100; i++ {
		primary = append(primary, sample{Sent: true, TTFT: time.Duration(i)*time.Millisecond + 300*time.Microsecond})
		done = append(done, i-1)
	}
	// p95 of 1.3ms..100.3ms is 95.3ms, rounded up to 96ms so that no more
	// than 5 % of requests exceed it.
	if d, note, ok := pickDelay(primary, done, 0.95); !ok || d != 96*time.Millisecond || note != "" {
		t.Errorf("delay %v %q %v", d, note, ok)
	}
	// Failures count as slower than any answer: 10 % failures push the
	// p95 beyond every answer.
	for i := 0; i < 10; i++ {
		primary[i] = sample{Sent: true, Err: "x", FailedAt: time.Millisecond}
	}
	d, note, ok := pickDelay(primary, done, 0.95)
	if !ok || d != 101*time.Millisecond || note == "" {
		t.Errorf("with failures: delay %v %q %v", d, note, ok)
	}
	if _, _, ok := pickDelay(primary, nil, 0.95); ok {
		t.Error("a delay without samples")
	}
	if got := roundDelay(5230 * time.Microsecond); got != 5300*time.Microsecond {
		t.Errorf("small delays round up to 0.1ms: %v", got)
	}
}
