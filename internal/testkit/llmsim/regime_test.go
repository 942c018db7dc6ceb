package llmsim

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"
)

func TestRegimeWindows(t *testing.T) {
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g := RegimeShift(epoch)
	// Scaled by 0.05: period 4s, degraded during [2.5s, 4s) of each.
	for _, c := range []struct {
		at   time.Duration
		want bool
	}{{0, false}, {2499 * time.Millisecond, false}, {2500 * time.Millisecond, true}, {3999 * time.Millisecond, true},
		{4 * time.Second, false}, {6600 * time.Millisecond, true}, {-time.Second, false}} {
		if got := g.Degraded(epoch.Add(c.at), 0.05); got != c.want {
			t.Errorf("Degraded(epoch+%v) = %v, want %v", c.at, got, c.want)
		}
	}
	w := g.Windows(epoch.Add(7*time.Second), 0.05)
	if len(w) != 2 || w[0][0] != epoch.Add(2500*time.Millisecond) || w[1][1] != epoch.Add(8*time.Second) {
		t.Fatalf("Windows until epoch+7s = %v, want [2.5s,4s) and [6.5s,8s)", w)
	}
	if (Regime{}).Degraded(epoch, 1) {
		t.Fatal("the zero Regime is degraded, want never")
	}
}

// A Server following a regime multiplies the TTFT of the requests that
// start inside a window, and SetRegime takes effect while it serves.
func TestServerFollowsRegime(t *testing.T) {
	wl := Workload{MedianTTFT: 10 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 1, TokenGap: -1, PingEvery: -1}
	s := (&Server{Name: "A", Workload: wl}).Start()
	defer s.Close()
	ttft := func() time.Duration {
		start := time.Now()
		resp, err := http.Post(s.URL+"/v1/chat/completions", "application/json", bytes.NewReader([]byte(`{"stream":false}`)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(start)
	}
	// Calm and degraded answers are 40x apart, so a loaded machine's
	// scheduling delay cannot pass one for the other.
	if d := ttft(); d >= 200*time.Millisecond {
		t.Fatalf("calm answer after %v, want about 10ms", d)
	}
	// Degraded from the epoch on for a long window.
	s.SetRegime(Regime{Epoch: time.Now(), Period: time.Hour, Window: time.Hour, Factor: 40})
	if d := ttft(); d < 400*time.Millisecond {
		t.Fatalf("degraded answer after %v, want at least 400ms (40 x 10ms)", d)
	}
	if g := s.Regime(); g.Factor != 40 {
		t.Fatalf("Regime().Factor = %v, want 40", g.Factor)
	}
	s.SetRegime(Regime{})
	if d := ttft(); d >= 200*time.Millisecond {
		t.Fatalf("answer after the regime was cleared after %v, want about 10ms", d)
	}
}
