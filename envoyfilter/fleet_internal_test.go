package envoyfilter

import (
	"context"
	"testing"
	"time"
)

// Routes with the same fleet settings share one client; a reload with the
// same settings keeps it (connections and breaker state), one with other
// settings makes a new one and closes the old.
func TestFleetClientSharedAndKeptAcrossReloads(t *testing.T) {
	parse := func(yaml string) *FileConfig {
		cfg, err := ParseConfig([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	const routes = "routes:\n  - {name: a, upstreams: [{url: 'http://a:1'}]}\n  - {name: b, upstreams: [{url: 'http://b:1'}]}\n"
	s, err := NewServer(parse("fleet: {url: 'redis://127.0.0.1:1/0'}\n"+routes), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.fleets) != 1 {
		t.Fatalf("%d fleet clients for two routes with one fleet, want 1", len(s.fleets))
	}
	var first *serverFleet
	for _, f := range s.fleets {
		first = f
	}
	if err := s.Reload(parse("fleet: {url: 'redis://127.0.0.1:1/0'}\n" + routes)); err != nil {
		t.Fatal(err)
	}
	for _, f := range s.fleets {
		if f != first {
			t.Error("a reload with the same fleet settings made a new client")
		}
	}
	if err := s.Reload(parse("fleet: {url: 'redis://127.0.0.1:1/0', lease: 5s}\n" + routes)); err != nil {
		t.Fatal(err)
	}
	for _, f := range s.fleets {
		if f == first {
			t.Error("a reload with other fleet settings kept the old client")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := first.client.Do(ctx, "PING"); err == nil || err.Error() != "redis: client is closed" {
		t.Errorf("the replaced client: PING error %v, want it closed", err)
	}
	if err := s.Reload(parse(routes)); err != nil {
		t.Fatal(err)
	}
	if len(s.fleets) != 0 {
		t.Errorf("%d fleet clients after the fleet was removed, want 0", len(s.fleets))
	}
	s.closeFleets()
}
