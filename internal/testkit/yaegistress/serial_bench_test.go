package yaegistress

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"syscall"
	"testing"
	"time"
)

// BenchmarkPluginSerial prices one interpreted request at a time (no
// parallel noise) against a canned 20-token stream written whole, or one
// flushed write per event (as llmsim and real providers send it), so that
// the per-read cost shows as the difference, and against a 1-token
// non-streaming JSON answer (oneJSON). With LLMHEDGE_PROFILE_DIR set it
// profiles the measured requests alone (see startProfiles):
//
//	LLMHEDGE_PROFILE_DIR=/tmp go test -run '^$' -bench PluginSerial -benchtime 3000x ./internal/testkit/yaegistress
//	go tool pprof -top /tmp/cpu-whole.out
func BenchmarkPluginSerial(b *testing.B) {
	build := interpretedPluginBuilder(b)
	for _, c := range []cannedCase{cannedWhole, cannedPerEvent, cannedOneJSON} {
		name := c.String()
		b.Run(name, func(b *testing.B) {
			up, canned := startCannedUpstream(b, c)
			defer up.Close()
			h, _ := build(b, &loadRun{}, up.URL, up.URL, 30*time.Second)
			one := cannedRequester(b, h, c, canned, "serial-")
			for i := 0; i < 50; i++ {
				one()
			}
			b.ReportAllocs()
			b.ResetTimer()
			stop := startProfiles(b, name)
			cpu0 := processCPU()
			for i := 0; i < b.N; i++ {
				one()
			}
			cpu := processCPU() - cpu0
			stop()
			// The process's CPU (the upstream's and the client's included)
			// varies less than ns/op on a machine shared with other load.
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startProfiles writes a CPU profile of the measured loop alone (not the
// interpreter's setup) to $LLMHEDGE_PROFILE_DIR/cpu-<name>.out, if set, and
// with LLMHEDGE_PROFILE_MEM=1 an allocation profile of every allocation
// (mem-<name>.out; slow).
func startProfiles(b *testing.B, name string) (stop func()) {
	dir := os.Getenv("LLMHEDGE_PROFILE_DIR")
	if dir == "" {
		return func() {}
	}
	cpu, err := os.Create(filepath.Join(dir, "cpu-"+name+".out"))
	if err != nil {
		b.Fatal(err)
	}
	rate := runtime.MemProfileRate
	mem := os.Getenv("LLMHEDGE_PROFILE_MEM") == "1"
	if mem {
		runtime.MemProfileRate = 1
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		cpu.Close()
		if !mem {
			return
		}
		runtime.GC()
		f, err := os.Create(filepath.Join(dir, "mem-"+name+".out"))
		if err == nil {
			err = pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
		if err != nil {
			b.Error(err)
		}
		runtime.MemProfileRate = rate
	}
}
