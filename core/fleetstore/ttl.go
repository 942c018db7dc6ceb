package fleetstore

import (
	"strconv"
	"time"
)

// StreamLinger is how long a generation's stream outlives its last
// renewal or its end, for followers still reading it; capped by the TTL.
const StreamLinger = 60 * time.Second

// StreamMillis is the stream linger capped by the TTL, in milliseconds.
func StreamMillis(ttl time.Duration) string {
	return LingerMillis(StreamLinger, ttl)
}

// LingerMillis is d capped by the TTL, in milliseconds.
func LingerMillis(d, ttl time.Duration) string {
	if ttl > 0 && ttl < d {
		d = ttl
	}
	return Millis(d)
}

// Millis is d in whole milliseconds, at least 1 (PX takes no 0).
func Millis(d time.Duration) string {
	ms := int64(d / time.Millisecond)
	if ms < 1 {
		ms = 1
	}
	return strconv.FormatInt(ms, 10)
}

// An ended stream's readers are the followers that joined before its end:
// blocked ones get the end at once, others are catching up. It lingers
// EndLinger for them, or DoneLinger when the same bytes were stored (a
// follower further behind finishes from the stored answer); a new request
// after the end replays the stored answer or runs afresh, never reads it.
const (
	EndLinger  = 10 * time.Second
	DoneLinger = time.Second
)

// While no follower reads a generation (as the leader's last write
// reported), its data waits up to LoneBatchWindow, or until LoneBatchBytes
// are queued, and goes in one write: such a stream is read only by a
// follower that joins later, which reads what is in and gets the rest
// within the window (the next write tells the leader, and from then on
// every write goes at once). A lone 20-event answer takes a handful of
// commands, not one per event.
const (
	LoneBatchWindow = 50 * time.Millisecond
	LoneBatchBytes  = 64 << 10
)
