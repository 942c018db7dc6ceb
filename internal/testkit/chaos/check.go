package chaos

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Outcomes of one answer that are correct.
const (
	OutComplete   = "complete"    // exactly one generation's whole answer
	OutCleanError = "clean_error" // a non-2xx OpenAI-shaped JSON error
	OutBroken     = "broken"      // a prefix of one generation that ended broken, after a post-commit failure
	OutCancelled  = "cancelled"   // the client left on purpose
)

// Violations: each is a wrong answer (or a leak) the suite fails on.
const (
	VSpliced          = "spliced" // bytes of two generations in one answer
	VCorrupt          = "corrupt" // not a prefix of the generation it names
	VBrokenAsComplete = "broken_delivered_as_complete"
	VUnexpectedBreak  = "broken_without_fault"     // a healthy generation cut before the deadline
	VCrossCaller      = "cross_caller_replay"      // a generation produced for another caller
	VWrongRequest     = "other_request_generation" // same caller, another request without the same key
	VAuthMismatch     = "upstream_auth_mismatch"   // the upstream got neither the caller's nor its configured Authorization
	VUnknownGen       = "unknown_generation"
	VNoOutput200      = "200_without_output"
	VErrorShape       = "error_not_openai_json"
	VErrorCut         = "error_response_broken" // a whole JSON error, then a broken end instead of a clean one
	VNoResponse       = "no_response"
	VHang             = "hang"
	VTwinsDiffer      = "twins_differ"
	VCanary           = "canary_in_response"
	VNoRetryAfter     = "429_without_retry_after"
)

var genRef = regexp.MustCompile(`chatcmpl-([A-Z][0-9]{6})|chaos ([A-Z][0-9]{6}):`)

// checker judges answers against the registry of generations.
type checker struct {
	reg       *Registry
	byID      map[string]*Request
	authOf    map[string]string // upstream name -> the Authorization its route sets ("" = the caller's)
	canaries  []string
	deadline  time.Duration // the route's timeout
	outcomes  map[Fault]map[string]int
	violation map[string][]string
	where     map[string]map[string]int // violation -> fault/variant/form -> count
}

func newChecker(reg *Registry, scenarios []*Scenario, authOf map[string]string, canaries []string, deadline time.Duration) *checker {
	c := &checker{reg: reg, byID: map[string]*Request{}, authOf: authOf, canaries: canaries, deadline: deadline,
		outcomes: map[Fault]map[string]int{}, violation: map[string][]string{}, where: map[string]map[string]int{}}
	for _, s := range scenarios {
		for _, r := range s.Reqs {
			c.byID[r.ID] = r
		}
	}
	return c
}

func (c *checker) fail(kind string, r *Request, s *Scenario, format string, args ...any) string {
	form := "json"
	if r.Stream {
		form = "stream"
	}
	variant := s.Variant
	if variant == "" {
		variant = "-"
	}
	msg := fmt.Sprintf("%s (%s/%s, %s, status %d, %d bytes): ", r.ID, s.Fault, variant, form, r.Status, len(r.Got)) + fmt.Sprintf(format, args...)
	c.violation[kind] = append(c.violation[kind], msg)
	if c.where[kind] == nil {
		c.where[kind] = map[string]int{}
	}
	c.where[kind][string(s.Fault)+"/"+variant+"/"+form]++
	return kind
}

func (c *checker) count(f Fault, outcome string) {
	if c.outcomes[f] == nil {
		c.outcomes[f] = map[string]int{}
	}
	c.outcomes[f][outcome]++
}

// scenario checks every answer of s, then what twins must share.
func (c *checker) scenario(s *Scenario) {
	outs := make([]string, len(s.Reqs))
	gens := make([]*Generation, len(s.Reqs))
	for i, r := range s.Reqs {
		outs[i], gens[i] = c.answer(s, r)
		c.count(s.Fault, outs[i])
		c.canaryInResponse(s, r)
	}
	if s.Fault == FaultTwins && len(s.Reqs) == 2 {
		a, b := s.Reqs[0], s.Reqs[1]
		if outs[0] == OutComplete && outs[1] == OutComplete && !bytes.Equal(a.Got, b.Got) {
			c.fail(VTwinsDiffer, b, s, "twins got different answers: %s and %s", gens[0].ID, gens[1].ID)
		}
	}
}

// answer classifies one answer: a correct outcome, or a violation kind.
func (c *checker) answer(s *Scenario, r *Request) (string, *Generation) {
	if r.DoErr != nil && !r.Cancelled {
		if strings.Contains(r.DoErr.Error(), "deadline exceeded") {
			return c.fail(VHang, r, s, "no end after %v", requestDeadline), nil
		}
		return c.fail(VNoResponse, r, s, "no response: %v", r.DoErr), nil
	}
	refs := map[string]bool{}
	var order []string
	for _, m := range genRef.FindAllSubmatch(r.Got, -1) {
		id := string(m[1]) + string(m[2])
		if !refs[id] {
			refs[id] = true
			order = append(order, id)
		}
	}
	if len(order) > 1 {
		return c.fail(VSpliced, r, s, "generations %v in one answer", order), nil
	}
	var g *Generation
	if len(order) == 1 {
		if g = c.reg.Lookup(order[0]); g == nil {
			return c.fail(VUnknownGen, r, s, "generation %s was never produced", order[0]), nil
		}
		if v := c.owner(s, r, g); v != "" {
			return v, g
		}
	}
	if r.Cancelled {
		if g != nil && r.Status/100 == 2 && !bytes.HasPrefix(g.Expected(), withoutKeepAlives(r.Got)) {
			return c.fail(VCorrupt, r, s, "the cancelled answer is not a prefix of %s", g.ID), g
		}
		return OutCancelled, g
	}
	if r.Status/100 != 2 {
		var e struct {
			Error *struct {
				Message *string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(r.Got, &e) != nil || e.Error == nil || e.Error.Message == nil {
			return c.fail(VErrorShape, r, s, "body %q (read error %v)", clip(r.Got), r.ReadErr), g
		}
		if r.ReadErr != nil {
			return c.fail(VErrorCut, r, s, "the whole error %q came, then the response broke: %v", clip(r.Got), r.ReadErr), g
		}
		if r.Status == 429 && g != nil && len(r.Header["Retry-After"]) == 0 {
			return c.fail(VNoRetryAfter, r, s, "the upstream's 429 (%s) lost its Retry-After", g.ID), g
		}
		return OutCleanError, g
	}
	got := withoutKeepAlives(r.Got)
	if r.ReadErr == nil && earlyErrorEvent(got) {
		// The race's headers went out before a winner (early headers),
		// and every attempt failed: an error event, which SDKs raise. It
		// may carry the last upstream's error, which names its generation
		// (owner checked above).
		return OutCleanError, g
	}
	if g == nil {
		if r.ReadErr == nil {
			return c.fail(VBrokenAsComplete, r, s, "a 2xx answer without any generation ended cleanly: %q", clip(r.Got)), nil
		}
		return c.fail(VNoOutput200, r, s, "a 2xx answer broke after %v before any byte of output: %q (%v)", r.Elapsed.Round(time.Millisecond), clip(r.Got), r.ReadErr), nil
	}
	want := g.Expected()
	switch {
	case bytes.Equal(got, want):
		return OutComplete, g
	case !bytes.HasPrefix(want, got):
		at := commonPrefix(want, got)
		return c.fail(VCorrupt, r, s, "differs from %s at byte %d: got %q, want %q", g.ID, at, clip(got[at:]), clip(want[at:])), g
	case r.ReadErr == nil:
		return c.fail(VBrokenAsComplete, r, s, "%s (%s) ended cleanly after %d of %d bytes, last %q",
			g.ID, g.Action, len(got), len(want), tailOf(got)), g
	case g.postCommitFault() || sinceFlightStart(s, r) >= c.deadline-c.deadline/10:
		return OutBroken, g
	default:
		return c.fail(VUnexpectedBreak, r, s, "%s (%s, healthy) broke after %d of %d bytes at %v: %v",
			g.ID, g.Action, len(r.Got), len(want), r.Elapsed.Round(time.Millisecond), r.ReadErr), g
	}
}

// keepAlive is the comment a gateway sends while a streaming race whose
// headers went out early (early_headers) is still undecided.
var keepAlive = []byte(": keep-alive\n\n")

// withoutKeepAlives returns b without the keep-alive comments before the
// winner's bytes.
func withoutKeepAlives(b []byte) []byte {
	for bytes.HasPrefix(b, keepAlive) {
		b = b[len(keepAlive):]
	}
	return b
}

// earlyErrorEvent reports whether b (keep-alives removed) is one error
// event, as the gateway ends a stream whose headers went out before every
// attempt failed: `data: {"error":{"message":...}}` (OpenAI) or that
// after `event: error` (Anthropic).
func earlyErrorEvent(b []byte) bool {
	b = bytes.TrimPrefix(b, []byte("event: error\n"))
	if !bytes.HasPrefix(b, []byte("data: ")) || !bytes.HasSuffix(b, []byte("\n\n")) {
		return false
	}
	var e struct {
		Error *struct {
			Message *string `json:"message"`
		} `json:"error"`
	}
	return json.Unmarshal(bytes.TrimSpace(b[len("data: "):]), &e) == nil && e.Error != nil && e.Error.Message != nil
}

// owner checks that generation g may go to r: produced for r, or for the
// same caller's request under the same idempotency key; and that the
// upstream received the Authorization it should have.
func (c *checker) owner(s *Scenario, r *Request, g *Generation) string {
	o := c.byID[g.RequestID]
	if o == nil {
		return c.fail(VUnknownGen, r, s, "%s was produced for unknown request %q", g.ID, g.RequestID)
	}
	if o.Caller != r.Caller {
		return c.fail(VCrossCaller, r, s, "%s was produced for %s of caller %d; this is caller %d", g.ID, o.ID, o.Caller, r.Caller)
	}
	if o != r && (r.Key == "" || o.Key != r.Key) {
		return c.fail(VWrongRequest, r, s, "%s was produced for %s", g.ID, o.ID)
	}
	want := c.authOf[g.Upstream]
	if want == "" {
		want = authorization(o.Caller)
	}
	if g.AuthHash != AuthHash(want) {
		return c.fail(VAuthMismatch, r, s, "%s: upstream %s received Authorization with hash %s, want %s", g.ID, g.Upstream, g.AuthHash, AuthHash(want))
	}
	return ""
}

func (c *checker) canaryInResponse(s *Scenario, r *Request) {
	var all bytes.Buffer
	all.WriteString(r.StatusMsg + "\n")
	for k, vs := range r.Header {
		all.WriteString(k + ": " + strings.Join(vs, ",") + "\n")
	}
	all.Write(r.Got)
	for _, canary := range c.canaries {
		if bytes.Contains(all.Bytes(), []byte(canary)) {
			c.fail(VCanary, r, s, "the response carries the canary %s…", canary[:len(canary)/2])
		}
	}
}

// sinceFlightStart is how long after the scenario's first request r ended:
// a twin that joined another's flight shares that flight's deadline.
func sinceFlightStart(s *Scenario, r *Request) time.Duration {
	first := r.Start
	for _, o := range s.Reqs {
		if !o.Start.IsZero() && o.Start.Before(first) {
			first = o.Start
		}
	}
	return r.Start.Add(r.Elapsed).Sub(first)
}

func commonPrefix(a, b []byte) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

func clip(b []byte) string {
	if len(b) > 160 {
		return string(b[:160]) + "…"
	}
	return string(b)
}

func tailOf(b []byte) string {
	if len(b) > 80 {
		return "…" + string(b[len(b)-80:])
	}
	return string(b)
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
