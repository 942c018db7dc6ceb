package envoydriver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
)

// Mode is the request body mode of the emulated filter.
type Mode int

const (
	// FullDuplex is request_body_mode FULL_DUPLEX_STREAMED with
	// request_trailer_mode SEND (Envoy >= 1.37 for streamed local
	// responses).
	FullDuplex Mode = iota
	// Buffered is request_body_mode BUFFERED (what Envoy < 1.37 needs).
	Buffered
)

// Config configures a Driver. Response header, body and trailer modes are
// always SKIP/NONE/SKIP.
type Config struct {
	// Mode is the request body mode. Default FullDuplex.
	Mode Mode
	// Upstream is the base URL of the route's cluster: requests the server
	// continues go there. Required for continued requests.
	Upstream string
	// Transport sends continued requests. Default http.DefaultTransport.
	Transport http.RoundTripper
	// MessageTimeout is the filter's message_timeout (Buffered mode only;
	// FULL_DUPLEX_STREAMED runs no timer). Default 200ms.
	MessageTimeout time.Duration
	// MaxMessageTimeout is the filter's max_message_timeout, the bound of
	// override_message_timeout. Default 0: overrides are ignored.
	MaxMessageTimeout time.Duration
	// StatusOnError answers errors before the response started. Default 500.
	StatusOnError int
	// RemoteCloseTimeout is how long the driver waits for the server to
	// close the stream after half-closing it. Default 1s.
	RemoteCloseTimeout time.Duration
	// ResetOnClientGone resets the stream at once when the client goes away,
	// instead of half-closing first.
	ResetOnClientGone bool
	// OmitProtocolConfig leaves protocol_config out, as data planes before
	// it existed did.
	OmitProtocolConfig bool
	// ChunkSize is the largest request body chunk sent. Default 16KiB.
	ChunkSize int
}

// Stats counts what the driver saw, over its lifetime.
type Stats struct {
	Streams              int64 // ext_proc streams opened
	StreamedImmediate    int64 // local responses started with headers_response
	Immediate            int64 // ImmediateResponse answers
	Continued            int64 // requests sent to the upstream after a headers reply
	ClosedBeforeHeaders  int64 // clean server closes before the headers reply (request continued)
	LostBodyBytes        int64 // body bytes handed to the server and never given back
	Spurious             int64 // out-of-order or invalid replies
	GRPCErrors           int64 // streams the server failed with a gRPC error
	ErrorReplies         int64 // status_on_error answers
	Resets               int64 // client responses reset after they started
	MessageTimeouts      int64 // message_timeout expiries (504)
	TimeoutOverrides     int64 // override_message_timeout honoured
	OverridesIgnored     int64 // override_message_timeout ignored
	ServerCloseTimeouts  int64 // server did not close within RemoteCloseTimeout
	BodyChunksAfterStart int64 // request body chunks sent after the local response started
}

// Driver is the emulated Envoy: an http.Handler that runs every request
// through the ext_proc server.
type Driver struct {
	client extprocv3.ExternalProcessorClient
	cfg    Config
	bg     sync.WaitGroup // stream closes still waiting for the server

	streams, streamedImmediate, immediate, continued, closedBeforeHeaders, lostBodyBytes atomic.Int64
	spurious, grpcErrors, errorReplies, resets, messageTimeouts, timeoutOverrides        atomic.Int64
	overridesIgnored, serverCloseTimeouts, bodyChunksAfterStart                          atomic.Int64
}

// New returns a Driver that opens its streams on conn.
func New(conn grpc.ClientConnInterface, cfg Config) *Driver {
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport
	}
	if cfg.MessageTimeout == 0 {
		cfg.MessageTimeout = 200 * time.Millisecond
	}
	if cfg.StatusOnError == 0 {
		cfg.StatusOnError = http.StatusInternalServerError
	}
	if cfg.RemoteCloseTimeout == 0 {
		cfg.RemoteCloseTimeout = time.Second
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = 16 << 10
	}
	return &Driver{client: extprocv3.NewExternalProcessorClient(conn), cfg: cfg}
}

// Stats returns the counters.
func (d *Driver) Stats() Stats {
	return Stats{
		Streams: d.streams.Load(), StreamedImmediate: d.streamedImmediate.Load(), Immediate: d.immediate.Load(),
		Continued: d.continued.Load(), ClosedBeforeHeaders: d.closedBeforeHeaders.Load(),
		LostBodyBytes: d.lostBodyBytes.Load(), Spurious: d.spurious.Load(), GRPCErrors: d.grpcErrors.Load(),
		ErrorReplies: d.errorReplies.Load(), Resets: d.resets.Load(), MessageTimeouts: d.messageTimeouts.Load(),
		TimeoutOverrides: d.timeoutOverrides.Load(), OverridesIgnored: d.overridesIgnored.Load(),
		ServerCloseTimeouts: d.serverCloseTimeouts.Load(), BodyChunksAfterStart: d.bodyChunksAfterStart.Load(),
	}
}

// Close waits until every stream the driver opened has been closed.
func (d *Driver) Close() { d.bg.Wait() }

// ServeHTTP runs one request through the ext_proc server.
func (d *Driver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.streams.Add(1)
	x := newExchange(d, w, r)
	if x.run() {
		// The client's response must end abruptly: Envoy resets the
		// downstream stream; net/http closes the connection.
		d.resets.Add(1)
		panic(http.ErrAbortHandler)
	}
}

// newRequestID mimics the connection manager's x-request-id (a UUID v4).
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// streamContext is the context of a gRPC stream: independent of the
// client's request, because the driver decides when to reset it.
func streamContext() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}
