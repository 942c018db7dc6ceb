package llmsim

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// Request is what a Server recorded about one request it received.
type Request struct {
	RequestID      string      // X-Sim-Request, else Idempotency-Key, else "sim-<n>"
	Method, Path   string      // as received
	Format         Format      // 0 for an unknown path
	Stream         bool        // whether the answer streams
	Model          string      // the body's "model" field
	Attempt        string      // the X-LLM-Hedge-Attempt header
	IdempotencyKey string      // the Idempotency-Key header
	Authorization  string      // the Authorization header
	Header         http.Header // every request header
	Body           []byte      // the request body
	At             time.Time   // when the handler started
}

// Cancellation records a request whose client went away before its answer
// ended.
type Cancellation struct {
	RequestID  string
	Attempt    string    // the X-LLM-Hedge-Attempt header
	At         time.Time // when the server observed the cancellation
	TokensSent int       // content tokens sent before it
}

// HeaderAttempt is the attempt number header set by the gateway.
const HeaderAttempt = "X-LLM-Hedge-Attempt"

// defaultLogLimit bounds the request and cancellation logs.
const defaultLogLimit = 10000

// counters is the Server's accounting. Its zero value is ready.
type counters struct {
	mu                                            sync.Mutex
	served, completed, failed, cancelled, flights int64
	attempts                                      map[string]int
	requests                                      []Request
	cancels                                       []Cancellation
	changed                                       chan struct{} // closed and replaced on every change
}

// outcome is how one request ended.
type outcome int

const (
	outcomeCancelled outcome = iota // the client went away (the default)
	outcomeCompleted                // the whole answer was sent
	outcomeFailed                   // a scripted or error answer was sent
	outcomeReset                    // the connection was reset on purpose
)

// Served returns the number of requests started.
func (s *Server) Served() int64 { s.mu.Lock(); defer s.mu.Unlock(); return s.served }

// Completed returns the number of requests whose whole answer was sent (a
// stream up to its terminator, or the full JSON).
func (s *Server) Completed() int64 { s.mu.Lock(); defer s.mu.Unlock(); return s.completed }

// Failed returns the number of requests answered with an error or a
// scripted failure (error status, error event, early [DONE], reset, unknown
// path, bad request).
func (s *Server) Failed() int64 { s.mu.Lock(); defer s.mu.Unlock(); return s.failed }

// Cancelled returns the number of requests whose client (or proxy) went
// away before the answer ended.
func (s *Server) Cancelled() int64 { s.mu.Lock(); defer s.mu.Unlock(); return s.cancelled }

// InFlight returns the number of handlers running now.
func (s *Server) InFlight() int64 { s.mu.Lock(); defer s.mu.Unlock(); return s.flights }

// Attempts returns how many requests with this request id were received.
func (s *Server) Attempts(requestID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts[requestID]
}

// Requests returns the recorded requests, oldest first: the last LogLimit of
// them.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return tail(s.requests, s.logLimit())
}

// Cancellations returns the recorded cancellations, oldest first: the last
// LogLimit of them.
func (s *Server) Cancellations() []Cancellation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return tail(s.cancels, s.logLimit())
}

// ResetCounters zeroes every counter and clears the logs (e.g. between a
// warm-up and a measurement). Requests in flight stay counted in InFlight.
func (s *Server) ResetCounters() {
	s.mu.Lock()
	s.served, s.completed, s.failed, s.cancelled = 0, 0, 0, 0
	s.attempts = nil
	s.requests, s.cancels = nil, nil
	s.notifyLocked()
	s.mu.Unlock()
}

// WaitFor blocks until cond returns true or ctx ends, re-evaluating cond
// after every change of the server's counters and logs. cond typically
// reads them, e.g. func() bool { return srv.Cancelled() >= 1 }. It lets a
// test wait for the server without sleeping.
func (s *Server) WaitFor(ctx context.Context, cond func() bool) error {
	for {
		s.mu.Lock()
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		ch := s.changed
		s.mu.Unlock()
		if cond() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// begin records a request that starts.
func (s *Server) begin(req Request) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.served++
	s.flights++
	if s.attempts == nil {
		s.attempts = map[string]int{}
	}
	s.attempts[req.RequestID]++
	s.requests = appendBounded(s.requests, req, s.logLimit())
	s.notifyLocked()
	return s.attempts[req.RequestID]
}

// finish records how a request ended, then calls OnCancel for a
// cancellation.
func (s *Server) finish(o outcome, c Cancellation) {
	s.mu.Lock()
	s.flights--
	switch o {
	case outcomeCompleted:
		s.completed++
	case outcomeFailed, outcomeReset:
		s.failed++
	case outcomeCancelled:
		s.cancelled++
		s.cancels = appendBounded(s.cancels, c, s.logLimit())
	}
	s.notifyLocked()
	s.mu.Unlock()
	if o == outcomeCancelled && s.OnCancel != nil {
		s.OnCancel(c.RequestID, c.At)
	}
}

func (s *Server) notifyLocked() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

func (s *Server) logLimit() int {
	if s.LogLimit > 0 {
		return s.LogLimit
	}
	return defaultLogLimit
}

// appendBounded appends v, and drops the oldest entries when the slice
// holds twice the limit, so appends stay amortised O(1).
func appendBounded[T any](xs []T, v T, limit int) []T {
	xs = append(xs, v)
	if len(xs) >= 2*limit {
		n := copy(xs, xs[len(xs)-limit:])
		clear(xs[n:])
		xs = xs[:n]
	}
	return xs
}

// tail returns a copy of the last limit entries of xs.
func tail[T any](xs []T, limit int) []T {
	if len(xs) > limit {
		xs = xs[len(xs)-limit:]
	}
	out := make([]T, len(xs))
	copy(out, xs)
	return out
}
