package redisproc

import "testing"

// INFO commandstats as redis-server 7.0 prints it.
const commandstatsBefore = "# Commandstats\r\n" +
	"cmdstat_evalsha:calls=10,usec=400,usec_per_call=40.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_mget:calls=10,usec=50,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_info:calls=3,usec=90,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n"

const commandstatsAfter = "# Commandstats\r\n" +
	"cmdstat_evalsha:calls=12,usec=480,usec_per_call=40.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_mget:calls=10,usec=50,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_config|resetstat:calls=1,usec=9,usec_per_call=9.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_hgetall:calls=1,usec=4,usec_per_call=4.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_info:calls=4,usec=120,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n"

func TestCallsSince(t *testing.T) {
	before, after := ParseCalls(commandstatsBefore), ParseCalls(commandstatsAfter)
	if got := before.String(); got != "evalsha=10 info=3 mget=10" {
		t.Errorf("ParseCalls(before) = %q, want evalsha=10 info=3 mget=10", got)
	}
	d := after.Since(before, "info", "config")
	if got := d.String(); got != "evalsha=2 hgetall=1" {
		t.Errorf("Since = %q, want evalsha=2 hgetall=1 (mget unchanged, info and config ignored)", got)
	}
	if d.Total() != 3 {
		t.Errorf("Total = %d, want 3", d.Total())
	}
}
