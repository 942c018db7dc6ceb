package fleetstore

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// A sync settles one route with the fleet in one script (syncScript): the
// engine fills a SyncReport from its own state under its own locks, Sync
// sends it and decodes Redis' answer into a SyncResult, and the engine
// applies that under its locks again. Nothing here holds engine state.

// SyncReport is what one replica reports of a route at a sync, and asks.
type SyncReport struct {
	// Ratio (negative: no budget) and Burst are the route's hedge budget.
	Ratio, Burst float64
	// Deposits are the requests since the last sync; Want the tokens asked.
	Deposits int64
	Want     float64
	// OverloadMS is how long the replica's overload stop holds for the
	// fleet (0: not overloaded).
	OverloadMS int64
	Spend      SpendReport
	// Tenants are tenant hashes to add TenantAdds[i] to (0: read only);
	// Minute is the replica's minute (-1: none yet). TenantWork asks for
	// the tenant minute even without tenants.
	Tenants    []string
	TenantAdds []int64
	Minute     int64
	TenantWork bool
}

// SpendReport is what a sync reports of a route's spend and asks of its
// reservation (syncScript's ARGV).
type SpendReport struct {
	// Cap is the hourly cap (0: none, only counted; -1: no spend work).
	Cap int64
	// Hour is the replica's hour (-1: none yet).
	Hour int64
	// Spent since the last sync, Over the part no reservation paid for,
	// Held the reservation held, Target the reservation wanted.
	Spent, Over, Held, Target int64
}

// SyncResult is Redis' answer to a sync.
type SyncResult struct {
	// Grant is the tokens leased to this replica.
	Grant float64
	// Switch is the route's own fleet switch (zero when none or unreadable).
	Switch Switch
	// Health are the route's health events: "cool:<upstream>",
	// "open:<upstream>" or "overload", each with its time left.
	Health []HealthEvent
	// Spend is Redis' spend answer, Spend.OK false when no spend work was
	// asked.
	Spend SpendResult
	// TenantTotals are the fleet's totals of SyncReport.Tenants, in order.
	TenantTotals []int64
	// TenantMinute is Redis' minute and the time left in it (OK false
	// without tenant work).
	TenantMinute MinuteResult
}

// HealthEvent is one health field of a route and its time left.
type HealthEvent struct {
	Name string
	Left time.Duration
}

// SpendResult is a sync's spend answer: Redis' hour, the time left in it,
// the tokens granted (negative: given back), the fleet's reservations and
// its spend.
type SpendResult struct {
	OK                       bool
	Hour                     int64
	Left                     time.Duration
	Granted, Reserved, Spent int64
}

// MinuteResult is Redis' tenant minute and the time left in it.
type MinuteResult struct {
	OK     bool
	Minute int64
	Left   time.Duration
}

// errReply is a reply of another shape than the script's.
var errReply = errors.New("llmhedge: fleet: unexpected reply")

// budgetTTL is how long an idle route's fleet bucket lives.
const budgetTTL time.Duration = time.Minute

// Sync settles route (under prefix) with the fleet.
func Sync(c *Conn, prefix, route string, rep *SyncReport) (SyncResult, error) {
	tenantMS := "0"
	if len(rep.Tenants) > 0 || rep.TenantWork {
		tenantMS = Millis(2 * time.Minute)
	}
	keys := []string{BudgetKey(prefix, route), SwitchKey(prefix, route), HealthKey(prefix, route),
		HealthMarkKey(prefix, route), SpendBase(prefix, route), TenantBase(prefix, route)}
	sp := &rep.Spend
	args := []string{strconv.FormatFloat(rep.Ratio, 'g', -1, 64), strconv.FormatFloat(rep.Burst, 'g', -1, 64),
		strconv.FormatInt(rep.Deposits, 10), strconv.FormatFloat(rep.Want, 'f', 0, 64), Millis(budgetTTL),
		strconv.FormatInt(rep.OverloadMS, 10), strconv.FormatInt(sp.Cap, 10), strconv.FormatInt(sp.Hour, 10),
		strconv.FormatInt(sp.Spent, 10), strconv.FormatInt(sp.Over, 10), strconv.FormatInt(sp.Held, 10),
		strconv.FormatInt(sp.Target, 10), Millis(2 * time.Hour), tenantMS, strconv.FormatInt(rep.Minute, 10)}
	for i, t := range rep.Tenants {
		args = append(args, t, strconv.FormatInt(rep.TenantAdds[i], 10))
	}
	v, err := Eval(c, context.Background(), OpSync, syncScript, keys, args...)
	if err == nil && (v.Kind != RedisArray || len(v.Array) != 7) {
		err = errReply
	}
	if err != nil {
		return SyncResult{}, err
	}
	var res SyncResult
	grant, _ := strconv.ParseFloat(v.Array[0].Str, 64)
	res.Grant = grant
	res.Switch = decodeSwitchOrZero(v.Array[2].Str)
	res.Health = healthEvents(v.Array[3].Array)
	if s := v.Array[4].Array; len(s) == 5 {
		spend := SpendResult{OK: true, Hour: s[0].Int, Left: time.Duration(s[1].Int) * time.Millisecond,
			Granted: s[2].Int, Reserved: s[3].Int, Spent: s[4].Int}
		res.Spend = spend
	}
	for _, t := range v.Array[5].Array {
		res.TenantTotals = append(res.TenantTotals, t.Int)
	}
	if mt := v.Array[6].Array; len(mt) == 2 {
		minute := MinuteResult{OK: true, Minute: mt[0].Int, Left: time.Duration(mt[1].Int) * time.Millisecond}
		res.TenantMinute = minute
	}
	return res, nil
}

// healthEvents decodes the health fields {name, ms left, ...}, without
// the ones that ended or do not parse.
func healthEvents(fields []RedisValue) []HealthEvent {
	var out []HealthEvent
	for i := 0; i+1 < len(fields); i += 2 {
		ms, err := strconv.ParseInt(fields[i+1].Str, 10, 64)
		if err != nil || ms <= 0 {
			continue
		}
		out = append(out, HealthEvent{Name: fields[i].Str, Left: time.Duration(ms) * time.Millisecond})
	}
	return out
}

// decodeSwitchOrZero is the switch stored as v, or the zero Switch when
// there is none or it does not decode.
func decodeSwitchOrZero(v string) Switch {
	if v == "" {
		return Switch{}
	}
	s, err := DecodeSwitch(v)
	if err != nil {
		return Switch{}
	}
	return s
}

// ReadSwitch reads route's fleet switch (SwitchAllRoutes: every route's).
// A switch that does not decode reads as none.
func ReadSwitch(c *Conn, prefix, route string) (Switch, error) {
	v, err := Do(c, context.Background(), OpSync, 0, "GET", SwitchKey(prefix, route))
	if err != nil {
		return Switch{}, err
	}
	return decodeSwitchOrZero(v.Str), nil
}
