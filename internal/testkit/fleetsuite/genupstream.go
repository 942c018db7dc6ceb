package fleetsuite

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// GenUpstream is a simulated upstream whose answers tell generations
// apart: the n-th request it gets with an Idempotency-Key key is answered
// as llmsim's request GenID(key, n), so each generation's text
// (llmsim.ExpectedChatText) is its own, and any answer names the one
// generation its first token came from. Keys named long-* are answered by
// a second workload.
type GenUpstream struct {
	URL string

	sim, long *llmsim.Server
	ts        *httptest.Server

	mu      sync.Mutex
	starts  map[string][]time.Time // key: when each generation reached the upstream
	changed chan struct{}          // closed and replaced on every new generation
}

// StartGenUpstream serves w, and long for keys named long-*, on loopback
// until the end of the test.
func StartGenUpstream(t interface{ Cleanup(func()) }, w, long llmsim.Workload) *GenUpstream {
	u := &GenUpstream{sim: &llmsim.Server{Name: "A", Workload: w}, long: &llmsim.Server{Name: "A", Workload: long},
		starts: map[string][]time.Time{}, changed: make(chan struct{})}
	u.ts = httptest.NewServer(u)
	u.URL = u.ts.URL
	t.Cleanup(func() {
		u.ts.CloseClientConnections()
		u.ts.Close()
	})
	return u
}

// GenID is llmsim's request id of key's generation n (from 1).
func GenID(key string, n int) string { return key + "~g" + strconv.Itoa(n) }

// ParseGen is the generation an answer's text comes from (its first
// token's request id): key and number; ok false when text names none.
func ParseGen(text string) (key string, n int, ok bool) {
	id, _, found := strings.Cut(text, ":")
	if !found {
		return "", 0, false
	}
	i := strings.LastIndex(id, "~g")
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(id[i+2:])
	if err != nil {
		return "", 0, false
	}
	return id[:i], n, true
}

// ServeHTTP numbers the request's generation and answers it as llmsim.
func (u *GenUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(llmsim.HeaderIdempotencyKey)
	if key != "" {
		u.mu.Lock()
		u.starts[key] = append(u.starts[key], time.Now())
		n := len(u.starts[key])
		close(u.changed)
		u.changed = make(chan struct{})
		u.mu.Unlock()
		r.Header.Set(llmsim.HeaderRequest, GenID(key, n))
	}
	u.server(key).ServeHTTP(w, r)
}

// server is the simulated upstream that answers key.
func (u *GenUpstream) server(key string) *llmsim.Server {
	if strings.HasPrefix(key, "long-") {
		return u.long
	}
	return u.sim
}

// Attempts is how many generations of key the upstream started.
func (u *GenUpstream) Attempts(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.starts[key])
}

// Started is when generation n (from 1) of key reached the upstream.
func (u *GenUpstream) Started(key string, n int) time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	if n < 1 || n > len(u.starts[key]) {
		return time.Time{}
	}
	return u.starts[key][n-1]
}

// Generations is how many generations the upstream started in all.
func (u *GenUpstream) Generations() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, s := range u.starts {
		n += len(s)
	}
	return n
}

// Expected is the whole text of key's generation n.
func (u *GenUpstream) Expected(key string, n int) string {
	return llmsim.ExpectedChatText(GenID(key, n), u.server(key).Workload.WithDefaults().Tokens)
}

// WaitFor blocks until cond holds, re-checking it on every new generation,
// or until ctx ends.
func (u *GenUpstream) WaitFor(ctx context.Context, cond func() bool) error {
	for {
		u.mu.Lock()
		changed := u.changed
		u.mu.Unlock()
		if cond() {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
