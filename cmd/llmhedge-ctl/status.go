package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/redis/go-redis/v9"
)

// statusReport is what status prints (-json: as is).
type statusReport struct {
	Redis  string `json:"redis"`
	Prefix string `json:"prefix"`
	// Switches are the fleet-wide switches set (route "*": every route).
	Switches []fleetstore.SwitchEntry `json:"switches"`
	// Replicas are the live replicas, by id.
	Replicas []replicaReport `json:"replicas"`
	// Unreadable are keys whose value is neither a switch nor a heartbeat.
	Unreadable []string `json:"unreadable,omitempty"`
}

// replicaReport is a heartbeat with its age by Redis' clock.
type replicaReport struct {
	fleetstore.ReplicaStatus
	// HeartbeatAgeMS is how long ago the replica last wrote its heartbeat
	// (FleetHeartbeatTTL minus the key's remaining TTL).
	HeartbeatAgeMS int64 `json:"heartbeat_age_ms"`
}

func status(ctx context.Context, f *fleet, out io.Writer, asJSON bool) error {
	rep := statusReport{Redis: f.name, Prefix: f.prefix, Switches: []fleetstore.SwitchEntry{}, Replicas: []replicaReport{}}
	switchKeys, err := f.scan(ctx, fleetstore.SwitchPattern(escapeGlob(f.prefix)))
	if err != nil {
		return err
	}
	values, _, err := f.values(ctx, switchKeys, false)
	if err != nil {
		return err
	}
	for i, key := range switchKeys {
		if values[i] == nil {
			continue // deleted since the scan
		}
		route, _ := fleetstore.SwitchRoute(f.prefix, key)
		s, err := fleetstore.DecodeSwitch(*values[i])
		if err != nil {
			rep.Unreadable = append(rep.Unreadable, key)
			continue
		}
		rep.Switches = append(rep.Switches, fleetstore.NewSwitchEntry(route, s))
	}
	replicaKeys, err := f.scan(ctx, fleetstore.ReplicaPattern(escapeGlob(f.prefix)))
	if err != nil {
		return err
	}
	values, ttls, err := f.values(ctx, replicaKeys, true)
	if err != nil {
		return err
	}
	for i, key := range replicaKeys {
		if values[i] == nil {
			continue // expired since the scan: the replica is gone
		}
		var r replicaReport
		if err := json.Unmarshal([]byte(*values[i]), &r.ReplicaStatus); err != nil {
			rep.Unreadable = append(rep.Unreadable, key)
			continue
		}
		if ttls[i] > 0 {
			r.HeartbeatAgeMS = int64((fleetstore.HeartbeatTTL - ttls[i]) / time.Millisecond)
			if r.HeartbeatAgeMS < 0 {
				r.HeartbeatAgeMS = 0
			}
		}
		rep.Replicas = append(rep.Replicas, r)
	}
	sort.Slice(rep.Replicas, func(i, j int) bool { return rep.Replicas[i].ID < rep.Replicas[j].ID })
	if asJSON {
		return writeJSON(out, rep)
	}
	printStatus(out, rep, time.Now())
	return nil
}

// scan lists the keys matching pattern, sorted: on a Redis Cluster, those
// of every master (each holds its slots' keys).
func (f *fleet) scan(ctx context.Context, pattern string) ([]string, error) {
	var keys []string
	var mu sync.Mutex
	one := func(ctx context.Context, node redis.UniversalClient) error {
		var cursor uint64
		for {
			page, next, err := node.Scan(ctx, cursor, pattern, 200).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			keys = append(keys, page...)
			mu.Unlock()
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	var err error
	if cc, ok := f.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return one(ctx, node) })
	} else {
		err = one(ctx, f.rdb)
	}
	if err != nil {
		return nil, f.errorf("scanning "+pattern, err)
	}
	sort.Strings(keys)
	// SCAN may return a key twice.
	out := keys[:0]
	for i, k := range keys {
		if i == 0 || k != keys[i-1] {
			out = append(out, k)
		}
	}
	return out, nil
}

// values reads keys in one pipeline: each value (nil: gone) and, with
// withTTL, its remaining TTL.
func (f *fleet) values(ctx context.Context, keys []string, withTTL bool) ([]*string, []time.Duration, error) {
	if len(keys) == 0 {
		return nil, nil, nil
	}
	pipe := f.rdb.Pipeline()
	gets := make([]*redis.StringCmd, len(keys))
	ttls := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		gets[i] = pipe.Get(ctx, k)
		if withTTL {
			ttls[i] = pipe.PTTL(ctx, k)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, nil, f.errorf("reading keys", err)
	}
	values := make([]*string, len(keys))
	left := make([]time.Duration, len(keys))
	for i := range keys {
		if v, err := gets[i].Result(); err == nil {
			values[i] = &v
		}
		if withTTL {
			left[i] = ttls[i].Val()
		}
	}
	return values, left, nil
}

// escapeGlob quotes SCAN's pattern characters in a prefix.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func printStatus(out io.Writer, rep statusReport, now time.Time) {
	fmt.Fprintf(out, "fleet %s, prefix %q\n", rep.Redis, rep.Prefix)
	if len(rep.Switches) == 0 {
		fmt.Fprintln(out, "fleet switches: none (hedging runs as configured)")
	} else {
		fmt.Fprintln(out, "fleet switches:")
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		for _, s := range rep.Switches {
			route := s.Route
			if route == fleetstore.SwitchAllRoutes {
				route = "* (every route)"
			}
			fmt.Fprintf(tw, "  %s\t%s\n", route, s.Switch)
		}
		tw.Flush()
	}
	for _, k := range rep.Unreadable {
		fmt.Fprintf(out, "unreadable key (ignored): %s\n", k)
	}
	switch len(rep.Replicas) {
	case 0:
		fmt.Fprintln(out, "no live replicas")
		return
	case 1:
		fmt.Fprintln(out, "1 live replica")
	default:
		fmt.Fprintf(out, "%d live replicas\n", len(rep.Replicas))
	}
	for _, r := range rep.Replicas {
		fmt.Fprintln(out)
		fmt.Fprintf(out, "replica %s  %s  %s", r.ID, r.Kind, location(r.ReplicaStatus))
		if up, ok := uptime(r.Started, now); ok {
			fmt.Fprintf(out, "  up %v", up)
		}
		fmt.Fprintf(out, "  heartbeat %v ago\n", (time.Duration(r.HeartbeatAgeMS) * time.Millisecond).Round(100*time.Millisecond))
		if len(r.Routes) == 0 {
			fmt.Fprintln(out, "  no routes yet (a route shows from its first request on)")
			continue
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  ROUTE\tREQUESTS\tHEDGES\tHEDGE RATE\tBUDGET\tSWITCH\tSPEND\tCOOLED\tOPEN")
		for _, rt := range r.Routes {
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%.1f%%\t%.1f\t%s\t%s\t%s\t%s\n", rt.Name, rt.Requests, rt.Hedges,
				rt.HedgeRate*100, rt.BudgetTokens, orDash(rt.Switch), spend(rt), list(rt.Cooled), list(rt.Open))
		}
		tw.Flush()
	}
}

func location(r fleetstore.ReplicaStatus) string {
	host := r.Host
	if host == "" {
		host = "?"
	}
	if r.PID > 0 {
		return host + " pid " + strconv.Itoa(r.PID)
	}
	return host
}

// uptime is now - started (RFC 3339), by the replica's clock against this
// host's: a rough figure across hosts.
func uptime(started string, now time.Time) (time.Duration, bool) {
	t, err := time.Parse(time.RFC3339Nano, started)
	if err != nil || started == "" {
		return 0, false
	}
	up := now.Sub(t).Round(time.Second)
	if up < 0 {
		up = 0
	}
	return up, true
}

func spend(rt fleetstore.ReplicaRoute) string {
	s := strconv.FormatInt(rt.SpendTokens, 10) + " tok"
	if rt.SpendUSD > 0 {
		s += fmt.Sprintf(" $%.4f", rt.SpendUSD)
	}
	if rt.SpendCapped {
		s += " CAPPED"
	}
	return s
}

func list(names []string) string {
	if len(names) == 0 {
		return "-"
	}
	return strings.Join(names, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
