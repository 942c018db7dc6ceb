package fleetstore

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"
)

// The fleet's operations: each sends one script (scripts.go) or command
// with its keys and arguments in the order the script reads them, and
// returns Redis' reply for the engine to read. Durations in milliseconds
// are strings (Millis, StreamMillis, LingerMillis) as the caller computed
// them once.

// Claim claims k for holder with the request's fingerprint fp
// (claimScript). A claim that failed on the way while the connection is up
// (a timeout on a busy replica) is sent once more by the same holder, which
// leads (or follows) as its first claim would have: without the fleet the
// request would run a race of its own, maybe a second generation. It
// returns when the answered call was sent.
func Claim(c *Conn, ctx context.Context, k Keys, holder, fp, leaseMs, readersMs string) (time.Time, RedisValue, error) {
	sent, v, err := EvalAgain(c, ctx, OpClaim, claimScript, []string{k.Lease, k.Done, k.Readers},
		holder, fp, leaseMs, readersMs)
	return sent, v, err
}

// Uncount takes a follower out of holder's readers.
func Uncount(c *Conn, k Keys, holder string) {
	_, _ = Do(c, context.Background(), OpLease, 0, "HINCRBY", k.Readers, holder, "-1")
}

// ReadStream reads stream's entries after last, at most 512, blocking up
// to block for the first (0: not at all); a nil reply when there is none.
func ReadStream(c *Conn, ctx context.Context, stream, last string, block time.Duration) (RedisValue, error) {
	if block <= 0 {
		v, err := Do(c, ctx, OpRead, 0, "XREAD", "COUNT", "512", "STREAMS", stream, last)
		return v, err
	}
	v, err := Do(c, ctx, OpRead, block, "XREAD", "COUNT", "512", "BLOCK", Millis(block), "STREAMS", stream, last)
	return v, err
}

// ReadLease reads k's lease.
func ReadLease(c *Conn, ctx context.Context, k Keys) (RedisValue, error) {
	v, err := Do(c, ctx, OpLease, 0, "GET", k.Lease)
	return v, err
}

// ReadDone reads k's stored answer (DecodeDone's input).
func ReadDone(c *Conn, ctx context.Context, k Keys) (RedisValue, error) {
	v, err := Do(c, ctx, OpLease, 0, "GET", k.Done)
	return v, err
}

// Readers reads how many followers read holder's generation of k.
func Readers(c *Conn, k Keys, holder string) (RedisValue, error) {
	v, err := Do(c, context.Background(), OpLease, 0, "HGET", k.Readers, holder)
	return v, err
}

// Entry is one entry of a generation's stream: Kind "h" (the head) or
// "d" (data), and its value.
type Entry struct{ Kind, Value string }

// Write is one write of a generation's leader (writeScript): its entries
// from Seq on, a renewal of its lease, or both at once.
type Write struct {
	Stream, LeaseValue, Holder string
	StreamMs                   string
	// LeaseMs renews the lease for that long ("": no renewal).
	LeaseMs string
	Seq     int
	Entries []Entry
}

// WriteLeader sends w (writeScript) and returns what it found of the lease
// (FenceOK, FenceLost, FenceNone or FenceGone) and how many followers read
// the generation then. A write with entries counts as an append in the
// metrics, one without as a renewal.
func WriteLeader(c *Conn, ctx context.Context, k Keys, w *Write) (fence string, readers int64, err error) {
	args := make([]string, 0, 5+2*len(w.Entries))
	args = append(args, w.LeaseValue, w.StreamMs, strconv.Itoa(w.Seq), w.Holder, w.LeaseMs)
	for _, e := range w.Entries {
		args = append(args, e.Kind, e.Value)
	}
	op := OpRenew
	if len(w.Entries) > 0 {
		op = OpAppend
	}
	v, err := Eval(c, ctx, op, writeScript, []string{k.Lease, w.Stream, k.Readers}, args...)
	if err != nil {
		return "", 0, err
	}
	if v.Kind != RedisArray || len(v.Array) != 2 {
		return "", 0, errReply
	}
	return v.Array[0].Str, v.Array[1].Int, nil
}

// End is what a generation's leader ends it with (finishScript).
type End struct {
	Stream, LeaseValue, Holder string
	// Kind is the end entry's value: "ok", or why the answer is cut.
	Kind string
	// Done is the answer to store (EncodeDone), "" for none.
	Done string
	// Seq and Last are the last data entry's number and bytes ("": none).
	Seq  int
	Last string
	// TTL, stream, end and done lingers, in milliseconds.
	TTLMs, StreamMs, EndMs, DoneMs string
}

// Finish ends a generation: its last data and end entry, the stored
// answer, the lease released (finishScript). Sent again once after a
// failure on the way (the script knows its own end); it returns when the
// answered call was sent.
func Finish(c *Conn, k Keys, e *End) (time.Time, RedisValue, error) {
	sent, v, err := EvalAgain(c, context.Background(), OpFinish, finishScript, finishKeys(k, e), finishArgs(e)...)
	return sent, v, err
}

// finishKeys and finishArgs are finishScript's keys and arguments for e.
func finishKeys(k Keys, e *End) []string {
	return []string{k.Lease, e.Stream, k.Done}
}

func finishArgs(e *End) []string {
	return []string{e.LeaseValue, e.Kind, e.Done, e.TTLMs, e.StreamMs, strconv.Itoa(e.Seq), e.Last, e.EndMs, e.DoneMs, e.Holder}
}

// Store is where a leader's answer counts against the fleet store's byte
// budgets (storeBudgetScript): the route's and the caller's keys
// (StoreKeys), the identity, the budgets, and the answer's footprint.
type Store struct {
	Keys                      []string
	Identity                  string
	RouteBudget, CallerBudget int64
	Size                      int
}

// admitArgs are storeBudgetScript's arguments for s.
func admitArgs(s *Store, ttlMs string) []string {
	return []string{strconv.Itoa(s.Size), ttlMs, s.Identity, strconv.FormatInt(s.RouteBudget, 10), strconv.FormatInt(s.CallerBudget, 10)}
}

// Admission is what the store's budgets said of an answer: Admitted, or
// refused by the route's budget (Route) or the caller's, with the time
// until that budget's first stored answer expires (Wait): no answer it
// refused fits before then.
type Admission struct {
	Admitted, Route bool
	Wait            time.Duration
}

// admission reads storeBudgetScript's reply; a failure admits nothing.
func admission(v RedisValue, err error) Admission {
	if err == nil && v.Kind == RedisInt && v.Int == 1 {
		return Admission{Admitted: true}
	}
	if err != nil || v.Kind != RedisArray || len(v.Array) != 3 {
		return Admission{}
	}
	return Admission{Route: v.Array[1].Str == "route", Wait: time.Duration(v.Array[2].Int) * time.Millisecond}
}

// AdmitStored counts an answer against the store budgets of the route and
// the caller and says whether it fits. Sent again after a failure: a first
// one that landed counts the answer twice until it expires (the budget
// errs on the safe side). Redis failing admits nothing.
func AdmitStored(c *Conn, s *Store, ttlMs string) Admission {
	_, v, err := EvalAgain(c, context.Background(), OpFinish, storeBudgetScript, s.Keys, admitArgs(s, ttlMs)...)
	return admission(v, err)
}

// FinishStored is Finish for an answer to store (e.Done set), with its
// admission to the store (AdmitStored) in the same round trip. The finish
// stores the answer before the admission's reply is known; an answer the
// budgets refuse is taken back at once (unstoreScript), before the
// leader's answer ends: the store may hold a refused answer for a round
// trip, and, unless Redis fails to take it back twice, never once its
// leader is done. Callers do not offer answers to a
// store they know is full (Admission.Wait). The two scripts' keys are on
// different slots: on a Redis Cluster whose client does not split a
// pipeline, and after any failure of the pipeline (a script Redis does
// not know yet, a timeout), each is sent on its own; both are safe to run
// twice.
func FinishStored(c *Conn, k Keys, e *End, s *Store) (sent time.Time, v RedisValue, a Admission, err error) {
	finish := finishArgs(e)
	sent = c.now()
	vals, perr := Pipeline(c, context.Background(), OpFinish, [][]string{
		scriptCmd("EVALSHA", storeBudgetScript.sha, s.Keys, admitArgs(s, e.TTLMs)),
		scriptCmd("EVALSHA", finishScript.sha, finishKeys(k, e), finish),
	})
	switch {
	case perr == nil && len(vals) == 2:
		a = admission(vals[0], nil)
		v = vals[1]
	case errors.Is(perr, ErrDown):
		return sent, v, a, perr
	default:
		a = AdmitStored(c, s, e.TTLMs)
		sent, v, err = EvalAgain(c, context.Background(), OpFinish, finishScript, finishKeys(k, e), finish...)
	}
	if !a.Admitted {
		// Sent again after a failure (it deletes only this holder's
		// answer); failing twice, the answer stays until its TTL.
		_, _, _ = EvalAgain(c, context.Background(), OpFinish, unstoreScript, []string{k.Done, e.Stream}, e.Holder, e.EndMs)
	}
	return sent, v, a, err
}

// Publish adds health events (field -> ms) to a route's health key
// (publishScript).
func Publish(c *Conn, healthKey string, fields map[string]int64) error {
	args := make([]string, 0, 2*len(fields))
	for field, ms := range fields {
		args = append(args, field, strconv.FormatInt(ms, 10))
	}
	_, err := Eval(c, context.Background(), OpPublish, publishScript, []string{healthKey, HealthMarkOf(healthKey)}, args...)
	return err
}

// Heartbeat writes a replica's status (heartbeatScript) and returns the
// live replicas; prune also drops the ones long gone from the live set.
func Heartbeat(c *Conn, prefix string, status *ReplicaStatus, prune bool) (int64, error) {
	body, err := json.Marshal(status)
	if err != nil {
		return 0, err
	}
	p := "0"
	if prune {
		p = "1"
	}
	v, err := Eval(c, context.Background(), OpHeartbeat, heartbeatScript,
		[]string{ReplicaKey(prefix, status.ID), LiveKey(prefix)},
		string(body), Millis(HeartbeatTTL), status.ID, p, Millis(10*HeartbeatInterval+HeartbeatTTL))
	if err == nil && v.Kind != RedisInt {
		err = errReply
	}
	return v.Int, err
}

// Leave removes a replica's heartbeat and its place in the live set (best
// effort: the heartbeat expires anyway).
func Leave(c *Conn, prefix, replica string) {
	_, _ = Pipeline(c, context.Background(), OpHeartbeat, [][]string{
		{"DEL", ReplicaKey(prefix, replica)},
		{"ZREM", LiveKey(prefix), replica}})
}
