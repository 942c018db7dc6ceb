package envoyfilter_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
)

// The hostile client runs in a child process (this test binary again), so
// that the parent's heap is the server's alone.
const (
	hostileEnv       = "LLMHEDGE_HOSTILE_CLIENT" // address to attack
	hostileStreamEnv = "LLMHEDGE_HOSTILE_STREAMS"
	hostileChunkEnv  = "LLMHEDGE_HOSTILE_CHUNK"
	hostilePathEnv   = "LLMHEDGE_HOSTILE_PATH"
)

func init() {
	if addr := os.Getenv(hostileEnv); addr != "" {
		streams, _ := strconv.Atoi(os.Getenv(hostileStreamEnv))
		chunk, _ := strconv.Atoi(os.Getenv(hostileChunkEnv))
		hostileClient(addr, os.Getenv(hostilePathEnv), streams, chunk)
		os.Exit(0)
	}
}

// hostileClient opens streams that send request headers for path and then
// body chunks as fast as the server takes them, never reading a reply, and
// prints a line per chunk sent. It runs until it is killed.
func hostileClient(addr, path string, streams, chunk int) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(1<<30)))
	if err != nil {
		fmt.Println("error", err)
		return
	}
	body := make([]byte, chunk)
	sent := make(chan int)
	for i := 0; i < streams; i++ {
		go func() {
			stream, err := extprocv3.NewExternalProcessorClient(conn).Process(context.Background())
			if err != nil {
				return
			}
			head := headersMsg(false, ":method", "POST", ":path", path, "content-type", "application/json")
			head.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
			if stream.Send(head) != nil {
				return
			}
			stream.Send(bodyMsg(`{"model":"m","messages":[{"role":"user","content":"`, false))
			for {
				if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
					RequestBody: &extprocv3.HttpBody{Body: body}}}); err != nil {
					return
				}
				sent <- i
			}
		}()
	}
	for i := range sent {
		fmt.Println("sent", i)
	}
}

// stuckTransport is an upstream that never reads the request body and
// never answers: every byte the client sends stays in the server.
type stuckTransport struct{}

func (stuckTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	<-r.Context().Done()
	return nil, r.Context().Err()
}

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A hostile client (big chunks, as fast as the server takes them, replies
// never read) against an upstream that does not read, on a hedged route
// and on a request passed through: the server holds a few MiB per stream,
// bounded in bytes, with the default gRPC receive limit. The settle is the
// one wait on time here: the server has taken all it will take once the
// client has sent nothing for a second (its sends block on flow control);
// a settle cut short by a slow machine only lowers the number.
//
//	LLMHEDGE_HOSTILE_STREAMS=16 go test -run HostileClient -v ./envoyfilter/
func TestHostileClientMemoryPerStream(t *testing.T) {
	proc.SkipShort(t, "this test binary as a hostile client process")
	for _, path := range []string{"/v1/chat/completions", "/not-hedged"} {
		t.Run(path, func(t *testing.T) { hostileMemory(t, path) })
	}
}

func hostileMemory(t *testing.T, target string) {
	streams := 4
	if n, err := strconv.Atoi(os.Getenv(hostileStreamEnv)); err == nil && n > 0 {
		streams = n
	}
	path := filepath.Join(t.TempDir(), "extproc.yaml")
	os.WriteFile(path, []byte(`
grpc: {listen: "127.0.0.1:0"}
metrics: {listen: "off"}
log: {requests: false}
routes:
  - name: chat
    match: {path_prefixes: [/v1/]}
    upstreams: [{name: U, url: "http://127.0.0.1:1"}]
    max_body: 1KiB
`), 0o600)
	app, cfg := startApp(t, path, zap.NewNop(), envoyfilter.Options{Transport: stuckTransport{}})
	// The largest chunk the server accepts (8 MiB at most).
	chunk := int(cfg.GRPC.MaxRecvMsgSize) - 64<<10
	if chunk > 8<<20 {
		chunk = 8 << 20
	}
	before := heapAfterGC()

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), hostileEnv+"="+app.GRPCAddr(), hostileStreamEnv+"="+strconv.Itoa(streams),
		hostileChunkEnv+"="+strconv.Itoa(chunk), hostilePathEnv+"="+target)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	sent := 0
	quiet := time.NewTimer(time.Second)
	deadline := time.After(60 * time.Second)
settle:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("the hostile client exited")
			}
			if !strings.HasPrefix(line, "sent") {
				t.Fatalf("hostile client: %s", line)
			}
			sent++
			quiet.Reset(time.Second)
		case <-quiet.C:
			break settle
		case <-deadline:
			break settle
		}
	}
	held := heapAfterGC()
	growth := float64(held) - float64(before)
	perStream := growth / float64(streams) / (1 << 20)
	t.Logf("%s: %d streams, %d chunks of %.2f MiB taken (grpc.max_recv_msg_size %d MiB): heap grew %.1f MiB, %.1f MiB per stream",
		target, streams, sent, float64(chunk)/(1<<20), cfg.GRPC.MaxRecvMsgSize>>20, growth/(1<<20), perStream)

	child.Process.Kill()
	child.Wait()
	for range lines {
	}
	app.Shutdown(10 * time.Second)
	// The bound: the pipe's 256 KiB (or the reply queue's 512 KiB) plus a
	// message beyond it, one being received or sent, and gRPC's buffers.
	if limit := 4 * float64(chunk) / (1 << 20); perStream > limit {
		t.Fatalf("heap growth per stream %.1f MiB, want at most %.1f MiB (4 chunks)", perStream, limit)
	}
}
