package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/redis/go-redis/v9"
)

// setIfUnchanged writes a switch key only if it still holds what the
// command read (compare and set, so that two operators changing the same
// route at once never lose one's change): ARGV[1] is the value read ("":
// none), ARGV[2] the new one ("": delete the key). It returns 1 when it
// wrote.
var setIfUnchanged = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == false then cur = '' end
if cur ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2]) end
return 1
`)

// switchChange is what pause, resume and set-delay did, as -json prints it.
type switchChange struct {
	Route   string `json:"route"`
	Key     string `json:"key"`
	Before  string `json:"before"`
	After   string `json:"after"`
	Changed bool   `json:"changed"`
	// Note explains an outcome an operator might not expect.
	Note string `json:"note,omitempty"`
}

// changeSwitch applies paused and delay (nil: unchanged) to route's fleet
// switch, deleting the key when the switch is back to the zero Switch, and
// prints what changed.
func changeSwitch(ctx context.Context, f *fleet, out io.Writer, asJSON bool, route string, paused *bool, delay *time.Duration) error {
	key := fleetstore.SwitchKey(f.prefix, route)
	var before, after fleetstore.Switch
	unreadable := false
	for attempt := 0; ; attempt++ {
		raw, err := f.rdb.Get(ctx, key).Result()
		if err == redis.Nil {
			raw = ""
		} else if err != nil {
			return f.errorf("reading "+key, err)
		}
		before = fleetstore.Switch{}
		unreadable = false
		if raw != "" {
			// An unreadable value is replaced: the engine treats it as no
			// switch too.
			if s, err := fleetstore.DecodeSwitch(raw); err == nil {
				before = s
			} else {
				unreadable = true
			}
		}
		after = fleetstore.ChangeSwitch(before, paused, delay)
		next := ""
		if !after.IsZero() {
			next = fleetstore.EncodeSwitch(after)
		}
		if next == raw {
			break
		}
		wrote, err := setIfUnchanged.Run(ctx, f.rdb, []string{key}, raw, next).Int()
		if err != nil {
			return f.errorf("writing "+key, err)
		}
		if wrote == 1 {
			break
		}
		if attempt >= 10 {
			return fmt.Errorf("fleet %s: %s keeps changing under this command; try again", f.name, key)
		}
	}
	c := switchChange{Route: route, Key: key, Before: fleetstore.DescribeSwitch(before), After: fleetstore.DescribeSwitch(after), Changed: before != after}
	c.Note = f.switchNote(ctx, route, after, paused)
	if unreadable {
		c.Note = "the key held an unreadable value (the replicas ignored it); it is replaced"
	}
	if asJSON {
		return writeJSON(out, c)
	}
	what := "route " + route
	if route == fleetstore.SwitchAllRoutes {
		what = "every route (*)"
	}
	if c.Changed {
		fmt.Fprintf(out, "%s: %s -> %s (fleet-wide; every replica applies it within 1s)\n", what, c.Before, c.After)
	} else {
		fmt.Fprintf(out, "%s: already %s, unchanged\n", what, c.After)
	}
	if c.Note != "" {
		fmt.Fprintln(out, "note: "+c.Note)
	}
	return nil
}

// switchNote says when the switch now set is not the whole story: a resume
// that keeps a delay override, or a route that stays paused by the switch
// of every route.
func (f *fleet) switchNote(ctx context.Context, route string, after fleetstore.Switch, paused *bool) string {
	resumed := paused != nil && !*paused
	if resumed && after.Delay > 0 {
		return fmt.Sprintf("resume keeps the delay override %v; `set-delay -route %s auto` removes it", after.Delay, route)
	}
	if route == fleetstore.SwitchAllRoutes || !resumed {
		return ""
	}
	raw, err := f.rdb.Get(ctx, fleetstore.SwitchKey(f.prefix, fleetstore.SwitchAllRoutes)).Result()
	if err != nil {
		return ""
	}
	if all, err := fleetstore.DecodeSwitch(raw); err == nil && all.Paused {
		return "every route is paused (switch *): route " + route + " stays paused until `resume` without -route"
	}
	return ""
}
