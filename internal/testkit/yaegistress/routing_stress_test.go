package yaegistress

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/traefikplugin"
)

// TestStressPluginFastestInterpreted is TestStressPluginInterpreted on a
// route with `primary: fastest`: the routing state (rankings, estimates,
// exploration) is shared by every request of the route, read and written
// under its mutex by concurrent interpreted requests.
func TestStressPluginFastestInterpreted(t *testing.T) {
	interpretedN, compiledN, repeats := stressSize(t, ciPluginRequests)
	here := stressModes(t)
	interpreted := fastest(t, interpretedPluginCreateConfig(t))
	compiled := pluginBuilder(fastestConfig(reflect.ValueOf(traefikplugin.CreateConfig)), reflect.ValueOf(traefikplugin.New))
	for r := 1; r <= repeats; r++ {
		for _, m := range []struct {
			mode     string
			build    builder
			requests int
		}{
			{"plugin fastest compiled", compiled, compiledN},
			{"plugin fastest interpreted", interpreted, interpretedN},
		} {
			if !here(m.mode) {
				continue
			}
			runLoad(t, fmt.Sprintf("%s run %d", m.mode, r), m.build, m.requests, loadClients).check(t)
		}
	}
}

// fastestConfig wraps a plugin's CreateConfig so that its configuration
// says primary: fastest.
func fastestConfig(createConfig reflect.Value) reflect.Value {
	return reflect.MakeFunc(createConfig.Type(), func(args []reflect.Value) []reflect.Value {
		out := createConfig.Call(args)
		out[0].Elem().FieldByName("Primary").SetString("fastest")
		return out
	})
}

// interpretedPluginCreateConfig returns the interpreted plugin's
// CreateConfig and New.
func interpretedPluginCreateConfig(t testing.TB) [2]reflect.Value {
	i := newInterpreter(t, newGoPath(t), "traefikplugin")
	var out [2]reflect.Value
	for k, expr := range []string{"traefikplugin.CreateConfig", "traefikplugin.New"} {
		v, err := i.Eval(expr)
		if err != nil {
			t.Fatalf("eval %s: %v", expr, err)
		}
		out[k] = v
	}
	return out
}

func fastest(t testing.TB, fns [2]reflect.Value) builder {
	return pluginBuilder(fastestConfig(fns[0]), fns[1])
}

// BenchmarkPluginFastestFastUpstream is BenchmarkPluginFastUpstream on a
// route with primary: fastest, to price the routing under the interpreter:
//
//	go test -run '^$' -bench 'PluginFast(estFast)?Upstream' -benchtime 3000x ./internal/testkit/yaegistress
func BenchmarkPluginFastestFastUpstream(b *testing.B) {
	fast := llmsim.Workload{Seed: 1, MedianTTFT: 100 * time.Microsecond, Sigma: 1e-9, StallProb: -1, TokenGap: -1, PingEvery: -1}
	upA := llmsim.Start("F", fast)
	defer upA.Close()
	upB := llmsim.Start("F", fast)
	defer upB.Close()
	run := func(b *testing.B, build builder) { benchParallel(b, build, upA.URL, upB.URL) }
	b.Run("compiled", func(b *testing.B) {
		run(b, pluginBuilder(fastestConfig(reflect.ValueOf(traefikplugin.CreateConfig)), reflect.ValueOf(traefikplugin.New)))
	})
	b.Run("interpreted", func(b *testing.B) { run(b, fastest(b, interpretedPluginCreateConfig(b))) })
}
