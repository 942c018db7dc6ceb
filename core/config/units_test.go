package config

import (
	"strings"
	"testing"
	"time"
)

// Every spelling a host writes decodes into the same Duration. The tests
// call UnmarshalJSON directly: under Yaegi encoding/json does not see an
// interpreted type's UnmarshalJSON (only compiled hosts decode core's
// JSON; Traefik fills its mirror). coretest decodes whole configs.
func TestDurationDecodesEveryHostSpelling(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
	}{
		{`"250ms"`, 250 * time.Millisecond},
		{`" 1m30s "`, 90 * time.Second},
		{`"1d12h"`, 36 * time.Hour}, // Caddy's day unit
		{`"-1s"`, -time.Second},
		{`"off"`, -1},
		{`250000000`, 250 * time.Millisecond}, // Caddy JSON: nanoseconds
		{`0`, 0},
		{`-1`, -1},  // Caddy JSON of `ttl off`
		{`null`, 0}, // no change, as encoding/json does for null
	} {
		var d Duration
		if err := d.UnmarshalJSON([]byte(c.in)); err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if d.D() != c.want {
			t.Errorf("%s = %v, want %v", c.in, d.D(), c.want)
		}
	}
	for _, c := range []struct{ in, want string }{
		{`"soon"`, `duration "soon"`},
		{`30`, `want a string such as "250ms"`}, // a unit left out
		{`true`, `want a string such as "250ms"`},
	} {
		var d Duration
		err := d.UnmarshalJSON([]byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to say %q", c.in, err, c.want)
		}
	}
}

func TestByteSizeDecodesIntegersAndUnits(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{`4194304`, 4 << 20}, {`"4MiB"`, 4 << 20}, {`"64KiB"`, 64 << 10}, {`"1GiB"`, 1 << 30},
		{`"4MB"`, 4000000}, {`"512B"`, 512}, {`"1024"`, 1024}, {`" 2 MiB "`, 2 << 20},
	} {
		var b ByteSize
		if err := b.UnmarshalJSON([]byte(c.in)); err != nil {
			t.Errorf("%s: %v", c.in, err)
		} else if int64(b) != c.want {
			t.Errorf("%s = %d, want %d", c.in, b, c.want)
		}
	}
	for _, in := range []string{`"4 lots"`, `"-1MiB"`, `true`} {
		var b ByteSize
		if err := b.UnmarshalJSON([]byte(in)); err == nil {
			t.Errorf("%s: err = nil, want an error", in)
		} else if !strings.Contains(err.Error(), "size") {
			t.Errorf("%s: err.Error() = %q, want it to contain \"size\"", in, err.Error())
		}
	}
}

func TestExpandUpstreamsCoversEveryReferenceAndCopies(t *testing.T) {
	c := Config{Upstreams: []UpstreamConfig{{URL: "http://$H", Model: "$M", SetHeaders: map[string]string{"Authorization": "Bearer $K"}}}}
	vars := map[string]string{"$H": "h", "$M": "m", "$K": "k"}
	got, err := c.ExpandUpstreams(func(v string) (string, error) {
		for ref, val := range vars {
			v = strings.ReplaceAll(v, ref, val)
		}
		return v, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	u := got.Upstreams[0]
	if u.URL != "http://h" {
		t.Errorf("u.URL = %q, want \"http://h\"", u.URL)
	} else if u.Model != "m" {
		t.Errorf("u.Model = %q, want \"m\"", u.Model)
	} else if u.SetHeaders["Authorization"] != "Bearer k" {
		t.Errorf("u.SetHeaders[\"Authorization\"] = %q, want \"Bearer k\"", u.SetHeaders["Authorization"])
	}
	if c.Upstreams[0].SetHeaders["Authorization"] != "Bearer $K" {
		t.Errorf("the original was changed: c.Upstreams[0].SetHeaders[\"Authorization\"] = %q, want \"Bearer $K\"", c.Upstreams[0].SetHeaders["Authorization"])
	} else if c.Upstreams[0].URL != "http://$H" {
		t.Errorf("the original was changed: c.Upstreams[0].URL = %q, want \"http://$H\"", c.Upstreams[0].URL)
	}
	_, err = c.ExpandUpstreams(func(v string) (string, error) {
		if strings.Contains(v, "$K") {
			return "", errString("K is not set")
		}
		return v, nil
	})
	if err == nil {
		t.Errorf("err = nil, want an error")
	} else if err.Error() != "upstream 0: set_headers Authorization: K is not set" {
		t.Errorf("err.Error() = %q, want \"upstream 0: set_headers Authorization: K is not set\"", err.Error())
	}
}

type errString string

func (e errString) Error() string { return string(e) }
