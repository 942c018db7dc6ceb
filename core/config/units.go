package config

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Duration is a time.Duration as the hosts write it. In JSON (Caddy's
// config, Envoy's YAML) it is a string such as "250ms", "1m30s" or "1d"
// (24h, as Caddy allows), "off" (-1: disabled, where an option has an off),
// or an integer of nanoseconds, which is what `caddy adapt` writes. A
// positive integer below a millisecond is rejected: it is a duration whose
// unit was left out ("timeout: 30"), not 30 nanoseconds anyone meant.
// Duration encodes as its integer nanoseconds. Decoding runs compiled
// only: under Yaegi encoding/json does not call an interpreted type's
// UnmarshalJSON (Traefik decodes into its own mirror, never into these).
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String is the time.Duration spelling, e.g. "1m0s".
func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalJSON accepts the forms Duration documents.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil // the convention of encoding/json: no change
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if json.Unmarshal(b, &n) != nil || n > 0 && n < int64(time.Millisecond) {
			return fmt.Errorf("duration %s: want a string such as \"250ms\"", b)
		}
		*d = Duration(n)
		return nil
	}
	v, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// ParseDuration reads a duration string: Go's syntax ("250ms", "-1s"),
// with days as "d" ("1d12h"), or "off" (-1).
func ParseDuration(s string) (Duration, error) {
	s = strings.TrimSpace(s)
	if s == "off" {
		return -1, nil
	}
	v, err := time.ParseDuration(daysToHours(s))
	if err != nil {
		return 0, fmt.Errorf("duration %q: %v", s, err)
	}
	return Duration(v), nil
}

// daysToHours rewrites every "<number>d" of s as hours, so that
// time.ParseDuration reads it ("1.5d" becomes "36h"). A number it cannot
// read is left for time.ParseDuration to report.
func daysToHours(s string) string {
	if !strings.Contains(s, "d") {
		return s
	}
	var out strings.Builder
	start := 0 // where the current number starts
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch >= '0' && ch <= '9' || ch == '.' {
			continue
		}
		if ch == 'd' && i > start {
			days, err := strconv.ParseFloat(s[start:i], 64)
			if err == nil {
				out.WriteString(strconv.FormatFloat(days*24, 'f', -1, 64))
				out.WriteString("h")
				start = i + 1
				continue
			}
		}
		out.WriteString(s[start : i+1])
		start = i + 1
	}
	out.WriteString(s[start:])
	return out.String()
}

// ByteSize is a size in bytes: an integer, or a string with a unit, "64KiB",
// "4MiB", "1GiB" (powers of 1024) or "4KB", "4MB", "1GB" (powers of 1000).
// It encodes as its integer.
type ByteSize int64

// byteUnits are tried in order: the longer suffixes first.
var byteUnits = []struct {
	suffix string
	factor int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000},
	{"B", 1},
}

// UnmarshalJSON accepts an integer or a string such as "4MiB".
func (b *ByteSize) UnmarshalJSON(data []byte) error {
	var n int64
	if err := json.Unmarshal(data, &n); err == nil {
		*b = ByteSize(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("size %s: want an integer or a string such as \"4MiB\"", data)
	}
	v, err := ParseByteSize(s)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// ParseByteSize reads "4MiB", "4MB", "512B" or a plain integer.
func ParseByteSize(s string) (ByteSize, error) {
	s = strings.TrimSpace(s)
	for _, u := range byteUnits {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
			if err != nil || v < 0 || v > (1<<62)/u.factor {
				return 0, fmt.Errorf("size %q: want a non-negative integer before %s", s, u.suffix)
			}
			return ByteSize(v * u.factor), nil
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: want an integer or a unit of KiB, MiB, GiB, KB, MB, GB", s)
	}
	return ByteSize(v), nil
}

// Fraction is a share such as a margin: a number (0.25) or, as a string, a
// percentage ("25%") or a number ("0.25"). It encodes as its number.
type Fraction float64

// UnmarshalJSON accepts the forms Fraction documents.
func (f *Fraction) UnmarshalJSON(b []byte) error {
	var n float64
	if err := json.Unmarshal(b, &n); err == nil {
		*f = Fraction(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("fraction %s: want a number such as 0.25 or a string such as \"25%%\"", b)
	}
	v, err := ParseFraction(s)
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// ParseFraction reads "25%" (0.25) or a plain number ("0.25").
func ParseFraction(s string) (Fraction, error) {
	s = strings.TrimSpace(s)
	scale := 1.0
	if num, ok := strings.CutSuffix(s, "%"); ok {
		s = strings.TrimSpace(num)
		scale = 100
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("fraction %q: want a number such as 0.25 or a percentage such as 25%%", s)
	}
	return Fraction(v / scale), nil
}
