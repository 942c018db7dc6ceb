package yaegistress

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/metricscheck"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/traefikplugin"
)

// TestMetricNamesSharedWithOtherAdapters: after metricscheck.Traffic the
// plugin's metricsPath answers with core.MetricDefs' names, types, label
// names and buckets in the Prometheus text format, the same the Caddy
// module and the Envoy server are checked against; compiled, and
// interpreted by Yaegi as Traefik runs it. Two middlewares (two routers)
// count into the one process-wide store.
func TestMetricNamesSharedWithOtherAdapters(t *testing.T) {
	wl := llmsim.Workload{MedianTTFT: 5 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 3, TokenGap: time.Millisecond}
	a, b := llmsim.Start("A", wl), llmsim.Start("B", wl)
	defer a.Close()
	defer b.Close()
	interp := newInterpreter(t, newGoPath(t), "traefikplugin")
	eval := func(expr string) reflect.Value {
		v, err := interp.Eval(expr)
		if err != nil {
			t.Fatalf("eval %s: %v", expr, err)
		}
		return v
	}
	for _, m := range []struct {
		mode              string
		createConfig, New reflect.Value
	}{
		{"compiled", reflect.ValueOf(traefikplugin.CreateConfig), reflect.ValueOf(traefikplugin.New)},
		{"interpreted", eval("traefikplugin.CreateConfig"), eval("traefikplugin.New")},
	} {
		t.Run(m.mode, func(t *testing.T) {
			route := "names-" + m.mode
			hedge := metricsPlugin(t, m.createConfig, m.New, route, a.URL, b.URL)
			other := metricsPlugin(t, m.createConfig, m.New, route+"-other", a.URL, b.URL)
			for _, req := range []struct{ id, behavior, from string }{{"names-1", "A=stall", "B"}, {"names-2", "", "A"}} {
				// Served in-process: the report is observed before
				// ServeHTTP returns.
				w := httptest.NewRecorder()
				hedge.ServeHTTP(w, chat(req.id, req.behavior))
				if want := llmsim.ExpectedStream(req.from, model, req.id, wl.Tokens); string(llmsim.StripPings(w.Body.Bytes())) != string(want) {
					t.Fatalf("%s: status %d, body\n%s\nwant %s's whole stream", req.id, w.Code, w.Body.Bytes(), req.from)
				}
			}
			// The other router's middleware answers the path with the
			// same process-wide metrics.
			w := httptest.NewRecorder()
			other.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/llmhedge/metrics", nil))
			if w.Code != http.StatusOK || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain; version=0.0.4") {
				t.Fatalf("metrics path: status %d, Content-Type %q", w.Code, w.Header().Get("Content-Type"))
			}
			metricscheck.Check(t, "traefik plugin "+m.mode+" metricsPath", w.Body.String(), route, 0.05)
		})
	}
}

// metricsPlugin builds the plugin on route with metricsPath set, through
// reflection as Traefik's plugin loader does.
func metricsPlugin(t *testing.T, createConfig, newPlugin reflect.Value, route, a, b string) http.Handler {
	t.Helper()
	cfg := createConfig.Call(nil)[0]
	c := cfg.Elem()
	c.FieldByName("Delay").SetString("50ms")
	// One hedge in the bucket and next to no refill: request 1 (A stalls)
	// hedges, request 2 cannot, however long A takes on a loaded machine
	// (metricscheck wants exactly one hedge started).
	budget := c.FieldByName("Budget")
	budget.FieldByName("Burst").SetFloat(1)
	budget.FieldByName("Ratio").SetFloat(0.01)
	c.FieldByName("Log").SetString("off")
	c.FieldByName("MetricsPath").SetString("/llmhedge/metrics")
	ups := c.FieldByName("Upstreams")
	list := reflect.MakeSlice(ups.Type(), 2, 2)
	for k, u := range [][2]string{{"A", a}, {"B", b}} {
		list.Index(k).FieldByName("Name").SetString(u[0])
		list.Index(k).FieldByName("URL").SetString(u[1])
	}
	ups.Set(list)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the plugin called Traefik's next handler for %s", r.URL.Path)
	})
	out := newPlugin.Call([]reflect.Value{reflect.ValueOf(context.Background()), reflect.ValueOf(next), cfg, reflect.ValueOf(route)})
	if err, _ := out[1].Interface().(error); err != nil {
		t.Fatal(err)
	}
	return out[0].Interface().(http.Handler)
}

func chat(id, behavior string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(chatRequest(id)))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(llmsim.HeaderRequest, id)
	if behavior != "" {
		r.Header.Set(llmsim.HeaderBehavior, behavior)
	}
	return r
}
