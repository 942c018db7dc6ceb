package regimeload

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

func TestSelectVariants(t *testing.T) {
	all, err := SelectVariants("")
	if err != nil || len(all) != 7 {
		t.Fatalf("SelectVariants(\"\") = %d variants, %v; want all 7", len(all), err)
	}
	some, err := SelectVariants(" g,a ")
	if err != nil || len(some) != 2 || some[0].Name != "a" || some[1].Name != "g" {
		t.Fatalf("SelectVariants(\" g,a \") = %+v, %v; want a then g", some, err)
	}
	if _, err := SelectVariants("a,h"); err == nil {
		t.Fatal("SelectVariants(\"a,h\") accepted an unknown variant")
	}
}

// The incidents start where they should, at the reference scale: inside
// a window, except b (calm for 2.5 s) and g (calm for 1 s, the restart
// 0.75 s into the window); the CI form shortens the calm lead-ins and the
// time before the restart to 0.25 s.
func TestTimeline(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const scale = 0.05
	type want struct{ window, restart time.Duration } // from the run's start; restart 0: none
	long := map[string]want{"b": {window: 2500 * time.Millisecond}, "g": {window: time.Second, restart: 1750 * time.Millisecond}}
	ci := map[string]want{"b": {window: 250 * time.Millisecond}, "g": {window: 250 * time.Millisecond, restart: 500 * time.Millisecond}}
	for _, v := range Variants {
		for _, form := range []struct {
			ci    bool
			wants map[string]want
		}{{false, long}, {true, ci}} {
			w := form.wants[v.Name]
			g, switchAt := Timeline(v, start, scale, form.ci)
			ws := g.Windows(start.Add(10*time.Second), scale)
			if len(ws) == 0 {
				t.Fatalf("%s (ci %v): no degraded window in 10 s", v.Name, form.ci)
			}
			if got := ws[0][0].Sub(start); got != w.window {
				t.Errorf("%s (ci %v): the first window begins %v into the run, want %v", v.Name, form.ci, got, w.window)
			}
			if got := g.Degraded(start, scale); got != (w.window == 0) {
				t.Errorf("%s (ci %v): the run's first request degraded = %v", v.Name, form.ci, got)
			}
			switch {
			case w.restart == 0 && !switchAt.IsZero():
				t.Errorf("%s (ci %v): switches instances at %v, want never", v.Name, form.ci, switchAt)
			case w.restart != 0 && (switchAt.Sub(start) != w.restart || !g.Degraded(switchAt, scale)):
				t.Errorf("%s (ci %v): switches %v into the run (degraded %v), want %v, inside the window",
					v.Name, form.ci, switchAt.Sub(start), g.Degraded(switchAt, scale), w.restart)
			}
		}
	}
}

// The CI form runs each variant with one client, taking turns.
func TestClientsFor(t *testing.T) {
	long, ci := IncidentOptions{}, IncidentOptions{CI: true}
	if got := long.clientsFor(3); len(got) != 2 {
		t.Errorf("the long form runs %d clients, want both", len(got))
	}
	names := func(cs []Client) string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return strings.Join(out, "+")
	}
	if a, b := names(ci.clientsFor(0)), names(ci.clientsFor(1)); a != "sdk" || b != "light" {
		t.Errorf("the CI form runs %q then %q, want the SDK then the light client", a, b)
	}
}

func TestBudgetShare(t *testing.T) {
	if got, want := BudgetShare(4000, 0), 0.1025; got < want-1e-12 || got > want+1e-12 {
		t.Fatalf("BudgetShare(4000, 0) = %v, want %v (the default ratio and burst)", got, want)
	}
	if got, want := BudgetShare(4000, 20*time.Second), 0.1075; got < want-1e-12 || got > want+1e-12 {
		t.Fatalf("BudgetShare(4000, 20s) = %v, want %v (and two bursts refilled by time)", got, want)
	}
}

// readChatSSE reads llmsim's exact stream, pings included, into an answer
// that settles as the SDK's would; a cut stream and an error event fail.
func TestReadChatSSE(t *testing.T) {
	stream := func(id string) string {
		body := string(llmsim.ExpectedStream("B", llmsim.DefaultModel, id, 20))
		return llmsim.Ping + strings.Replace(body, "\n\n", "\n\n"+llmsim.KeepAlive, 1)
	}
	var a answer
	if err := readChatSSE(strings.NewReader(stream("r7")), &a, time.Now()); err != nil {
		t.Fatal(err)
	}
	out := Request{ID: "r7"}
	a.settle(&out, 20, `llmhedge;desc="attempts=2 winner=1 upstream=B primary=A primary_changes=2"`)
	if out.Err != "" || out.Winner != "B" || out.First != "A" || out.Changes != 2 || out.TTFT <= 0 {
		t.Fatalf("settled %+v; want winner B, first A, 2 changes, a TTFT", out)
	}

	a = answer{}
	if err := readChatSSE(strings.NewReader(stream("r8")), &a, time.Now()); err != nil {
		t.Fatal(err)
	}
	out = Request{ID: "r9"} // another request's text
	a.settle(&out, 20, "")
	if !strings.HasPrefix(out.Err, wrongAnswer) {
		t.Fatalf("another request's answer settled as %+v, want a wrong answer", out)
	}

	cut := strings.TrimSuffix(stream("r7"), "data: [DONE]\n\n")
	if err := readChatSSE(strings.NewReader(cut), &answer{}, time.Now()); err == nil {
		t.Fatal("a stream without [DONE] read as whole")
	}
	errEvent := "data: {\"error\":{\"message\":\"upstream failed\"}}\n\n"
	if err := readChatSSE(strings.NewReader(errEvent), &answer{}, time.Now()); err == nil || !strings.Contains(err.Error(), "upstream failed") {
		t.Fatalf("an error event read as %v, want its error", err)
	}
}

// The light client reads a real llmsim stream over HTTP.
func TestLightOne(t *testing.T) {
	up := llmsim.Start("A", llmsim.Fast())
	defer up.Close()
	hc := keepAliveClient(1)
	defer hc.CloseIdleConnections()
	q := lightOne(context.Background(), hc, up.URL+"/v1/", "light-1", llmsim.Fast().WithDefaults().Tokens)
	if q.Err != "" || q.Winner != "A" || q.TTFT <= 0 {
		t.Fatalf("light client saw %+v; want A's whole answer and a TTFT", q)
	}
	q = lightOne(context.Background(), hc, up.URL+"/nowhere/", "light-2", 20)
	if q.Err == "" || strings.HasPrefix(q.Err, wrongAnswer) {
		t.Fatalf("an unknown path gave %q, want a failure", q.Err)
	}
}

// switching sends requests to the second instance from its time on, and
// a Run's primary changes add up over instances.
func TestSwitchingAndChanges(t *testing.T) {
	call := func(changes int64) caller {
		return func(ctx context.Context, id string) Request { return Request{ID: id, Changes: changes} }
	}
	calls := []caller{call(3), call(2)}
	before := switching(calls, time.Now().Add(time.Hour))(context.Background(), "x")
	after := switching(calls, time.Now().Add(-time.Hour))(context.Background(), "y")
	if before.Instance != 0 || before.Changes != 3 || after.Instance != 1 || after.Changes != 2 {
		t.Fatalf("before the switch %+v, after %+v; want instance 0 then 1", before, after)
	}
	run := &Run{Requests: []Request{before, {Changes: 1}, after}}
	if got := run.Changes(); got != 5 {
		t.Fatalf("Changes over two instances = %d, want 3 + 2", got)
	}
}

// The bounds read the right runs: the worst of each value, against the
// calm baseline, or against the unhedged route and the budget (f).
func TestBounds(t *testing.T) {
	mk := func(ms ...int) *Run {
		r := &Run{}
		for _, m := range ms {
			r.Requests = append(r.Requests, Request{TTFT: time.Duration(m) * time.Millisecond})
		}
		return r
	}
	calm := mk(10, 20, 100)
	runs := []*IncidentRun{
		{Seed: 18, N: 100, Calm: calm, Shift: mk(10, 20, 110)},
		{Seed: 19, N: 100, Calm: calm, Shift: mk(10, 20, 200)},
	}
	runs[0].Shift.Extra = 0.09
	runs[0].Calm.Extra = 0.04
	opts := IncidentOptions{}.withDefaults()
	got := map[string]float64{}
	seeds := map[string]int64{}
	for _, b := range bounds(Variants[0], opts) {
		w := worst(runs, b.value)
		got[b.what] = b.value(w)
		seeds[b.what] = w.Seed
	}
	if got["TTFT p99 / the calm baseline's (x)"] != 2 || seeds["TTFT p99 / the calm baseline's (x)"] != 19 {
		t.Errorf("worst p99 ratio %v of seed %d, want 2 of seed 19", got["TTFT p99 / the calm baseline's (x)"], seeds["TTFT p99 / the calm baseline's (x)"])
	}
	if g := got["extra load above the calm baseline's (points)"]; g < 4.99 || g > 5.01 {
		t.Errorf("worst extra gap %v points, want 5", g)
	}
	f := Variants[5]
	runs[1].Unhedged = mk(10, 20, 400)
	ciOpts := IncidentOptions{CI: true}.withDefaults()
	bs := bounds(f, ciOpts)
	if v := bs[0].value(runs[1]); v != 0.5 {
		t.Errorf("f: p99 / unhedged = %v, want 0.5", v)
	}
	if bs[1].limit != 1 {
		t.Errorf("f: extra load's limit %v of the budget's share, want 1", bs[1].limit)
	}
}
