package resp

import (
	"errors"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// Slot computation, redirection and CLUSTER SLOTS parsing, and cluster URLs:
// no server needed (these run under Yaegi too).

func TestKeySlotKnownValues(t *testing.T) {
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#04x, want 0x31c3 (CRC-16/XMODEM check value)", got)
	}
	cases := []struct {
		key  string
		slot int
	}{
		{"foo", 12182},
		{"bar", 5061},
		{"somekey", 11058},
		{"foo{hash_tag}", 2515},
		{"{hash_tag}", 2515},
		{"hash_tag", 2515},
		{"{user1000}.following", keySlot("user1000")},
		{"{}", int(crc16("{}") % numSlots)},           // empty tag: the whole key
		{"a{}b{c}", int(crc16("a{}b{c}") % numSlots)}, // the first "{" decides, and its tag is empty
		{"x{y}z{w}", keySlot("y")},                    // the first tag only
		{"{", int(crc16("{") % numSlots)},             // no "}"
		{"}{x}", keySlot("x")},                        // a "}" before the "{" does not count
		{"{{x}}", keySlot("{x")},                      // tag up to the first "}"
		{"", 0},
	}
	for _, tc := range cases {
		if got := keySlot(tc.key); got != tc.slot {
			t.Errorf("keySlot(%q) = %d, want %d", tc.key, got, tc.slot)
		}
	}
}

func TestCommandKey(t *testing.T) {
	cases := []struct {
		cmd []string
		key string // "" for none
	}{
		{[]string{"GET", "k"}, "k"},
		{[]string{"get", "k"}, "k"},
		{[]string{"EVALSHA", "abc", "2", "k1", "k2", "arg"}, "k1"},
		{[]string{"EVAL", "return 1", "0", "arg"}, ""},
		{[]string{"XREAD", "COUNT", "512", "BLOCK", "1000", "STREAMS", "s", "0-0"}, "s"},
		{[]string{"XREAD", "COUNT", "1", "streams", "s2", "$"}, "s2"},
		{[]string{"BLMPOP", "1", "1", "l", "LEFT"}, "l"},
		{[]string{"ZUNION", "2", "z1", "z2"}, "z1"},
		{[]string{"XINFO", "STREAM", "s"}, "s"},
		{[]string{"PING"}, ""},
		{[]string{"INFO", "clients"}, ""},
		{[]string{"SCRIPT", "LOAD", "return 1"}, ""},
		{[]string{"CLUSTER", "KEYSLOT", "k"}, ""},
		{[]string{"HINCRBY", "h", "f", "1"}, "h"},
	}
	for _, tc := range cases {
		key, ok := commandKey(tc.cmd)
		if ok != (tc.key != "") || key != tc.key {
			t.Errorf("commandKey(%q) = %q, %v; want %q", tc.cmd, key, ok, tc.key)
		}
	}
}

func TestCommandsSlot(t *testing.T) {
	slot, err := commandsSlot([][]string{{"DEL", "{r}:a"}, {"PING"}, {"ZREM", "{r}:b", "m"}})
	if err != nil || slot != keySlot("r") {
		t.Fatalf("one hash tag: slot %d, err %v; want %d, nil", slot, err, keySlot("r"))
	}
	slot, err = commandsSlot([][]string{{"PING"}, {"INFO"}})
	if err != nil || slot != -1 {
		t.Fatalf("no keys: slot %d, err %v; want -1, nil", slot, err)
	}
	_, err = commandsSlot([][]string{{"SET", "foo", "1"}, {"SET", "bar", "2"}})
	if !errors.Is(err, ErrCrossSlot) || !strings.Contains(err.Error(), "slot 12182") || !strings.Contains(err.Error(), "slot 5061") {
		t.Fatalf("keys on slots 12182 and 5061: err = %v, want ErrCrossSlot naming both slots", err)
	}
}

func TestParseRedirect(t *testing.T) {
	cases := []struct {
		msg  string
		ok   bool
		ask  bool
		slot int
		addr string
	}{
		{"MOVED 3999 127.0.0.1:6381", true, false, 3999, "127.0.0.1:6381"},
		{"ASK 3999 127.0.0.1:6381", true, true, 3999, "127.0.0.1:6381"},
		{"MOVED 0 :6381", true, false, 0, ":6381"},
		{"MOVED 16384 127.0.0.1:6381", false, false, 0, ""},
		{"MOVED x 127.0.0.1:6381", false, false, 0, ""},
		{"MOVED 1 nohostport", false, false, 0, ""},
		{"ERR MOVED 1 h:1", false, false, 0, ""},
		{"CROSSSLOT Keys in request don't hash to the same slot", false, false, 0, ""},
	}
	for _, tc := range cases {
		ask, slot, addr, ok := parseRedirect(tc.msg)
		if ok != tc.ok || ok && (ask != tc.ask || slot != tc.slot || addr != tc.addr) {
			t.Errorf("parseRedirect(%q) = ask %v, slot %d, %q, ok %v; want ask %v, slot %d, %q, ok %v", tc.msg, ask, slot, addr, ok, tc.ask, tc.slot, tc.addr, tc.ok)
		}
	}
	if got := resolveAddr(":6381", "10.0.0.2:7000"); got != "10.0.0.2:6381" {
		t.Errorf("resolveAddr(:6381) from 10.0.0.2:7000 = %q, want 10.0.0.2:6381", got)
	}
	if got := resolveAddr("::1:6381", "[::1]:7000"); got != "[::1]:6381" {
		t.Errorf("resolveAddr(::1:6381) = %q, want [::1]:6381", got)
	}
}

func str(s string) fleetstore.RedisValue {
	return fleetstore.RedisValue{Kind: fleetstore.RedisString, Str: s}
}

func num(n int64) fleetstore.RedisValue {
	return fleetstore.RedisValue{Kind: fleetstore.RedisInt, Int: n}
}

func arr(vs ...fleetstore.RedisValue) fleetstore.RedisValue {
	return fleetstore.RedisValue{Kind: fleetstore.RedisArray, Array: vs}
}

func TestParseClusterSlots(t *testing.T) {
	reply := arr(
		arr(num(0), num(5460), arr(str("127.0.0.1"), num(30001), str("id1"), arr()), arr(str("127.0.0.1"), num(30004), str("id4"))),
		arr(num(5461), num(10922), arr(str(""), num(30002), str("id2"))),
		arr(num(10923), num(16383), arr(fleetstore.RedisValue{}, num(30003), str("id3"))),
		arr(num(100), num(100), arr(str("?"), num(30009), str("id9"))),
	)
	got, err := parseClusterSlots(reply, "10.1.1.1:30001")
	if err != nil {
		t.Fatalf("parseClusterSlots: %v", err)
	}
	want := []slotRange{{0, 5460, "127.0.0.1:30001"}, {5461, 10922, "10.1.1.1:30002"}, {10923, 16383, "10.1.1.1:30003"}}
	if len(got) != len(want) {
		t.Fatalf("parseClusterSlots = %v, want %v (the \"?\" endpoint left out)", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("range %d = %v, want %v", i, got[i], want[i])
		}
	}
	if _, err := parseClusterSlots(arr(arr(num(0), num(99999), arr(str("h"), num(1)))), "h:1"); err == nil {
		t.Error("a range past slot 16383 parsed, want an error")
	}
	if _, err := parseClusterSlots(str("OK"), "h:1"); err == nil {
		t.Error("a string reply parsed, want an error")
	}
}

func TestClusterURL(t *testing.T) {
	c, err := New(Options{URL: "redis+cluster://user:pw@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002/"})
	if err != nil {
		t.Fatalf("New with a cluster URL: %v", err)
	}
	if c.cl == nil || c.single != nil {
		t.Fatal("redis+cluster:// made a single-server client")
	}
	if got := strings.Join(c.ep.seeds, " "); got != "10.0.0.1:7000 10.0.0.2:7001 [::1]:7002" {
		t.Errorf("seeds = %q, want the three nodes", got)
	}
	if c.ep.user != "user" || c.ep.password != "pw" || c.ep.useTLS {
		t.Errorf("credentials %q/%q TLS %v, want user/pw without TLS", c.ep.user, c.ep.password, c.ep.useTLS)
	}
	if c.Addr() != "10.0.0.1:7000,10.0.0.2:7001,[::1]:7002" {
		t.Errorf("Addr() = %q, want the nodes joined by commas", c.Addr())
	}
	c2, err := New(Options{URL: "rediss+cluster://h1:7000"})
	if err != nil {
		t.Fatalf("New with rediss+cluster://h1:7000: %v", err)
	}
	if !c2.ep.useTLS || c2.cl == nil {
		t.Errorf("rediss+cluster:// TLS %v cluster %v, want both", c2.ep.useTLS, c2.cl != nil)
	}
	for _, bad := range []string{
		"redis+cluster://h1:7000,,h2:7001/",
		"redis+cluster://:secret@h1:7000,h2:7001/3",
		"redis+cluster://:secret@h1:notaport/",
	} {
		_, err := New(Options{URL: bad})
		if err == nil {
			t.Errorf("New(%q) succeeded, want an error", bad)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("New(%q) error %q shows the password", bad, err)
		}
	}
}
