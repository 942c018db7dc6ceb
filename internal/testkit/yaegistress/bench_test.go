package yaegistress

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
	"github.com/llmhedge/llmhedge/traefikplugin"
)

// BenchmarkPluginFastUpstream prices the plugin per request, compiled and
// interpreted by Yaegi as Traefik runs it, against an in-process simulated
// upstream that answers a 20-token stream at once (no hedge fires). The
// difference between the two is the interpreter's cost; allocs/op is the
// number to watch, as garbage is most of that cost (see
// CONTRIBUTING.md, "What Yaegi charges for").
//
//	go test -run '^$' -bench PluginFastUpstream -benchtime 3000x ./internal/testkit/yaegistress
func BenchmarkPluginFastUpstream(b *testing.B) {
	fast := llmsim.Workload{Seed: 1, MedianTTFT: 100 * time.Microsecond, Sigma: 1e-9, StallProb: -1, TokenGap: -1, PingEvery: -1}
	up := llmsim.Start("F", fast)
	defer up.Close()
	run := func(b *testing.B, build builder) { benchParallel(b, build, up.URL, up.URL) }
	b.Run("compiled", func(b *testing.B) {
		run(b, pluginBuilder(reflect.ValueOf(traefikplugin.CreateConfig), reflect.ValueOf(traefikplugin.New)))
	})
	b.Run("interpreted", func(b *testing.B) { run(b, interpretedPluginBuilder(b)) })
}

// benchParallel builds the plugin over upstreams a and b and sends it
// streaming chat requests from 20 clients until b.N, checking every answer
// is whole.
func benchParallel(b *testing.B, build builder, a, bURL string) {
	h, _ := build(b, &loadRun{}, a, bURL, 30*time.Second)
	var seq atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(10) // 20 clients on 2 cores, as in the Traefik benchmark
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := fmt.Sprintf("bench-%d", seq.Add(1))
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(chatRequest(id)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(llmsim.HeaderRequest, id)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != http.StatusOK {
				b.Errorf("%s: status %d, want 200", id, w.Code)
			} else if !bytes.HasSuffix(w.Body.Bytes(), []byte("data: [DONE]\n\n")) {
				b.Errorf("%s: answer not whole: %q", id, w.Body.String())
			}
		}
	})
}
