package chaos

import (
	"fmt"
	"math/rand"
	"strings"
	"time"
)

// Fault is a scenario's kind of trouble.
type Fault string

// The faults, in the order the report lists them.
const (
	FaultNone          Fault = "none"
	FaultResetBefore   Fault = "reset_before_commit"
	FaultResetAfter    Fault = "reset_after_commit"
	FaultTruncated     Fault = "truncated_event"
	Fault5xx           Fault = "status_5xx"
	Fault429           Fault = "status_429"
	FaultStall         Fault = "stall_past_deadline"
	FaultSlowReader    Fault = "slow_reader"
	FaultDisconnect    Fault = "client_disconnect"
	FaultTwins         Fault = "idempotent_twins"
	FaultCrossCaller   Fault = "cross_caller_key"
	numCallers               = 5
	slowReaderChunks         = 300
	slowReaderPadding        = 4000
	largeChunks              = 300 // with largePadding, 1.2 MB: above max_prefix
	largePadding             = 4000
	defaultConcurrency       = 20
)

// Faults lists every fault with its weight in the mix.
var Faults = []struct {
	Fault  Fault
	Weight int
}{
	{FaultNone, 8}, {FaultResetBefore, 10}, {FaultResetAfter, 10}, {FaultTruncated, 10},
	{Fault5xx, 9}, {Fault429, 8}, {FaultStall, 9}, {FaultSlowReader, 5},
	{FaultDisconnect, 10}, {FaultTwins, 11}, {FaultCrossCaller, 10},
}

// Request is one client request of a scenario, and what came back.
type Request struct {
	ID       string
	Caller   int    // index of the caller's Authorization
	Key      string // Idempotency-Key, "" for none
	Stream   bool
	Plan     Plan
	Shape    Shape
	Body     string
	Slow     bool // read the answer slowly
	CancelAt int  // cancel after this many body bytes; -1 never; 0 before the response
	// The first twin leaves after CancelAt bytes while its twin, which
	// joined its flight, must still get the whole answer.

	// Results.
	Status    int
	StatusMsg string
	Header    map[string][]string
	Got       []byte
	ReadErr   error // the body ended with an error (broken), nil on a clean end
	DoErr     error // no response at all
	Cancelled bool  // the client left on purpose
	Start     time.Time
	Elapsed   time.Duration
}

// Scenario is one unit of the mix: one request, or two that share an
// idempotency key.
type Scenario struct {
	N          int
	Fault      Fault
	Variant    string
	Reqs       []*Request
	Sequential bool // the second request starts after the first ended
}

// authorization is caller c's Authorization header.
func authorization(c int) string { return fmt.Sprintf("Bearer sk-chaos-caller-%d", c) }

// Generate draws n scenarios from seed.
func Generate(seed int64, n int) []*Scenario {
	rng := rand.New(rand.NewSource(seed))
	total := 0
	for _, f := range Faults {
		total += f.Weight
	}
	out := make([]*Scenario, 0, n)
	for i := 0; i < n; i++ {
		pick := rng.Intn(total)
		var fault Fault
		for _, f := range Faults {
			if pick < f.Weight {
				fault = f.Fault
				break
			}
			pick -= f.Weight
		}
		out = append(out, generate(rng, i, fault))
	}
	return out
}

func act(kind string, k int) Action { return Action{Kind: kind, K: k} }

func generate(rng *rand.Rand, n int, fault Fault) *Scenario {
	s := &Scenario{N: n, Fault: fault}
	r := &Request{
		ID:       fmt.Sprintf("s%05d-0", n),
		Caller:   rng.Intn(numCallers),
		Stream:   rng.Intn(4) != 0,
		Shape:    Shape{Chunks: 3 + rng.Intn(20), Padding: rng.Intn(40)},
		Body:     fmt.Sprintf(`{"model":"chaos","stream":%%t,"messages":[{"role":"user","content":"scenario %d"}]}`, n),
		CancelAt: -1,
	}
	if rng.Intn(2) == 0 {
		r.Key = fmt.Sprintf("chaos-key-%05d", n)
	}
	plan := Plan{ByAttempt: map[int]Action{}, Default: act(ActOK, 0)}
	// Which attempt carries the fault, and whether every attempt does.
	all := rng.Intn(3) == 0
	everyAttempt := false
	set := func(a Action) {
		plan.ByAttempt[0] = a
		if all {
			plan.Default = a
			everyAttempt = true
		}
	}
	k := rng.Intn(r.Shape.Chunks)
	switch fault {
	case FaultNone:
		if rng.Intn(2) == 0 { // a slow primary: the hedge races it, both produce
			s.Variant = "hedged"
			plan.ByAttempt[0] = Action{Kind: ActOK, TTFT: Delay + 40*time.Millisecond}
		}
	case FaultResetBefore:
		s.Variant = "early"
		a := act(ActResetEarly, 0)
		if rng.Intn(2) == 0 {
			s.Variant = "after_preamble"
			a = act(ActResetPreamble, 0)
		}
		set(a)
	case FaultResetAfter, FaultTruncated:
		kind := ActResetAfter
		if fault == FaultTruncated {
			kind = ActTruncate
		} else if k == 0 {
			k = 1
		}
		if !r.Stream && rng.Intn(2) == 0 {
			// Larger than max_prefix (1 MiB): the engine streams it, and the
			// cut comes after the first MiB.
			s.Variant = "large_json"
			r.Shape = Shape{Chunks: largeChunks, Padding: largePadding}
			k = largeChunks - 1 - rng.Intn(8)
		}
		set(act(kind, k))
	case Fault5xx:
		codes := []int{500, 502, 503}
		set(act(ActStatus, codes[rng.Intn(len(codes))]))
	case Fault429:
		set(act(ActStatus, 429))
	case FaultStall:
		switch rng.Intn(3) {
		case 0:
			s.Variant = "before_output_one"
			plan.ByAttempt[0] = act(ActStall, 0)
		case 1:
			s.Variant = "before_output_all"
			plan.ByAttempt[0] = act(ActStall, 0)
			plan.Default = act(ActStall, 0)
		default:
			s.Variant = "mid_stream"
			plan.ByAttempt[0] = act(ActStallAfter, 1+rng.Intn(r.Shape.Chunks-1))
		}
	case FaultSlowReader:
		r.Stream = true
		r.Slow = true
		r.Shape = Shape{Chunks: slowReaderChunks, Padding: slowReaderPadding}
	case FaultDisconnect:
		r.Shape.Pace = 2 * time.Millisecond
		if rng.Intn(4) == 0 {
			s.Variant = "before_response"
			r.CancelAt = 0
			plan.ByAttempt[0] = Action{Kind: ActOK, TTFT: 20 * time.Millisecond}
		} else {
			s.Variant = "mid_body"
			r.CancelAt = 1 + rng.Intn(len(r.Shape.expectedSize()))
		}
	case FaultTwins, FaultCrossCaller:
		r.Key = fmt.Sprintf("chaos-shared-%05d", n)
		r.Shape.Pace = 3 * time.Millisecond
		r.Shape.Chunks = 10 + rng.Intn(10)
		switch rng.Intn(4) {
		case 0:
			s.Variant = "winner_resets"
			plan.ByAttempt[0] = act(ActResetAfter, 1+rng.Intn(5))
		case 1:
			if fault == FaultTwins && r.Stream {
				s.Variant = "first_leaves"
				r.CancelAt = 1 + rng.Intn(len(r.Shape.expectedSize())/2)
			}
		}
		twin := *r
		twin.ID = fmt.Sprintf("s%05d-1", n)
		twin.CancelAt = -1
		if fault == FaultCrossCaller {
			twin.Caller = (r.Caller + 1 + rng.Intn(numCallers-1)) % numCallers
			s.Sequential = rng.Intn(2) == 0
			if s.Sequential {
				s.Variant = strings.TrimPrefix(s.Variant+"+sequential", "+")
			}
		}
		s.Reqs = append(s.Reqs, r, &twin)
	}
	if s.Variant == "" && everyAttempt {
		s.Variant = "all_attempts"
	} else if everyAttempt {
		s.Variant += "+all_attempts"
	}
	r.Body = fmt.Sprintf(r.Body, r.Stream)
	r.Plan = plan
	if len(s.Reqs) == 2 {
		s.Reqs[1].Body, s.Reqs[1].Plan, s.Reqs[1].Stream = r.Body, plan, r.Stream
		return s
	}
	s.Reqs = []*Request{r}
	return s
}

// expectedSize is a stand-in of the answer's length, for drawing a
// disconnect point inside it (as a string so its len is the count).
func (s Shape) expectedSize() string {
	g := &Generation{ID: "A000000", RequestID: "s00000-0", AuthHash: "00000000", Shape: s, Stream: true}
	return string(g.Expected())
}
