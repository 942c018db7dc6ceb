package core

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
	"github.com/llmhedge/llmhedge/core/redact"
)

// ErrStreamAborted is returned by Handle when the winner failed after its
// answer had started; the client's response is incomplete and the adapter
// should end it abruptly (e.g. panic(http.ErrAbortHandler) in net/http).
var ErrStreamAborted = errors.New("llmhedge: upstream stream failed after commit")

// Options are the parts an adapter supplies.
type Options struct {
	// Transport sends every upstream attempt. Default http.DefaultTransport.
	Transport http.RoundTripper
	// Clock drives delays, deadlines and budgets. Default SystemClock.
	Clock Clock
	// Observer receives one Report per request. Optional.
	Observer Observer
	// State holds what outlives one configuration (TTFT estimators, budgets,
	// breakers, the idempotency store). Default: a new State for cfg.
	// Adapters that reload configuration keep it to carry the learning over.
	State *State
	// Store replaces the in-memory store of completed idempotent responses.
	Store Store
	// Fleet shares keyed requests with the other replicas (see NewFleet);
	// nil: this replica alone. Adapters pass one when Config.Fleet is set.
	Fleet *Fleet
	// Switches are the process's kill switches (its admin surface's); nil:
	// none but the fleet's. One table per process, kept across reloads.
	Switches *Switches
	// Tracer traces requests: a span per request and per attempt, and
	// each attempt's own traceparent; nil: no spans, and the client's
	// trace headers go to every attempt unchanged. Optional.
	Tracer Tracer
	// Log receives the fields of the engine's rare log lines (the spend
	// cap reached); nil: the Fleet's Log, if any. Optional.
	Log func(fields []LogField)
}

// Hedger runs hedged requests for one route. It is safe for concurrent use.
type Hedger struct {
	// cfg and opts are pointers so that reading one of their fields under
	// Yaegi does not copy the whole struct into a fresh frame slot.
	cfg   *config.Config
	opts  *Options
	state *State
	// bases[i] is cfg.Upstreams[i].URL parsed once: parsing it per attempt
	// was a visible share of the interpreted cost under Traefik.
	bases []*url.URL
	// rewritesModel: some upstream sets "model", so bodies must be JSON.
	rewritesModel bool
	// keyHeader is cfg.Idempotency.Header in canonical form.
	keyHeader string
	// systemClock: opts.Clock is SystemClock, read directly (see now).
	systemClock bool
	// methods holds cfg.Methods as spelled, for a lookup without a loop.
	methods map[string]bool
	// rootBase[i]: upstream i's URL has no path, so the client's path is
	// used as it is.
	rootBase []bool
	// plainBase[i]: upstream i's URL has no path, no escaped path and no
	// query, and it edits no headers: an attempt to it takes the client's
	// path and query as they are (attemptRequest's short way).
	plainBase []bool
	// tenantCaps: tenants have a hedge budget, so requests name theirs.
	tenantCaps bool
	// idempotencyTTL is cfg.Idempotency.TTL (read on every request).
	idempotencyTTL time.Duration
	// secrets are the configured header values, redacted from error text.
	secrets []string
	// publicNames[i] names upstream i in answers to clients (see
	// publicUpstreamName).
	publicNames []string
	// scopeHeaders is cfg.Idempotency.ScopeHeaders in canonical form.
	scopeHeaders []string
	// passedCredentials[i] are the credential headers upstream i gets from
	// the caller unchanged (it neither sets nor deletes them).
	passedCredentials [][]string
	// routeScope is the route's part of every idempotency identity (see
	// routeScope): two routes sharing a fleet never share an answer.
	routeScope string
	// validation is the route's validity checks, parsed (validate.go).
	validation *validation
	// earlyHeaders is cfg.EarlyHeaders, the grace time (0: off; see
	// earlyheaders.go).
	earlyHeaders time.Duration
	// fastest: the route ranks its upstreams (primary fastest; see
	// planRoute). An ordered route skips the routing code altogether.
	fastest bool
	// transport is opts.Transport; health, estimators, overload and
	// bucket are the state's, each read per request with one selector
	// (under Yaegi each selector of a chain is a frame slot).
	transport  http.RoundTripper
	health     []*upstreamHealth
	estimators []*ttftEstimator
	overload   *overloadWindow
	bucket     *hedgeBucket
	// fleet is opts.Fleet (nil: no fleet).
	fleet    *Fleet
	switches *Switches // the process's kill switches (Options.Switches), nil for none
	// What delayInForce loads per request, addressed once at New (under
	// Yaegi each selector of a chain is a frame slot): &switches.count,
	// nil without switches, and &state.share.switches.set.
	switchCount   *int64
	fleetSwitches *int32
	// spendCap is the route's hourly spend cap in tokens (0: none).
	spendCap int64
	// attachKey is fleetAttachKey (with a fleet).
	attachKey string
	// upstreamSpans[i] is what a traced attempt's span says of upstream i.
	upstreamSpans []upstreamSpan

	// Read on every request, copied here at New so that the request's
	// path tests one field (under Yaegi each selector and operator is a
	// frame slot, and a call allocates the callee's whole frame):
	// pathPrefixes, the route has some; maxBody is cfg.MaxBody, and
	// bodyReadLimit one byte more (what prepare reads to tell a body over
	// it); validates, the route has validity checks; requestOptions, the
	// route caps tenants or has validity checks (prepareOptions);
	// hedgeStored is cfg.HedgeStoredResponses.
	pathPrefixes   bool
	maxBody        int
	bodyReadLimit  int64
	validates      bool
	requestOptions bool
	hedgeStored    bool
	// adaptiveDelay: cfg.Delay.Mode is adaptive; else every delay is
	// fixedDelay, cfg.Delay.Fixed.
	adaptiveDelay bool
	fixedDelay    time.Duration
	// now reads the clock: time.Now with the system clock (see
	// injectedNow).
	now func() time.Time
	// maxAttempts is cfg.MaxAttempts; eventsBuffer, the size of a race's
	// event channel (newRace); timeout: cfg.Timeout is set; maxPrefix is
	// cfg.MaxPrefix, and firstRead how much of a whole answer readWhole
	// reads at first (a pooled buffer's worth, or one byte past MaxPrefix
	// if less).
	maxAttempts  int
	maxPrefix    int
	firstRead    int
	eventsBuffer int
	timeout      bool
	// traced: opts.Tracer is set; observed: opts.Observer is; reports:
	// either is.
	traced   bool
	observed bool
	reports  bool
}

// New validates cfg and returns a Hedger for it.
func New(cfg config.Config, opts Options) (*Hedger, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	publicNames := make([]string, len(cfg.Upstreams))
	for i, u := range cfg.Upstreams {
		publicNames[i] = publicUpstreamName(u, i)
	}
	// Through typed locals: under Yaegi v0.16.1 assigning a composite
	// literal or a compiled value straight to an interface-typed field panics.
	if opts.Transport == nil {
		var t http.RoundTripper = http.DefaultTransport
		opts.Transport = t
	}
	if opts.Clock == nil {
		var c Clock = SystemClock{}
		opts.Clock = c
	}
	if opts.State == nil || !opts.State.fits(cfg) {
		opts.State = NewState(cfg, opts.Clock)
	}
	if opts.Store != nil {
		opts.State.idem.store = opts.Store
	}
	setPreferences(opts.State.router, &cfg) // a reload may change them
	bases := make([]*url.URL, len(cfg.Upstreams))
	for i, u := range cfg.Upstreams {
		base, err := url.Parse(u.URL)
		if err != nil {
			return nil, err // Validate has parsed it already
		}
		bases[i] = base
	}
	rewritesModel := false
	for _, u := range cfg.Upstreams {
		if u.Model != "" {
			rewritesModel = true
		}
	}
	methods := make(map[string]bool)
	for _, m := range cfg.Methods {
		methods[m] = true
	}
	rootBase := make([]bool, len(bases))
	plainBase := make([]bool, len(bases))
	for i, base := range bases {
		rootBase[i] = base.Path == "" || base.Path == "/"
		u := &cfg.Upstreams[i]
		plainBase[i] = rootBase[i] && base.RawPath == "" && base.RawQuery == "" && len(u.DeleteHeaders) == 0 && len(u.SetHeaders) == 0
	}
	_, systemClock := opts.Clock.(SystemClock)
	scopeHeaders := make([]string, len(cfg.Idempotency.ScopeHeaders))
	for i, name := range cfg.Idempotency.ScopeHeaders {
		scopeHeaders[i] = http.CanonicalHeaderKey(name)
	}
	h := &Hedger{cfg: &cfg, opts: &opts, state: opts.State, bases: bases, rewritesModel: rewritesModel,
		keyHeader: http.CanonicalHeaderKey(cfg.Idempotency.Header), systemClock: systemClock,
		methods: methods, rootBase: rootBase, plainBase: plainBase, tenantCaps: cfg.Budget.TenantTokensPerMinute > 0,
		idempotencyTTL: time.Duration(cfg.Idempotency.TTL), secrets: secretsOf(cfg.Upstreams), publicNames: publicNames,
		scopeHeaders: scopeHeaders, routeScope: routeScope(&cfg), passedCredentials: passedCredentials(cfg.Upstreams), earlyHeaders: earlyGrace(&cfg), fleet: opts.Fleet, switches: opts.Switches, validation: newValidation(&cfg),
		fastest: cfg.Primary == config.PrimaryFastest && len(cfg.Upstreams) > 1, spendCap: cfg.Budget.SpendCapTokens()}
	if systemClock {
		h.now = time.Now
	} else {
		h.now = func() time.Time { return injectedNow(h) }
	}
	h.transport = opts.Transport
	h.health = h.state.health
	h.estimators = h.state.estimators
	h.overload = h.state.overload
	h.bucket = h.state.bucket
	h.maxAttempts = cfg.MaxAttempts
	h.maxPrefix = int(cfg.MaxPrefix)
	h.firstRead = bufferSize
	if h.maxPrefix < bufferSize {
		h.firstRead = h.maxPrefix + 1
	}
	// +2: the keep-alive timer (earlyheaders.go); +2: an exploring race's
	// extra attempt and its timer.
	h.eventsBuffer = 2*cfg.MaxAttempts + 8
	h.timeout = cfg.Timeout > 0
	h.traced = opts.Tracer != nil
	h.observed = opts.Observer != nil
	h.reports = h.traced || h.observed
	h.pathPrefixes = len(cfg.PathPrefixes) > 0
	h.maxBody = int(cfg.MaxBody)
	h.bodyReadLimit = int64(cfg.MaxBody) + 1
	h.validates = h.validation.checks != 0
	h.requestOptions = h.tenantCaps || h.validates
	h.hedgeStored = cfg.HedgeStoredResponses
	h.adaptiveDelay = cfg.Delay.Mode == config.DelayAdaptive
	h.fixedDelay = time.Duration(cfg.Delay.Fixed)
	if h.switches != nil {
		h.switchCount = &h.switches.count
	}
	h.fleetSwitches = &h.state.share.switches.set
	if h.fleet != nil {
		h.attachKey = fleetAttachKey(h.fleet, h.cfg, h.spendCap)
	}
	if opts.Tracer != nil {
		h.upstreamSpans = upstreamSpans(bases)
	}
	return h, nil
}

// passedCredentials lists, per upstream, the credential headers it gets
// from the caller unchanged.
func passedCredentials(ups []config.UpstreamConfig) [][]string {
	out := make([][]string, len(ups))
	for i := range ups {
		u := &ups[i]
		for _, name := range redact.CredentialHeaders {
			touched := false
			for k := range u.SetHeaders {
				if strings.EqualFold(k, name) {
					touched = true
				}
			}
			for _, k := range u.DeleteHeaders {
				if strings.EqualFold(k, name) {
					touched = true
				}
			}
			if !touched {
				out[i] = append(out[i], name)
			}
		}
	}
	return out
}

// earlyGrace is cfg's early-headers grace time, 0 when they are off.
func earlyGrace(cfg *config.Config) time.Duration {
	if cfg.EarlyHeaders <= 0 {
		return 0
	}
	return time.Duration(cfg.EarlyHeaders)
}

// publicUpstreamName is how answers to clients name an upstream: by its
// configured name, or by its index when it has the default name (its host,
// which clients need not learn; adapters may have filled it in already).
func publicUpstreamName(u config.UpstreamConfig, index int) string {
	if u.Name == "" || u.Name == config.DefaultUpstreamName(u.URL, index) {
		return "upstream " + strconv.Itoa(index)
	}
	return "upstream " + strconv.Quote(u.Name)
}

// Config returns the configuration in force, defaults filled in.
func (h *Hedger) Config() config.Config { return *h.cfg }

// State returns the shared state, to keep across reloads.
func (h *Hedger) State() *State { return h.state }

// ServeHTTP hedges r and writes the winner to w. A failure after the answer
// started aborts the response with http.ErrAbortHandler, as net/http expects.
func (h *Hedger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h.Handle(w, r); errors.Is(err, ErrStreamAborted) {
		panic(http.ErrAbortHandler)
	}
}

// Handle hedges r and writes the answer to w. It returns ErrStreamAborted
// when the winner failed after its answer started (the response is then
// incomplete), else nil: every other failure is answered to the client.
func (h *Hedger) Handle(w http.ResponseWriter, r *http.Request) error {
	return HandleRequest(h, w, r)
}

// The engine's per-request path is written as functions rather than
// methods, with rare branches in functions of their own: Yaegi v0.16.1
// calls an interpreted method through reflect.MakeFunc and Value.Call
// (about four times the cost of a function call) and allocates every local
// slot of a callee's frame on each call, taken branch or not. Under Traefik
// this halved the interpreter's cost per request.

// HandleRequest is h.Handle(w, r) as a function, for interpreted callers:
// Yaegi calls a method of an interpreted type through reflect.MakeFunc and
// reflect.Value.Call, a function directly (the Traefik plugin calls this
// once per request). It is Handle's body itself, not a wrapper: under
// Yaegi each call costs a frame.
func HandleRequest(h *Hedger, w http.ResponseWriter, r *http.Request) error {
	start := h.now()
	rep := &Report{Request: r, Route: h.cfg.Route, Winner: -1, Start: start}
	if h.traced {
		startTrace(h, r, rep, start)
		if rep.trace != nil {
			// A panic (a handler's abort, a bug) still ends the spans.
			defer endTraceCut(h, rep)
		}
	}
	if h.fleet != nil {
		fleetDeposit(h)
	} else {
		deposit(h.bucket)
	}
	var err error
	p, perr := prepare(h, r)
	switch {
	case perr != nil:
		rejectRequest(h, w, rep, perr)
	case p.clientKey && p.hedgeable && h.idempotencyTTL >= 0:
		err = handleKeyed(h, w, p, rep, start)
	default:
		err = runRace(newRace(h, p, rep, start), w)
	}
	if h.reports {
		report(h, p, rep) // it tells a traced request by rep.trace
	}
	return err
}

// report hands the request's report to the observer and ends its spans.
// (handle's rare branches are functions of their own: under Yaegi every
// slot of a frame is allocated on each call.)
func report(h *Hedger, p *preparedRequest, rep *Report) {
	if p != nil && p.clientKey {
		// A generated key names nothing the client knows: no hash.
		rep.KeyHash = KeyHash(p.key)
	}
	if h.opts.Observer != nil {
		h.opts.Observer.Observe(rep)
	}
	if rep.trace != nil {
		endTrace(h, p, rep)
	}
}

// rejectRequest answers a request that prepare refused.
func rejectRequest(h *Hedger, w http.ResponseWriter, rep *Report, err error) {
	setNoRaceReport(h, w.Header(), OutcomeRejected)
	// A type assertion, not errors.As: under Yaegi compiled errors.As
	// cannot see that an interpreted type implements error.
	if bad, ok := err.(*badRequest); ok {
		rep.Outcome = OutcomeRejected
		rep.Status = bad.status
		writeJSONError(w, bad.status, errTypeInvalidRequest, bad.code, bad.msg)
		return
	}
	rep.Outcome = OutcomeClientGone
	rep.Status = 499
}

// handleKeyed runs a request that carries the client's idempotency key: it
// replays a stored answer, joins a request in flight with the same key, or
// leads its own race and records the answer for the others. Keys are
// scoped to the caller (see idempotencyIdentity): another caller's use of
// the same key is another entry, neither joined, replayed nor a conflict.
func handleKeyed(h *Hedger, w http.ResponseWriter, p *preparedRequest, rep *Report, start time.Time) error {
	r := p.orig
	idem := &h.cfg.Idempotency
	identity := idempotencyIdentity(h, p)
	replay, follow, lead, conflict := h.state.idem.claim(identity, p.fingerprint(), int(idem.MaxResponseBytes))
	switch {
	case conflict:
		rep.Idempotency = IdempotencyRejected
		rep.Outcome = OutcomeRejected
		rep.Status = http.StatusUnprocessableEntity
		setNoRaceReport(h, w.Header(), OutcomeRejected)
		writeJSONError(w, http.StatusUnprocessableEntity, errTypeInvalidRequest, "idempotency_key_reused",
			"this idempotency key was already used with a different request")
		return nil
	case replay != nil:
		rep.Idempotency = IdempotencyReplayed
		rep.Outcome = OutcomeReplayed
		rep.Status = replay.Status
		copyHeader(w.Header(), replay.Header)
		w.Header().Set("Idempotent-Replayed", "true")
		setNoRaceReport(h, w.Header(), OutcomeReplayed)
		w.WriteHeader(replay.Status)
		w.Write(replay.Body)
		return nil
	case follow != nil:
		setNoRaceReport(h, w.Header(), OutcomeJoined)
		status, complete := follow.follow(r.Context(), w)
		rep.Idempotency = IdempotencyJoined
		rep.Outcome = OutcomeJoined
		rep.Status = status
		if !complete && status != http.StatusConflict && r.Context().Err() == nil {
			return ErrStreamAborted
		}
		return nil
	}
	return leadKeyed(h, w, p, rep, start, identity, lead)
}

// fleetIdempotency names what became of a key another replica answered.
func fleetIdempotency(rep *Report) string {
	switch rep.Outcome {
	case OutcomeReplayed:
		return IdempotencyReplayed
	case OutcomeRejected:
		if rep.Status == http.StatusUnprocessableEntity {
			return IdempotencyRejected
		}
	}
	return IdempotencyJoined
}

// leadKeyed runs the race of a keyed request that leads its flight. The
// race's context is not the leader's client's but the flight's readers':
// when the leader's client leaves, the race goes on for as long as a
// follower reads (the handler then keeps running to feed them) and is
// cancelled when the last reader is gone.
func leadKeyed(h *Hedger, w http.ResponseWriter, p *preparedRequest, rep *Report, start time.Time, identity string, lead *flight) error {
	clientCtx := p.orig.Context()
	readers, stopLeaderHook := leadFlight(lead, clientCtx)
	fw := &flightWriter{w: w, f: lead, hdr: make(http.Header), reportHeader: h.cfg.ReportHeader, rep: rep}
	complete := false
	store := false
	var remote *fleetLeader
	// Deferred, so that followers are released even if the race panics.
	defer func() {
		stopLeaderHook()
		if remote != nil {
			fleetLeaderEnd(remote, lead, complete, store, nil)
		}
		h.state.idem.finish(identity, lead, complete, store, h.idempotencyTTL)
	}()
	if h.fleet != nil {
		// Another replica may lead, or have stored the answer.
		joined := fleetJoin(h, fw, p, rep, identity, readers)
		if joined.answered {
			complete = joined.complete
			rep.Idempotency = fleetIdempotency(rep)
			return joined.err
		}
		remote = joined.leader
		fw.remote = remote
		if remote != nil {
			remote.mu.Lock()
			remote.readersGone = func() { lead.remoteReadersGone() }
			remote.mu.Unlock()
			lead.mu.Lock()
			lead.remote = remote
			lead.mu.Unlock()
		}
	}
	rep.Idempotency = IdempotencyLed
	rc := newRace(h, p, rep, start)
	rc.clientCtx = readers
	rc.ctx = readers
	err := runRace(rc, fw)
	if fw.refused {
		// The 503 to retry is the whole answer (the local followers get it
		// too); the race's winner is not.
		rep.Outcome = OutcomeRejected
		rep.Status = http.StatusServiceUnavailable
		err = nil
	}
	// An answer that reached its end (an error answer included) is complete
	// for the followers too; only a winner's is stored.
	complete = err == nil && rep.Outcome != OutcomeClientGone && !fw.fenced
	store = complete && rep.Outcome == OutcomeOK
	if remote != nil {
		// Held bytes (from an end marker on) go out only with a whole
		// answer: a cut one ends without its marker.
		var held []byte
		if complete {
			held = fw.held
		}
		ended := fleetLeaderEnd(remote, lead, complete, store, held)
		remote = nil // ended: not again when deferred
		switch {
		case ended && len(held) > 0:
			_, _ = fw.deliver(held)
			fw.Flush()
		case !ended && !fw.refused:
			// The lease was lost before the end (the end marker, if
			// any, did not go out): this answer ends broken.
			fw.fenced = true
			complete = false
			store = false
		}
	}
	if fw.fenced && !fw.refused && clientCtx.Err() == nil && !fw.clientGone {
		// Committed, but the lease was lost before the answer's end went
		// out: another leader may answer the key, so this answer ends
		// broken (not stored, followers cut).
		rep.Outcome = OutcomeStreamFailed
		err = ErrStreamAborted
	}
	if fw.clientGone {
		// The answer went on to the followers, not to this client.
		rep.Outcome = OutcomeClientGone
	}
	return err
}
