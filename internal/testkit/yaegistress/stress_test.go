package yaegistress

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/internal/testkit/redisproc"
	"github.com/llmhedge/llmhedge/internal/testkit/yaegistress/corehandler"
	"github.com/llmhedge/llmhedge/internal/testkit/yaegistress/selecthedger"
	"github.com/llmhedge/llmhedge/resp"
	"github.com/llmhedge/llmhedge/traefikplugin"
)

// Load sizes. CI runs the bounded form, 5,000 interpreted requests in all
// under -race on two shared cores: 3,000 through the plugin (what Traefik
// runs, core included) and 2,000 through core directly (where the attempts'
// bodies and core's reports are checked too), each after a compiled control
// of 1,000 (the control only shows that the workload and the checks are
// clean without the interpreter). LLMHEDGE_STRESS=full runs the acceptance
// form of the Yaegi-safety issue: 20,000 requests at 50 clients, three
// times, per handler, interpreted and compiled alike.
const (
	loadClients       = 50
	ciCoreRequests    = 2000
	ciPluginRequests  = 3000
	ciControlRequests = 1000
	// ciFleetRequests: the plugin with fleet mode on (a real redis-server).
	ciFleetRequests = 1000
	fullRequests    = 20000
	fullRepeats     = 3
	// selectHedgerRequests is the load on the naive select hedger.
	selectHedgerRequests = 40000
)

// stressSize returns, for a handler whose bounded interpreted load is ci,
// the requests per interpreted run, per compiled run, and the number of runs.
// It skips t under -short: even the bounded load takes tens of seconds.
func stressSize(t *testing.T, ci int) (interpreted, compiled, repeats int) {
	if testing.Short() {
		t.Skip("-short: a stress run of interpreted code")
	}
	if os.Getenv("LLMHEDGE_STRESS") == "full" {
		return fullRequests, fullRequests, fullRepeats
	}
	return ci, ciControlRequests, 1
}

// newCoreFunc is corehandler.New's type, compiled or interpreted.
type newCoreFunc = func(a, b string, delay time.Duration, transport http.RoundTripper,
	observe func(outcome string, hedges int, winner string)) (http.Handler, error)

// TestStressCoreInterpreted runs the real core, interpreted by Yaegi
// v0.16.1, behind a plain net/http server under concurrent streaming load
// with hedges firing, next to the same code compiled, and requires every
// answer to be its own request's, byte for byte, with no panic, hang,
// error or leaked goroutine.
func TestStressCoreInterpreted(t *testing.T) {
	interpretedN, compiledN, repeats := stressSize(t, ciCoreRequests)
	here := stressModes(t)
	i := newInterpreter(t, newGoPath(t), "internal/testkit/yaegistress/corehandler")
	interpreted := evalAs[newCoreFunc](t, i, "corehandler.New")
	for r := 1; r <= repeats; r++ {
		for _, m := range []struct {
			mode     string
			build    builder
			requests int
		}{
			{"core compiled", coreBuilder(corehandler.New), compiledN},
			{"core interpreted", coreBuilder(interpreted), interpretedN},
		} {
			if !here(m.mode) {
				continue
			}
			requests := m.requests
			run := runLoad(t, fmt.Sprintf("%s run %d", m.mode, r), m.build, requests, loadClients)
			run.check(t)
			if served := run.outcomes[core.OutcomeOK] + run.outcomes[core.OutcomeJoined] + run.outcomes[core.OutcomeReplayed]; served != requests {
				t.Errorf("%s: core reported %d answered requests of %d: %v", run.mode, served, requests, run.outcomes)
			}
		}
	}
}

// TestStressPluginInterpreted loads the Traefik plugin as Traefik does
// (interp.New with a GOPATH, stdlib.Symbols, Eval of the import, then
// CreateConfig and New called through reflection) and runs the same load
// through it, next to the plugin compiled.
func TestStressPluginInterpreted(t *testing.T) {
	interpretedN, compiledN, repeats := stressSize(t, ciPluginRequests)
	here := stressModes(t)
	interpreted := interpretedPluginBuilder(t)
	compiled := pluginBuilder(reflect.ValueOf(traefikplugin.CreateConfig), reflect.ValueOf(traefikplugin.New))
	for r := 1; r <= repeats; r++ {
		for _, m := range []struct {
			mode     string
			build    builder
			requests int
		}{
			{"plugin compiled", compiled, compiledN},
			{"plugin interpreted", interpreted, interpretedN},
		} {
			if !here(m.mode) {
				continue
			}
			runLoad(t, fmt.Sprintf("%s run %d", m.mode, r), m.build, m.requests, loadClients).check(t)
		}
	}
}

// TestStressPluginFleetInterpreted runs the plugin load with fleet mode on:
// keyed requests, their twins and their replays go through a real
// redis-server and the resp client, interpreted as in Traefik. The
// compiled and the interpreted plugin are two separate replicas of one
// fleet (each package instance has its own registries); their request ids,
// hence keys, differ per run.
func TestStressPluginFleetInterpreted(t *testing.T) {
	interpretedN, compiledN, repeats := stressSize(t, ciFleetRequests)
	here := stressModes(t)
	interpreted := interpretedPluginBuilder(t)
	compiled := pluginBuilder(reflect.ValueOf(traefikplugin.CreateConfig), reflect.ValueOf(traefikplugin.New))
	for r := 1; r <= repeats; r++ {
		for _, m := range []struct {
			mode     string
			build    builder
			requests int
		}{
			{"plugin fleet compiled", withFleet(compiled), compiledN},
			{"plugin fleet interpreted", withFleet(interpreted), interpretedN},
		} {
			if !here(m.mode) {
				continue
			}
			runLoad(t, fmt.Sprintf("%s run %d", m.mode, r), m.build, m.requests, loadClients).check(t)
		}
	}
}

// withFleet is build with the plugin's fleet option set to a redis-server
// of the run's own (and a 1s operation timeout: two shared cores under
// -race are not production). The run's release kills the server, which
// ends the client's connections and their idle watchers, so that the
// run's goroutine count comes back.
func withFleet(build builder) builder {
	return func(t testing.TB, run *loadRun, a, b string, delay time.Duration) (http.Handler, func()) {
		srv := redisproc.Start(t, redisproc.Options{})
		fleetConfig = func(c reflect.Value) {
			f := c.FieldByName("Fleet")
			f.FieldByName("URL").SetString(srv.URL())
			f.FieldByName("Timeout").SetString("1s")
			// wall clock: a lease is time by design. 6s, not the default
			// 2s: with both cores busy a leader's renewals were starved
			// past 2s and its lease lost (a 503 to its client, 3 in 1,000
			// requests at load average 20); renewals still run every 2s.
			f.FieldByName("Lease").SetString("6s")
		}
		defer func() { fleetConfig = nil }()
		run.awaitRenewal = func() { awaitLeaseRenewal(t, srv) }
		h, release := build(t, run, a, b, delay)
		return h, func() {
			if release != nil {
				release()
			}
			// The keyed requests went through Redis.
			if n := redisCommands(t, srv); n < int64(run.keyed) {
				t.Errorf("%s: Redis processed %d commands for %d keyed requests: the fleet was not used", run.mode, n, run.keyed)
			} else {
				t.Logf("%s: Redis processed %d commands (%d keyed requests, %d twins)", run.mode, n, run.keyed, run.twins)
			}
			srv.Kill()
		}
	}
}

// awaitLeaseRenewal polls Redis (another process: no event to wait on)
// until a fleet lease in it was renewed: its PTTL read higher than at the
// read before (withFleet's lease is 6s, renewed every 2s). Bounded by
// warmDeadline, a guard against a renewal that never comes.
func awaitLeaseRenewal(t testing.TB, srv *redisproc.Server) {
	c, err := resp.New(resp.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), warmDeadline)
	defer cancel()
	last := map[string]int64{}
	for {
		keys, err := c.Do(ctx, "KEYS", "*:lease")
		if err != nil {
			t.Fatalf("warm-up: no lease renewal seen in Redis: %v", err)
		}
		for _, k := range keys.Array {
			ttl, err := c.Do(ctx, "PTTL", k.Str)
			if err != nil {
				t.Fatalf("warm-up: PTTL %s: %v", k.Str, err)
			}
			if prev, seen := last[k.Str]; seen && ttl.Int > prev {
				return
			}
			last[k.Str] = ttl.Int
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// redisCommands is srv's total_commands_processed (INFO stats).
func redisCommands(t testing.TB, srv *redisproc.Server) int64 {
	c, err := resp.New(resp.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := c.Do(ctx, "INFO", "stats")
	if err != nil {
		t.Fatalf("INFO stats: %v", err)
	}
	for _, line := range strings.Split(v.Str, "\r\n") {
		if n, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
			count, _ := strconv.ParseInt(n, 10, 64)
			return count
		}
	}
	return 0
}

// fleetConfig, when set, edits the plugin's configuration before New
// (withFleet sets it around one build).
var fleetConfig func(c reflect.Value)

// coreBuilder builds corehandler.New (compiled or interpreted) with a
// transport that checks every attempt carries its client's exact body.
func coreBuilder(newCore newCoreFunc) builder {
	return func(t testing.TB, run *loadRun, a, b string, delay time.Duration) (http.Handler, func()) {
		tr := &checkingTransport{base: &http.Transport{MaxIdleConnsPerHost: 2 * loadClients}, run: run}
		h, err := newCore(a, b, delay, tr, run.observe)
		if err != nil {
			t.Fatal(err)
		}
		return h, tr.base.CloseIdleConnections
	}
}

// checkingTransport sends attempts through base after checking that each
// carries its client's request body and Content-Length: a multi-value
// assignment that Yaegi mis-executes would silently lose one of them.
type checkingTransport struct {
	base *http.Transport
	run  *loadRun
}

func (c *checkingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	id := req.Header.Get(llmsim.HeaderRequest)
	want := chatRequest(id)
	var got []byte
	if req.Body != nil {
		var err error
		got, err = io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	if !bytes.Equal(got, want) || req.ContentLength != int64(len(want)) {
		c.run.note(&c.run.wrong, "attempt %s of %s sent %d bytes with Content-Length %d, want the client's %d bytes",
			req.Header.Get(core.HeaderAttempt), id, len(got), req.ContentLength, len(want))
	}
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(got))
	return c.base.RoundTrip(out)
}

// interpretedPluginBuilder builds the plugin interpreted by Yaegi, as
// Traefik loads it.
func interpretedPluginBuilder(t testing.TB) builder {
	i := newInterpreter(t, newGoPath(t), "traefikplugin")
	eval := func(expr string) reflect.Value {
		v, err := i.Eval(expr)
		if err != nil {
			t.Fatalf("eval %s: %v", expr, err)
		}
		return v
	}
	return pluginBuilder(eval("traefikplugin.CreateConfig"), eval("traefikplugin.New"))
}

// pluginBuilder builds the plugin from its CreateConfig and New, compiled
// or interpreted, through reflection as Traefik's plugin loader does.
func pluginBuilder(createConfig, newPlugin reflect.Value) builder {
	return func(t testing.TB, run *loadRun, a, b string, delay time.Duration) (http.Handler, func()) {
		cfg := createConfig.Call(nil)[0]
		c := cfg.Elem()
		field := func(name string) reflect.Value {
			f := c.FieldByName(name)
			if !f.IsValid() {
				t.Fatalf("the plugin's Config has no field %s", name)
			}
			return f
		}
		field("Delay").SetString(delay.String())
		field("Log").SetString("off")
		ups := field("Upstreams")
		list := reflect.MakeSlice(ups.Type(), 2, 2)
		for k, u := range [][2]string{{"A", a}, {"B", b}} {
			list.Index(k).FieldByName("Name").SetString(u[0])
			list.Index(k).FieldByName("URL").SetString(u[1])
		}
		ups.Set(list)
		if fleetConfig != nil {
			fleetConfig(c)
		}
		next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			run.note(&run.errs, "the plugin called Traefik's next handler for %s", r.Header.Get(llmsim.HeaderRequest))
			http.Error(w, "next handler called", http.StatusTeapot)
		})
		out := newPlugin.Call([]reflect.Value{reflect.ValueOf(context.Background()), reflect.ValueOf(next), cfg,
			reflect.ValueOf("yaegistress@file")})
		if err, _ := out[1].Interface().(error); err != nil {
			t.Fatal(err)
		}
		h, ok := out[0].Interface().(http.Handler)
		if !ok {
			t.Fatalf("the plugin's New returned %v, not an http.Handler", out[0].Type())
		}
		return h, nil
	}
}

// TestStressHarnessCatchesSelectHedger runs the naive select-based
// hedger through the same load: compiled it must be clean, interpreted it
// must show wrong answers, panics or hangs, which proves the harness sees
// the bug class it guards against. Opt-in (LLMHEDGE_YAEGI_REPRO=1) and not
// under -race, like TestYaegiSelectUnderConcurrency. Between 1 in 2,000
// and 1 in 7,000 interpreted requests went wrong in our runs, so it sends
// 40,000.
func TestStressHarnessCatchesSelectHedger(t *testing.T) {
	if raceEnabled {
		t.Skip("the select bug is a data race inside Yaegi; run without -race: LLMHEDGE_YAEGI_REPRO=1 go test -run TestStressHarnessCatchesSelectHedger ./internal/testkit/yaegistress")
	}
	if os.Getenv("LLMHEDGE_YAEGI_REPRO") == "" {
		t.Skip("opt-in: LLMHEDGE_YAEGI_REPRO=1 go test -run TestStressHarnessCatchesSelectHedger -v ./internal/testkit/yaegistress")
	}
	type newSelect = func(a, b string, delay time.Duration, transport http.RoundTripper) http.Handler
	i := newInterpreter(t, newGoPath(t), "internal/testkit/yaegistress/selecthedger")
	interpreted := evalAs[newSelect](t, i, "selecthedger.New")
	build := func(newHedger newSelect) builder {
		return func(t testing.TB, run *loadRun, a, b string, delay time.Duration) (http.Handler, func()) {
			tr := &http.Transport{MaxIdleConnsPerHost: 2 * loadClients}
			return newHedger(a, b, delay, tr), tr.CloseIdleConnections
		}
	}
	compiled := runLoad(t, "select hedger compiled", build(selecthedger.New), ciPluginRequests, loadClients)
	t.Log(compiled)
	if compiled.wrong+compiled.panics+compiled.hangs+compiled.errs != 0 {
		t.Errorf("the select hedger must be clean compiled: %v %v", compiled, compiled.examples)
	}
	bad := runLoad(t, "select hedger interpreted", build(interpreted), selectHedgerRequests, loadClients)
	t.Log(bad)
	for _, e := range bad.examples {
		t.Log("  ", e)
	}
	if bad.wrong+bad.panics+bad.hangs == 0 {
		t.Errorf("the harness saw no wrong answer, panic or hang from the interpreted select hedger in %d requests", bad.requests)
	}
}
