package llmsim

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/llmhedge/llmhedge/internal/stats"
)

// Workload is the seeded latency model of a simulated upstream (BENCHMARKS.md, "The reference workload").
//
// A zero field takes its default (see Reference). A field whose default is
// not zero is switched off with a negative value: StallProb < 0 means no
// stalls, Sigma < 0 no jitter (every TTFT is MedianTTFT), TokenGap < 0 no gap
// between tokens, PingEvery < 0 no keep-alive pings. Scale applies to every
// duration of the workload, including PingEvery; it does not apply to the
// wall-clock durations of a Behavior.
type Workload struct {
	// Seed makes the draws reproducible; two workloads with different seeds
	// draw independently.
	Seed int64
	// MedianTTFT is the median of the lognormal TTFT. Default 600ms.
	MedianTTFT time.Duration
	// Sigma is the lognormal sigma (of the natural log of TTFT). Default 0.3.
	Sigma float64
	// StallProb is the probability that a request stalls instead, for a TTFT
	// uniform in [StallMin, StallMax). Default 0.02.
	StallProb float64
	// StallMin and StallMax bound a stall. Defaults 10s and 20s.
	StallMin, StallMax time.Duration
	// Tokens is the number of content tokens in every answer. Default 20.
	Tokens int
	// TokenGap is the time between two tokens. Default 20ms.
	TokenGap time.Duration
	// Scale multiplies every duration (0.05 runs 20x faster). Default 1.
	Scale float64
	// PingEvery is the period of ": ping" comments while a stream waits for
	// its first token. Default 250ms.
	PingEvery time.Duration
}

// Reference returns the reference workload: TTFT lognormal with median 600ms and
// sigma 0.3, a 2% chance of a 10–20s stall instead, 20 tokens 20ms apart,
// pings every 250ms, every duration multiplied by scale (<= 0 means 1).
func Reference(seed int64, scale float64) Workload {
	if scale <= 0 {
		scale = 1
	}
	return Workload{
		Seed:       seed,
		MedianTTFT: 600 * time.Millisecond,
		Sigma:      0.3,
		StallProb:  0.02,
		StallMin:   10 * time.Second,
		StallMax:   20 * time.Second,
		Tokens:     20,
		TokenGap:   20 * time.Millisecond,
		Scale:      scale,
		PingEvery:  250 * time.Millisecond,
	}
}

// Fast returns the fast streaming upstream of the overhead benchmarks of
// every adapter: the first token after 100µs, 20 tokens without gaps, no
// jitter, no stalls, no pings, so that the proxy's own cost dominates.
func Fast() Workload {
	return Workload{Seed: 1, MedianTTFT: 100 * time.Microsecond, Sigma: -1, StallProb: -1, TokenGap: -1, PingEvery: -1}
}

// WithDefaults returns w with every zero field set to its default; negative
// "off" values stay negative (read as none), so WithDefaults is idempotent.
// Durations are not scaled.
func (w Workload) WithDefaults() Workload {
	d := Reference(w.Seed, w.Scale)
	if w.MedianTTFT > 0 {
		d.MedianTTFT = w.MedianTTFT
	}
	switch {
	case w.Sigma < 0:
		d.Sigma = w.Sigma // stays "off", so that WithDefaults is idempotent
	case w.Sigma > 0:
		d.Sigma = w.Sigma
	}
	switch {
	case w.StallProb < 0:
		d.StallProb = w.StallProb
	case w.StallProb > 0:
		d.StallProb = w.StallProb
	}
	if w.StallMin > 0 {
		d.StallMin = w.StallMin
	}
	if w.StallMax > 0 {
		d.StallMax = w.StallMax
	}
	if d.StallMax < d.StallMin {
		d.StallMax = d.StallMin
	}
	if w.Tokens > 0 {
		d.Tokens = w.Tokens
	}
	switch {
	case w.TokenGap < 0:
		d.TokenGap = w.TokenGap
	case w.TokenGap > 0:
		d.TokenGap = w.TokenGap
	}
	if w.PingEvery != 0 {
		d.PingEvery = w.PingEvery
	}
	return d
}

// gap is the token gap with "off" (negative) read as none.
func (w Workload) gap() time.Duration {
	if w.TokenGap < 0 {
		return 0
	}
	return w.TokenGap
}

// Scaled returns d multiplied by the workload's time scale.
func (w Workload) Scaled(d time.Duration) time.Duration {
	s := w.Scale
	if s <= 0 {
		s = 1
	}
	return time.Duration(float64(d) * s)
}

// TTFT returns the time to first token of request requestID on upstream,
// already scaled. The draw is deterministic for (Seed, upstream, requestID)
// and independent across upstreams and request ids.
func (w Workload) TTFT(upstream, requestID string) time.Duration {
	ttft, _ := w.draw(upstream, requestID)
	return ttft
}

// Stalled reports whether the TTFT draw of requestID on upstream is a stall.
func (w Workload) Stalled(upstream, requestID string) bool {
	_, stalled := w.draw(upstream, requestID)
	return stalled
}

// StreamTime returns the time from the first token to the last, scaled:
// (Tokens-1) * TokenGap.
func (w Workload) StreamTime() time.Duration {
	d := w.WithDefaults()
	return d.Scaled(time.Duration(d.Tokens-1) * d.gap())
}

// Total returns the time from the request to its last token, scaled:
// TTFT + (Tokens-1) * TokenGap.
func (w Workload) Total(upstream, requestID string) time.Duration {
	return w.TTFT(upstream, requestID) + w.StreamTime()
}

// draw makes the TTFT draw. The generator is seeded with an FNV-64a hash of
// the triple; it always consumes the same three numbers (stall coin, normal,
// stall length) in the same order, so the non-stalled TTFT of a request does
// not depend on StallProb.
func (w Workload) draw(upstream, requestID string) (time.Duration, bool) {
	d := w.WithDefaults()
	r := rand.New(rand.NewPCG(seedOf(d.Seed, upstream, requestID)))
	coin := r.Float64()
	z := r.NormFloat64()
	u := r.Float64()
	var ttft time.Duration
	stalled := coin < d.StallProb
	if stalled {
		ttft = d.StallMin + time.Duration(u*float64(d.StallMax-d.StallMin))
	} else {
		ttft = time.Duration(float64(d.MedianTTFT) * math.Exp(math.Max(d.Sigma, 0)*z))
	}
	return d.Scaled(ttft), stalled
}

// seedOf hashes (seed, upstream, requestID) into the two words of a PCG seed.
func seedOf(seed int64, upstream, requestID string) (uint64, uint64) {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(seed))
	h.Write(b[:])
	h.Write([]byte(upstream))
	h.Write([]byte{0})
	h.Write([]byte(requestID))
	s1 := h.Sum64()
	h.Write([]byte{1})
	return s1, h.Sum64()
}

// trueQuantileSamples is the size of the synthetic sample behind
// TrueQuantile.
const trueQuantileSamples = 200000

var (
	trueMu    sync.Mutex
	trueCache = map[Workload][]time.Duration{}
)

// TrueQuantile returns the q-quantile (nearest rank, see stats.Quantile) of one
// upstream's TTFT, scaled, estimated from 200,000 draws for a fixed synthetic
// set of request ids. It is the target an adaptive hedge delay should
// converge to. The sorted sample is computed once per workload and cached.
func (w Workload) TrueQuantile(q float64) time.Duration {
	key := w.WithDefaults()
	trueMu.Lock()
	sorted, ok := trueCache[key]
	trueMu.Unlock()
	if !ok {
		sorted = make([]time.Duration, trueQuantileSamples)
		for i := range sorted {
			sorted[i] = key.TTFT("llmsim-true-quantile", "tq-"+strconv.Itoa(i))
		}
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		trueMu.Lock()
		trueCache[key] = sorted
		trueMu.Unlock()
	}
	return stats.QuantileSorted(sorted, q)
}

// NoHedge is the TTFT without hedging: the primary's TTFT a.
func NoHedge(a time.Duration) time.Duration { return a }

// IdealHedge is the TTFT of a perfect hedge at delay d: min(a, d+b), where a
// and b are the TTFTs of the primary and of the backup.
func IdealHedge(a, b, d time.Duration) time.Duration {
	if d+b < a {
		return d + b
	}
	return a
}

// Sequential is the TTFT of sequential failover at timeout d: a if a <= d,
// else d+b (the first attempt is abandoned).
func Sequential(a, b, d time.Duration) time.Duration {
	if a <= d {
		return a
	}
	return d + b
}

// RaceAll is the TTFT of sending every request to both upstreams at once:
// min(a, b), at 100% extra load.
func RaceAll(a, b time.Duration) time.Duration {
	if b < a {
		return b
	}
	return a
}
