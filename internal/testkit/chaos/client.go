package chaos

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// requestDeadline bounds one client request: far above the route's
// timeout, so reaching it means the proxy hung.
const requestDeadline = 30 * time.Second

type runner struct {
	client *http.Client
	url    string
	reg    *Registry
}

func (rn *runner) scenario(s *Scenario) {
	if len(s.Reqs) == 1 {
		rn.do(s.Reqs[0])
		return
	}
	first, second := s.Reqs[0], s.Reqs[1]
	if s.Sequential {
		rn.do(first)
		rn.do(second)
		return
	}
	// The second request starts once the first reached an upstream, so that
	// it finds the first in flight; if the first never gets there (a
	// rejected request) it starts when the first ends.
	ended := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rn.do(first)
		close(ended)
	}()
	select {
	case <-rn.reg.Seen(first.ID):
	case <-ended:
	}
	rn.do(second)
	wg.Wait()
}

func (rn *runner) do(r *Request) {
	start := time.Now()
	r.Start = start
	defer func() { r.Elapsed = time.Since(start) }()
	ctx, cancel := context.WithTimeout(context.Background(), requestDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rn.url, strings.NewReader(r.Body))
	if err != nil {
		r.DoErr = err
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", authorization(r.Caller))
	req.Header.Set(HeaderRequest, r.ID)
	req.Header.Set(HeaderPlan, r.Plan.header())
	req.Header.Set(HeaderShape, r.Shape.header())
	if r.Key != "" {
		req.Header.Set("Idempotency-Key", r.Key)
	}
	if r.CancelAt == 0 {
		// Leave once an upstream has the request, before any answer.
		left, watcher := make(chan bool, 1), make(chan struct{})
		go func() {
			defer close(watcher)
			select {
			case <-rn.reg.Seen(r.ID):
				left <- true
				cancel()
			case <-ctx.Done():
				left <- false
			}
		}()
		defer func() {
			cancel()
			<-watcher
			r.Cancelled = <-left
		}()
	}
	resp, err := rn.client.Do(req)
	if err != nil {
		r.DoErr = err
		return
	}
	defer resp.Body.Close()
	r.Status = resp.StatusCode
	r.StatusMsg = resp.Status
	r.Header = resp.Header.Clone()
	buf := make([]byte, 32<<10)
	if r.Slow {
		buf = buf[:4<<10]
	}
	for {
		n, err := resp.Body.Read(buf)
		r.Got = append(r.Got, buf[:n]...)
		if r.CancelAt > 0 && len(r.Got) >= r.CancelAt {
			r.Cancelled = true
			cancel()
			return
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				r.DoErr = err // hung: reported as such
			}
			r.ReadErr = err
			return
		}
		if r.Slow {
			time.Sleep(time.Millisecond) // the slow reader's pace, not synchronisation
		}
	}
}
