package llmsim

import (
	"sync/atomic"
	"time"
)

// Regime is the regime-shift workload: inside a window of every period an
// upstream's TTFT is multiplied by Factor (it degrades, as a provider does
// when a region's queue fills or a deployment rolls), outside it the
// upstream follows its Workload. Period, Window and Offset are workload
// durations: the Server's Workload.Scale applies to them as to its TTFT.
type Regime struct {
	// Epoch is the wall-clock time periods are counted from.
	Epoch time.Time
	// Period, Window: the upstream is degraded during [Offset,
	// Offset+Window) of every Period after Epoch.
	Period, Window, Offset time.Duration
	// Factor multiplies the TTFT drawn for a request that starts inside
	// the window (the request's start decides).
	Factor float64
}

// RegimeShift is the reference regime shift: 8x slower for 30s of every
// 80s, the window closing each period (calm first, from epoch on).
func RegimeShift(epoch time.Time) Regime {
	return Regime{Epoch: epoch, Period: 80 * time.Second, Window: 30 * time.Second, Offset: 50 * time.Second, Factor: 8}
}

// Degraded reports whether a request starting at `at` is inside a window,
// with the regime's durations scaled by scale (<= 0 means 1). The zero
// Regime is never degraded.
func (g Regime) Degraded(at time.Time, scale float64) bool {
	if g.Period <= 0 || g.Window <= 0 || g.Factor <= 0 {
		return false
	}
	period, start, end := g.scaled(scale)
	since := at.Sub(g.Epoch)
	if since < 0 {
		return false
	}
	phase := since % period
	return phase >= start && phase < end
}

// Windows returns the degraded windows, in wall-clock time, that begin
// before `until` (scaled by scale), the first one from Epoch on.
func (g Regime) Windows(until time.Time, scale float64) [][2]time.Time {
	if g.Period <= 0 || g.Window <= 0 || g.Factor <= 0 {
		return nil
	}
	period, start, end := g.scaled(scale)
	var out [][2]time.Time
	for p := g.Epoch; p.Add(start).Before(until); p = p.Add(period) {
		out = append(out, [2]time.Time{p.Add(start), p.Add(end)})
	}
	return out
}

func (g Regime) scaled(scale float64) (period, start, end time.Duration) {
	if scale <= 0 {
		scale = 1
	}
	period = time.Duration(float64(g.Period) * scale)
	start = time.Duration(float64(g.Offset) * scale)
	end = start + time.Duration(float64(g.Window)*scale)
	return period, start, end
}

// apply returns ttft as the regime has it for a request starting at at.
func (g *Regime) apply(ttft time.Duration, at time.Time, scale float64) time.Duration {
	if g == nil || !g.Degraded(at, scale) {
		return ttft
	}
	return time.Duration(float64(ttft) * g.Factor)
}

// regimeSlot holds a Server's regime; SetRegime may change it while the
// Server serves.
type regimeSlot struct{ p atomic.Pointer[Regime] }

// SetRegime makes the Server follow g from now on (a zero Regime: its
// Workload only). Safe while serving, so one upstream can run a calm and
// then a shifting series of requests.
func (s *Server) SetRegime(g Regime) {
	if g.Factor <= 0 {
		s.regime.p.Store(nil)
		return
	}
	s.regime.p.Store(&g)
}

// Regime returns the regime the Server follows (the zero Regime: none).
func (s *Server) Regime() Regime {
	if g := s.regime.p.Load(); g != nil {
		return *g
	}
	return Regime{}
}
