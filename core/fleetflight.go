package core

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"
	"github.com/llmhedge/llmhedge/core/stream"
)

// The fleet protocol of a keyed request, after this replica's own table
// made it the local leader (so each replica sends one claim per identity
// at a time; its local twins follow it in process):
//
//   - claim (fleetstore.Claim): a stored answer is replayed (or 422 on another
//     fingerprint); else SET lease NX PX makes this request the leader;
//     else it follows the holder of the lease (or 422).
//   - the leader runs the race and appends to its generation's stream:
//     head (status and headers) at commit (a stream's beside its first
//     event, see fleetLeaderCommit), data as it is written, end
//     ok|cut|none; at a complete 2xx end within max_response_bytes it
//     stores the answer (done) for the TTL. It renews the lease every
//     lease/3. Data is batched: whatever accumulates while a write is on
//     the wire goes in the next; while no follower reads (as the last
//     write reported), for up to fleetstore.LoneBatchWindow (see
//     fleetAppendDue). A stream's end marker goes out, to the leader's
//     client too, only with the fenced end (flightWriter.Write).
//   - a follower reads the stream from 0-0 with XREAD BLOCK and writes each
//     entry as it comes. When a read times out it checks the lease: gone
//     before head means the leader died before commit (or ended without an
//     answer): it claims again, and one follower takes over; gone after
//     head without end means the generation is cut, and so is the
//     follower's answer. It never continues with another generation's
//     bytes.
//
// Every operation is bounded (Fleet.cfg.Timeout, XREAD by its block time on
// top). When the claim fails the request goes on with local state, exactly
// as without a fleet; when a follower's read fails, it answers 409 to
// retry (another replica leads the key) or ends its answer broken.

// fleetJoined is what the fleet did with a keyed request.
type fleetJoined struct {
	// answered: the request was answered from the fleet (replayed, joined
	// or refused); err is handle's result and complete whether the whole
	// answer was written.
	answered bool
	complete bool
	err      error
	// leader: this request leads the fleet's flight; its answer goes to
	// the stream through flightWriter.remote.
	leader *fleetLeader
	// Neither: the fleet is away; the request runs on local state.
}

// fleetRounds bounds the claims of one request (a takeover claims again;
// a lost race for the takeover follows the winner).
const fleetRounds int = 4

// fleetJoin runs the claim and, when another replica leads, follows it.
// fw is the local leader's writer: what a follower writes goes to the
// client and to this replica's local twins.
func fleetJoin(h *Hedger, fw *flightWriter, p *preparedRequest, rep *Report, identity string, readers context.Context) fleetJoined {
	f := h.fleet
	fp := p.fingerprint()
	keys := fleetstore.NewKeys(f.cfg.Prefix, identity)
	lease := fleetstore.Millis(time.Duration(f.cfg.Lease))
	for round := 0; round < fleetRounds; round++ {
		holder := fleetNewHolder(f)
		// Sent once more after a failure on the way (see fleetstore.Claim).
		claimed, v, err := fleetstore.Claim(f.conn, readers, keys, holder, fp, lease, fleetstore.StreamMillis(h.idempotencyTTL))
		if err != nil && err != fleetstore.ErrDown && !errors.Is(err, fleetstore.ErrRedisBusy) && readers.Err() == nil {
			// Sent, but unanswered: Redis may still run it (a paused
			// server runs what it queued), and a lease nobody renews would
			// let a follower start a second generation. This request leads
			// as if it had claimed, until Redis says otherwise.
			l := startFleetLeader(h, p, keys, identity, holder, fp, claimed, err)
			return fleetJoined{leader: l}
		}
		if err != nil && errors.Is(err, fleetstore.ErrRedisBusy) {
			// This replica has no connection free: Redis is not away,
			// another replica may well lead the key. A 409 to retry,
			// never a race of its own.
			rep.Outcome = OutcomeJoined
			rep.Status = http.StatusConflict
			writeInFlightConflict(fw)
			return fleetJoined{answered: true, complete: true}
		}
		if err != nil || v.Kind != fleetstore.RedisArray || len(v.Array) == 0 {
			return fleetJoined{}
		}
		switch v.Array[0].Str {
		case "conflict":
			rep.Outcome = OutcomeRejected
			rep.Status = http.StatusUnprocessableEntity
			setNoRaceReport(h, fw.Header(), OutcomeRejected)
			writeJSONError(fw, http.StatusUnprocessableEntity, errTypeInvalidRequest, "idempotency_key_reused",
				"this idempotency key was already used with a different request")
			return fleetJoined{answered: true, complete: true}
		case "replay":
			if len(v.Array) < 2 {
				return fleetJoined{}
			}
			if fleetReplay(h, fw, rep, fp, v.Array[1].Str) {
				return fleetJoined{answered: true, complete: true}
			}
			return fleetJoined{}
		case "lead":
			l := startFleetLeader(h, p, keys, identity, holder, fp, claimed, nil)
			return fleetJoined{leader: l}
		case "follow":
			if len(v.Array) < 2 {
				return fleetJoined{}
			}
			other := v.Array[1].Str
			if atomic.AddInt64(&f.followers, 1) > int64(f.cfg.MaxFollowers) {
				// Over the cap: no blocking read, and no second generation.
				atomic.AddInt64(&f.followers, -1)
				fleetUncountReader(f, keys, other)
				rep.Outcome = OutcomeJoined
				rep.Status = http.StatusConflict
				writeInFlightConflict(fw)
				return fleetJoined{answered: true, complete: true}
			}
			setNoRaceReport(h, fw.Header(), OutcomeJoined)
			res := fleetFollow(f, fw, keys, other, other+" "+fp, readers)
			atomic.AddInt64(&f.followers, -1)
			switch res {
			case followReclaim:
				clearNoRaceReport(h, fw.Header())
				continue
			case followUnreadable:
				rep.Outcome = OutcomeJoined
				rep.Status = http.StatusConflict
				writeInFlightConflict(fw)
				return fleetJoined{answered: true, complete: true}
			}
			rep.Outcome = OutcomeJoined
			rep.Status = fw.status
			j := fleetJoined{answered: true, complete: res == followComplete}
			if res == followCut && readers.Err() == nil {
				// The status and the bytes read so far go out before the
				// abort (a read that brought the head and the cut end at
				// once wrote them to buffers only): the client sees an
				// answer that breaks, not a connection closed unanswered.
				fw.Flush()
				j.err = ErrStreamAborted
			}
			return j
		}
		return fleetJoined{}
	}
	return fleetJoined{}
}

// fleetReplay writes a stored answer (done value) and reports whether it
// could be decoded.
func fleetReplay(h *Hedger, fw *flightWriter, rep *Report, fp, done string) bool {
	_, status, hdr, body, ok := fleetstore.DecodeDone(done, fp)
	if !ok {
		return false
	}
	rep.Outcome = OutcomeReplayed
	rep.Status = status
	copyHeader(fw.Header(), hdr)
	fw.Header().Set("Idempotent-Replayed", "true")
	setNoRaceReport(h, fw.Header(), OutcomeReplayed)
	fw.WriteHeader(status)
	if _, err := fw.Write([]byte(body)); err != nil {
		return true // the client left; the answer was the replay all the same
	}
	return true
}

// What a follower's reading ended with.
const (
	followComplete   int = 0 // end ok: the whole answer was written
	followCut        int = 1 // the generation ended broken, or Redis failed after head
	followReclaim    int = 2 // no answer yet and no leader: claim again
	followGone       int = 4 // the reader's client left
	followUnreadable int = 5 // the stream lacks its start, or Redis failed before it: nothing was written
)

// fleetBlock is the XREAD BLOCK time: short enough to notice a dead leader
// soon after its lease expired.
func fleetBlock(f *Fleet) time.Duration {
	b := time.Duration(f.cfg.Lease) / 2
	if b > time.Second {
		b = time.Second
	}
	if b < 10*time.Millisecond {
		b = 10 * time.Millisecond
	}
	return b
}

// fleetFollow reads the stream of holder's generation from its start and
// writes it to fw, then uncounts itself from the generation's readers.
func fleetFollow(f *Fleet, fw *flightWriter, keys fleetstore.Keys, holder, leaseValue string, ctx context.Context) int {
	var tail []byte
	res := fleetRead(f, fw, keys, holder, leaseValue, ctx, &tail)
	if res == followCut && stream.Finished(tail) {
		// The generation's bytes reached their end marker, which its
		// leader writes only while its lease surely holds: the answer is
		// whole even though the stream's own end never came (Redis
		// failed, or the leader died, after it).
		res = followComplete
	}
	fleetUncountReader(f, keys, holder)
	return res
}

// fleetUncountReader takes a follower out of holder's readers, bounded by
// the fleet's timeout (its client may have left already). A failure leaves
// the count high until the key expires: the leader then runs its race to
// the end for nobody, as before the count existed.
func fleetUncountReader(f *Fleet, keys fleetstore.Keys, holder string) {
	fleetstore.Uncount(f.conn, keys, holder)
}

// fleetRead is fleetFollow's reading. Entries must come numbered 1, 2, 3...
// from the head: a gap (entries trimmed or evicted, a stream that vanished)
// ends the answer broken, never with a hole.
// tail keeps the last bytes written, for fleetFollow.
func fleetRead(f *Fleet, fw *flightWriter, keys fleetstore.Keys, holder, leaseValue string, ctx context.Context, tail *[]byte) int {
	stream := keys.Stream(holder)
	block := fleetBlock(f)
	last := "0-0"
	headSeen := false
	next := 1    // the sequence number the next entry must carry
	written := 0 // bytes of the answer's body written
	for {
		if ctx.Err() != nil {
			return followGone
		}
		v, err := fleetstore.ReadStream(f.conn, ctx, stream, last, block)
		if err != nil && f.Up() && ctx.Err() == nil {
			// One failed read is not the end: read again while the
			// breaker holds (it opens after a few failures in a row).
			continue
		}
		if err != nil {
			return followFailed(ctx, headSeen)
		}
		if v.Kind == fleetstore.RedisNil {
			// The leader lives while it holds the lease.
			lv, err := fleetstore.ReadLease(f.conn, ctx, keys)
			if err != nil {
				return followFailed(ctx, headSeen)
			}
			if fleetstore.HoldsLease(lv, leaseValue) {
				continue
			}
			// The leader is gone: take what it wrote before it went.
			rest, err := fleetstore.ReadStream(f.conn, ctx, stream, last, 0)
			if err != nil {
				return followFailed(ctx, headSeen)
			}
			if rest.Kind == fleetstore.RedisNil {
				if headSeen {
					return followFromStore(f, fw, keys, holder, written, ctx)
				}
				return followReclaim
			}
			v = rest
		}
		entries := fleetstore.StreamEntries(v)
		for i := range entries {
			e := &entries[i]
			last = e.ID
			if e.Seq != next || e.Kind == "h" && headSeen || e.Kind == "d" && !headSeen {
				return followBroken(headSeen)
			}
			next++
			switch e.Kind {
			case "h":
				status, hdr, _, ok := fleetstore.DecodeHead(e.Value)
				if !ok {
					return followBroken(headSeen)
				}
				copyHeader(fw.Header(), hdr)
				fw.WriteHeader(status)
				headSeen = true
			case "d":
				if _, err := fw.Write([]byte(e.Value)); err != nil {
					return followGone
				}
				written += len(e.Value)
				*tail = keepTail(*tail, []byte(e.Value))
			case "e":
				if !headSeen {
					return followReclaim // ended without an answer: lead anew
				}
				if e.Value == "ok" {
					return followComplete
				}
				return followCut
			}
		}
		fw.Flush()
	}
}

// followFromStore finishes a follower whose stream ended without its end
// entry: when the same generation's answer was stored (its stream lingers
// only briefly after), the rest of it comes from there; else the
// generation was cut.
func followFromStore(f *Fleet, fw *flightWriter, keys fleetstore.Keys, holder string, written int, ctx context.Context) int {
	v, err := fleetstore.ReadDone(f.conn, ctx, keys)
	if err != nil || v.Kind != fleetstore.RedisString {
		return followFailed(ctx, true)
	}
	fp := v.Str
	if i := strings.IndexByte(fp, '\n'); i >= 0 {
		fp = fp[:i]
	}
	gen, _, _, body, ok := fleetstore.DecodeDone(v.Str, fp)
	if !ok || gen != holder || len(body) < written {
		return followCut
	}
	if _, err := fw.Write([]byte(body[written:])); err != nil {
		return followGone
	}
	return followComplete
}

// followBroken is a follower's result when what it read cannot be this
// generation's answer: cut once it wrote some of it, else unreadable (the
// client gets a status, never a connection closed on it).
func followBroken(headSeen bool) int {
	if headSeen {
		return followCut
	}
	return followUnreadable
}

// followFailed is a follower's result when Redis failed. Before the head
// it is a 409 to retry, never a race of its own: another replica leads
// this key, and a slow Redis (or a starved replica) is no reason for a
// second generation.
func followFailed(ctx context.Context, headSeen bool) int {
	if ctx.Err() != nil {
		return followGone
	}
	return followBroken(headSeen)
}

// fleetLeader feeds one generation's stream from the leader's writer. The
// head goes to Redis before the answer's status reaches the client (the
// commit is fenced on the lease); after it the writer never waits for
// Redis: it queues, and one goroutine (fleetAppend) sends whatever is
// queued in one script call, then the next.
type fleetLeader struct {
	f          *Fleet
	keys       fleetstore.Keys
	holder     string
	stream     string
	leaseValue string
	fp         string
	maxBytes   int
	ttl        time.Duration
	// store: where this answer counts against the fleet store's budgets
	// (its size set at the end, by fleetLeaderEnd); storeFull: the
	// route's State.storeFull.
	store     fleetstore.Store
	storeFull *fleetStoreFull
	// readersGone tells the local flight this generation feeds that no
	// follower on another replica reads (fleetRenew); it stops the race
	// when nobody reads anywhere. A func, not the *flight: Yaegi mistypes
	// the mutually recursive structs.
	readersGone func()

	mu   sync.Mutex
	cond *sync.Cond // a head or data queued, a batch due, the end
	data []byte     // queued, not yet sent
	// readers: followers reading this generation, as the last write or
	// renewal reported. While none does, data waits for its batch's
	// window (batchDue) or size.
	readers     int64
	batchDue    bool
	windowTimer Timer
	windowTick  func()

	headSent bool   // the head went out or is queued (so the end is ok or cut)
	head     string // a stream's head, queued for the sender (fleetLeaderCommit)
	seq      int    // sequence number of the next entry
	size     int
	overflow bool // the answer outgrew maxBytes: the stream ends cut
	ended    bool
	endKind  string
	done     string // the answer to store, "" for none
	failed   bool   // an append failed: nothing more goes to the stream
	stopped  bool   // no more renewals
	// lost: the lease is another leader's or gone (a fenced write or a
	// renewal said so), or Redis could not confirm it before it ran out.
	// This generation must not be committed anywhere: the leader's own
	// client's answer ends broken.
	lost bool
	// validUntil: the lease surely holds until then (the send time of the
	// last write that found it held, plus the lease; this replica's clock,
	// never compared with another host's).
	validUntil time.Time
	// uncertain: the claim failed (unanswered), so whether it landed is
	// unknown until Redis answers a renewal or a write: held (it did),
	// another's (lost), or none: the claim never landed. After a claim
	// that timed out, another generation may have run beside this race,
	// so it is lost too, unless it committed while the fleet was down;
	// after a broken connection (Redis died, maybe restarted empty) and
	// once committed, it answers its client as without a fleet (detached).
	uncertain, detached bool
	// claimTimedOut: the claim's failure was a timeout (Redis answering
	// late, or this replica too busy to read it), not a connection that
	// broke (Redis died or restarted).
	claimTimedOut bool

	renewTimer Timer
	renewTick  func()
	finished   chan struct{}
}

// claimErr is the claim's failure when Redis did not answer it (nil: it
// did, and this replica leads).
func startFleetLeader(h *Hedger, p *preparedRequest, keys fleetstore.Keys, identity, holder, fp string, claimed time.Time, claimErr error) *fleetLeader {
	f := h.fleet
	caller := callerHash(h, p)
	idem := &h.cfg.Idempotency
	l := &fleetLeader{f: f, keys: keys, holder: holder, stream: keys.Stream(holder), leaseValue: holder + " " + fp, fp: fp,
		maxBytes: int(idem.MaxResponseBytes), ttl: h.idempotencyTTL, seq: 1, finished: make(chan struct{}),
		validUntil: claimed.Add(time.Duration(f.cfg.Lease)),
		store: fleetstore.Store{Keys: fleetstore.StoreKeys(f.cfg.Prefix, h.cfg.Route, caller[:32]), Identity: identity,
			RouteBudget: int64(idem.MaxBytes), CallerBudget: int64(idem.MaxBytesPerCaller)},
		storeFull: h.state.storeFull,
		uncertain: claimErr != nil, claimTimedOut: isTimeout(claimErr)}
	l.cond = sync.NewCond(&l.mu)
	// Created once: the timers re-arm with these same funcs (Yaegi).
	l.renewTick = func() { fleetRenew(l) }
	l.windowTick = func() { fleetBatchWindowEnded(l) }
	t := f.clock.AfterFunc(time.Duration(f.cfg.Lease)/3, l.renewTick)
	l.mu.Lock()
	l.renewTimer = t
	l.mu.Unlock()
	go fleetAppend(l)
	return l
}

// fleetHasReaders reports whether a follower on another replica reads
// this generation (an error counts as none: the race then stops as it
// would without a fleet).
func fleetHasReaders(l *fleetLeader) bool {
	v, err := fleetstore.Readers(l.f.conn, l.keys, l.holder)
	if err != nil || v.Kind != fleetstore.RedisString {
		return false
	}
	n, cerr := strconv.Atoi(v.Str)
	reading := cerr == nil && n > 0
	return reading
}

// fleetRenew extends the lease and re-arms itself until the flight ends.
// It goes on after a failed append: a leader still answering its own
// client must learn that it lost the lease. When no follower anywhere
// reads any more, it tells the flight (which stops the race if the
// leader's client left too).
func fleetRenew(l *fleetLeader) {
	f := l.f
	l.mu.Lock()
	stop := l.stopped || l.lost || l.detached
	l.mu.Unlock()
	if stop {
		return
	}
	// A renewal that timed out may have landed all the same: the next one
	// tells. Only the commit and the end need the lease surely held.
	readers := fleetWrite(l, 0, nil, false)
	l.mu.Lock()
	if !l.stopped && !l.lost && !l.detached {
		// A typed local first (Yaegi: see SystemClock.AfterFunc).
		t := f.clock.AfterFunc(time.Duration(f.cfg.Lease)/3, l.renewTick)
		l.renewTimer = t
	}
	gone := l.readersGone
	l.mu.Unlock()
	if readers == 0 && gone != nil {
		gone()
	}
}

// fleetWrite sends one write of the leader: entries from seq (none: a
// renewal only), renewing the lease; it records what Redis found of the
// lease and returns the followers reading, -1 when unknown. strict: a
// write without an answer counts as unconfirmed (leaseUnconfirmed).
// Entries that did not go in fail the stream: it takes no more.
func fleetWrite(l *fleetLeader, seq int, entries []fleetstore.Entry, strict bool) int64 {
	f := l.f
	w := &fleetstore.Write{Stream: l.stream, LeaseValue: l.leaseValue, Holder: l.holder,
		StreamMs: fleetstore.StreamMillis(l.ttl), LeaseMs: fleetstore.Millis(time.Duration(f.cfg.Lease)),
		Seq: seq, Entries: entries}
	sent := f.clock.Now()
	fence, readers, err := fleetstore.WriteLeader(f.conn, context.Background(), l.keys, w)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(entries) > 0 {
		fencedWrite(l, sent, fence, err)
	} else if err == nil {
		leaseConfirmed(l, sent, fenceState(fence))
	}
	if err != nil {
		if strict {
			leaseUnconfirmed(l, err)
		}
		return -1
	}
	if readers != 0 && l.readers == 0 {
		l.cond.Broadcast() // a batch waiting for its window is due now
	}
	l.readers = readers
	return readers
}

// fleetLeaderCommit sends the answer's head to the stream and reports
// whether the leader may commit. It may not when it lost the lease:
// another leader may be answering the same key. While the lease surely
// holds (validUntil), a stream's head (SSE, NDJSON) is queued for the
// sender and the status goes to the client at once: the stream's end
// marker goes out only with the fenced end (flightWriter.Write), and a
// leader whose lease Redis lost meanwhile ends the answer broken. Any
// other answer's head, and any head of a leader that may have outlived
// its lease (paused, starved), goes in before the status goes out: a
// leader that lost it answers a 503 to retry. When Redis fails the leader
// commits all the same (its client is answered from local state) and its
// followers' answers end cut.
func fleetLeaderCommit(l *fleetLeader, status int, hdr http.Header) bool {
	l.mu.Lock()
	detached, uncertain := l.detached, l.uncertain
	_, streams := stream.FormatOf(hdr.Get("Content-Type"))
	if streams && !detached && !uncertain && !l.lost && l.f.clock.Now().Before(l.validUntil) {
		l.head = fleetstore.EncodeHead(status, hdr)
		l.headSent = true
		l.seq = 2
		l.cond.Broadcast()
		l.mu.Unlock()
		return true
	}
	l.mu.Unlock()
	if detached {
		return true
	}
	if uncertain && !fleetLeaderConfirm(l) {
		// Its claim timed out and another leader holds the key (or
		// stored its answer) now.
		return false
	}
	head := []fleetstore.Entry{{Kind: "h", Value: fleetstore.EncodeHead(status, hdr)}}
	fleetWrite(l, 1, head, true)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost {
		return false
	}
	l.headSent = true
	l.seq = 2
	return true
}

// fleetLeaderData queues bytes of the answer; past maxBytes the stream
// takes no more (it will end cut). It reports false once the leader lost
// its lease: its client's answer must end broken.
func fleetLeaderData(l *fleetLeader, p []byte) bool {
	l.mu.Lock()
	queueData(l, p)
	lost := l.lost
	l.mu.Unlock()
	return !lost
}

// queueData queues p for the sender (l.mu held).
func queueData(l *fleetLeader, p []byte) {
	if l.overflow || l.failed || l.lost {
		return
	}
	l.size += len(p)
	if l.size > l.maxBytes {
		// What is queued fits: it goes at once, then the stream takes
		// no more.
		l.overflow = true
	} else {
		l.data = append(l.data, p...)
	}
	l.cond.Broadcast()
}

// fleetBatchWindowEnded makes the queued batch due (its window's timer).
func fleetBatchWindowEnded(l *fleetLeader) {
	l.mu.Lock()
	l.batchDue = true
	l.cond.Broadcast()
	l.mu.Unlock()
}

// fleetAppendDue reports whether the sender has something to send now
// (l.mu held): the end, a queued head, or data that a follower reads,
// whose window ended, that fills a batch, or the last the stream takes.
func fleetAppendDue(l *fleetLeader) bool {
	if l.ended || l.head != "" {
		return true
	}
	return len(l.data) > 0 && (l.readers != 0 || l.batchDue || l.overflow || len(l.data) >= fleetstore.LoneBatchBytes)
}

// fleetLeaderConfirm renews the lease at once and reports whether it
// surely holds (a renewal that failed still counts while the lease cannot
// have run out): the commit of a leader whose claim went unanswered waits
// for it.
func fleetLeaderConfirm(l *fleetLeader) bool {
	l.mu.Lock()
	detached := l.detached
	l.mu.Unlock()
	if detached {
		return true
	}
	fleetWrite(l, 0, nil, true)
	l.mu.Lock()
	lost := l.lost
	l.mu.Unlock()
	return !lost
}

// fleetLeaderEnd ends the stream after the race: ok when the whole answer
// was written (stored when it is a 2xx the caller may store and it fitted),
// cut when an answer started but did not end (or the stream missed some of
// it), none when none started. held is the answer's last bytes, from its
// end marker on, not yet in the flight: they go with the end. It returns
// once the end is in Redis or Redis failed (each operation is bounded),
// and reports whether held may go out: the end found the lease this
// leader's, or Redis did not answer while the lease surely held, or the
// fleet was away from the claim on (the answer goes out as without it).
func fleetLeaderEnd(l *fleetLeader, lead *flight, complete, store bool, held []byte) bool {
	l.mu.Lock()
	lost, ended := l.lost, l.ended
	l.mu.Unlock()
	if ended {
		// At the stream's end event (flightWriter.endAtMarker).
		<-l.finished
		l.mu.Lock()
		defer l.mu.Unlock()
		return !l.lost
	}
	done := ""
	if complete && store && !lost {
		lead.mu.Lock()
		if !lead.overflow && len(lead.body)+len(held) <= lead.maxBytes && lead.status >= 200 && lead.status < 300 {
			// The generation's holder, for followers that finish from it.
			done = fleetstore.EncodeDone(l.fp, l.holder, lead.status, lead.header, lead.body) + string(held)
		}
		lead.mu.Unlock()
	}
	l.mu.Lock()
	if done != "" {
		// Admitted to the store with the end (fleetFinish).
		l.store.Size = redisFootprint(len(done))
	}
	// Queued with the end in one hold of the lock: the sender takes them
	// together, so no follower gets the end marker before the end.
	queueData(l, held)
	kind := "none"
	if l.headSent {
		kind = "cut"
		if complete && !l.overflow && !l.failed {
			kind = "ok"
		}
	}
	l.ended = true
	l.endKind = kind
	l.done = done
	l.stopped = true
	timer, window := l.renewTimer, l.windowTimer
	l.cond.Broadcast()
	l.mu.Unlock()
	if timer != nil {
		timer.Stop()
	}
	if window != nil {
		window.Stop()
	}
	<-l.finished
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lost
}

// redisFootprint is what a string value of n bytes takes in Redis: its
// allocation rounded up to the allocator's size class (jemalloc's: four
// classes per power of two, so up to 25 % more), plus the key's own.
func redisFootprint(n int) int {
	const keyOverhead = 128
	if n <= 64 {
		return 64 + keyOverhead
	}
	step := 1
	for step*8 < n-1 {
		step *= 2
	}
	return (n+step-1)/step*step + keyOverhead
}

// fleetStoreFull remembers until when the fleet store is full for a
// route's answers (its budget) or for one caller's (the caller's share),
// as the store said when it refused one (fleetstore.Admission): no answer
// is offered to a full store, nor asked about, before the refusing
// budget's first stored answer expires. A replica that never stored
// learns it at its first refusal, which costs a round trip (the answer is
// taken back).
type fleetStoreFull struct {
	mu      sync.Mutex
	route   time.Time
	callers map[string]time.Time // by the caller's store set
}

// fleetStoreFullCallers bounds the callers a route remembers (all are
// forgotten at once past it: the next refusal of each tells again).
const fleetStoreFullCallers = 4096

// storeIsFull reports whether the store was full for caller's answers at
// now, as last refused.
func storeIsFull(sf *fleetStoreFull, caller string, now time.Time) bool {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if now.Before(sf.route) {
		return true
	}
	until, ok := sf.callers[caller]
	if ok && !now.Before(until) {
		delete(sf.callers, caller)
		return false
	}
	return ok
}

// storeRefused records the store's refusal a of one of caller's answers
// (one whose refusal says when the store has room again: not a failure).
func storeRefused(sf *fleetStoreFull, caller string, a fleetstore.Admission, now time.Time) {
	if a.Wait <= 0 {
		return
	}
	until := now.Add(a.Wait)
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if a.Route {
		sf.route = until
		return
	}
	if len(sf.callers) >= fleetStoreFullCallers {
		sf.callers = map[string]time.Time{}
	}
	sf.callers[caller] = until
}

// fleetAppend is the leader's one sender: it sends a stream's head, the
// queued data when due (fleetAppendDue), then the end with the last data,
// each in one fenced script call.
func fleetAppend(l *fleetLeader) {
	for {
		l.mu.Lock()
		for !fleetAppendDue(l) {
			if len(l.data) > 0 && l.windowTimer == nil {
				// A typed local first (Yaegi: see SystemClock.AfterFunc).
				t := l.f.clock.AfterFunc(fleetstore.LoneBatchWindow, l.windowTick)
				l.windowTimer = t
			}
			l.cond.Wait()
		}
		if head := l.head; head != "" {
			// At once and alone: followers wait for it, and its fence
			// tells this leader whether it still holds the lease.
			l.head = ""
			l.mu.Unlock()
			fleetWrite(l, 1, []fleetstore.Entry{{Kind: "h", Value: head}}, true)
			continue
		}
		data := l.data
		ended := l.ended
		skip := l.failed || l.lost
		lost, detached := l.lost, l.detached
		seq := l.seq
		l.data = nil
		l.batchDue = false
		if window := l.windowTimer; window != nil {
			window.Stop()
			l.windowTimer = nil
		}
		if len(data) > 0 && !ended {
			l.seq++
		}
		l.mu.Unlock()
		if ended {
			if !lost && !detached {
				fleetFinish(l, seq, data)
			}
			close(l.finished)
			return
		}
		var entries []fleetstore.Entry
		if len(data) > 0 && !skip {
			entries = []fleetstore.Entry{{Kind: "d", Value: string(data)}}
		}
		if len(entries) > 0 {
			fleetWrite(l, seq, entries, false)
		}
	}
}

// fleetFinish sends the end (with the last data, unless the stream took no
// more), stores the answer and releases the lease. A leader whose stream
// failed still stores a complete answer and releases: its followers' answers
// end cut, later claims replay it.
func fleetFinish(l *fleetLeader, seq int, data []byte) {
	l.mu.Lock()
	kind, done, failed := l.endKind, l.done, l.failed
	l.mu.Unlock()
	last := string(data)
	if failed {
		last = ""
		if kind == "ok" {
			kind = "cut" // the stream missed some of the answer
		}
	}
	// endKind and done were set before ended, under the lock this goroutine
	// took since.
	end := &fleetstore.End{Stream: l.stream, LeaseValue: l.leaseValue, Holder: l.holder, Kind: kind, Done: done,
		Seq: seq, Last: last, TTLMs: fleetstore.Millis(l.ttl), StreamMs: fleetstore.StreamMillis(l.ttl),
		EndMs: fleetstore.LingerMillis(fleetstore.EndLinger, l.ttl), DoneMs: fleetstore.LingerMillis(fleetstore.DoneLinger, l.ttl)}
	var sent time.Time
	var v fleetstore.RedisValue
	var err error
	caller := l.store.Keys[2]
	if done != "" && storeIsFull(l.storeFull, caller, l.f.clock.Now()) {
		end.Done = "" // not offered to a full store
	}
	if end.Done != "" {
		// The end and the admission in one round trip (FinishStored).
		var a fleetstore.Admission
		sent, v, a, err = fleetstore.FinishStored(l.f.conn, l.keys, end, &l.store)
		if !a.Admitted {
			storeRefused(l.storeFull, caller, a, l.f.clock.Now())
		}
	} else {
		sent, v, err = fleetstore.Finish(l.f.conn, l.keys, end)
	}
	l.mu.Lock()
	fencedWrite(l, sent, v.Str, err)
	if err != nil {
		leaseUnconfirmed(l, err)
	}
	l.mu.Unlock()
}

// fencedWrite records the result of a fenced write sent at sent (l.mu
// held). Anything but ok means the stream takes no more: followers see a
// cut end, a gap or the lease gone, and end their answers broken.
func fencedWrite(l *fleetLeader, sent time.Time, fence string, err error) {
	if err == nil {
		leaseConfirmed(l, sent, fenceState(fence))
	}
	if err != nil || fence != fleetstore.FenceOK {
		l.failed = true
		l.data = nil
	}
}

// fenceState is what a fenced write's result says of the lease, as
// leaseConfirmed takes it.
func fenceState(fence string) int {
	switch fence {
	case fleetstore.FenceLost:
		return 0
	case fleetstore.FenceNone:
		return -1
	}
	return 1
}

// leaseConfirmed records what a fenced write or a renewal sent at sent
// found of the lease (l.mu held): 1 held, 0 another's, -1 none (gone, or
// an uncertain claim that never landed: see uncertain).
func leaseConfirmed(l *fleetLeader, sent time.Time, state int) {
	if state == -1 && l.uncertain && (l.headSent || !l.claimTimedOut) {
		l.detached = true
		l.failed = true
		l.data = nil
		return
	}
	if state != 1 {
		l.lost = true
		return
	}
	l.uncertain = false
	if until := sent.Add(time.Duration(l.f.cfg.Lease)); until.After(l.validUntil) {
		l.validUntil = until
	}
}

// leaseUnconfirmed: Redis did not answer the commit or the end (l.mu
// held; err is why). The lease may have run out meanwhile and another
// leader claimed the key: once it may have, this leader counts as having
// lost it.
func leaseUnconfirmed(l *fleetLeader, err error) {
	if l.uncertain {
		if l.f.Up() && isTimeout(err) {
			// Redis answers the fleet, not this leader, in time: its
			// claim may have landed beside another replica's, so it must
			// not answer as the key's one generation (before commit its
			// client gets a 503 to retry, after it the answer ends
			// broken).
			l.lost = true
			return
		}
		// Redis is away (the fleet down, or the connection refused or
		// broken: Redis died): like a request without the fleet, it
		// answers its client; its renewals go on, and tell once Redis
		// answers.
		return
	}
	if !l.f.clock.Now().Before(l.validUntil) {
		l.lost = true
	}
}
