package envoyfilter

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Duration is a time.Duration spelled as a Go duration string in the
// configuration file ("250ms", "1m30s"). A bare 0 is accepted; other bare
// numbers are rejected because their unit would be a guess.
type Duration time.Duration

// UnmarshalJSON accepts "250ms"-style strings and the number 0.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n float64
		if json.Unmarshal(b, &n) == nil && n == 0 {
			*d = 0
			return nil
		}
		return fmt.Errorf("duration %s: want a string such as \"250ms\"", b)
	}
	v, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("duration %q: %v", s, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// ByteSize is a size in bytes, spelled as an integer or as a string with a
// unit: "64KiB", "4MiB", "1GiB" (powers of 1024) or "4MB" (powers of 1000).
type ByteSize int64

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
	s = strings.TrimSpace(s)
	for _, u := range byteUnits {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
			if err != nil || v < 0 || v > (1<<62)/u.factor {
				return fmt.Errorf("size %q: want a non-negative integer before %s", s, u.suffix)
			}
			*b = ByteSize(v * u.factor)
			return nil
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("size %q: want an integer or a unit of KiB, MiB, GiB, KB, MB, GB", s)
	}
	*b = ByteSize(v)
	return nil
}
