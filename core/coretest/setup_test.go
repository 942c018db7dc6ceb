package coretest

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// rig is two simulated upstreams (A primary, B hedge) behind a core Hedger
// served on loopback.
type rig struct {
	a, b     *llmsim.Running
	front    *httptest.Server
	hedger   *core.Hedger
	mu       sync.Mutex
	reports  []*core.Report
	commits  map[string]time.Time // request id -> winner commit, for hedged requests
	workload llmsim.Workload
	close    func() // idempotent
}

func newRig(t testing.TB, w llmsim.Workload, cfg config.Config) *rig {
	r := &rig{workload: w, commits: make(map[string]time.Time)}
	r.a = llmsim.Start("A", w)
	r.b = llmsim.Start("B", w)
	cfg.Upstreams = []config.UpstreamConfig{{Name: "A", URL: r.a.URL}, {Name: "B", URL: r.b.URL}}
	transport := &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}
	h, err := core.New(cfg, core.Options{Transport: transport, Observer: core.ObserverFunc(func(rep *core.Report) {
		id := rep.Request.Header.Get(llmsim.HeaderRequest)
		rep.Request = nil // keep no request alive
		r.mu.Lock()
		if rep.HedgesStarted > 0 && !rep.CommitAt.IsZero() {
			r.commits[id] = rep.CommitAt
		}
		r.reports = append(r.reports, rep)
		r.mu.Unlock()
	})})
	if err != nil {
		t.Fatal(err)
	}
	r.hedger = h
	r.front = httptest.NewServer(h)
	var once sync.Once
	r.close = func() {
		once.Do(func() {
			r.front.Close()
			r.a.Close()
			r.b.Close()
			transport.CloseIdleConnections()
		})
	}
	t.Cleanup(r.close)
	return r
}

func (r *rig) takeReports() []*core.Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.reports
	r.reports = nil
	return out
}

func (r *rig) served() int64 { return r.a.Served() + r.b.Served() }
