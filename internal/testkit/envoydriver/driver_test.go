package envoydriver

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// scripted is an ext_proc server whose Process is the test's function.
type scripted struct {
	extprocv3.UnimplementedExternalProcessorServer
	process func(extprocv3.ExternalProcessor_ProcessServer) error
}

func (s *scripted) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	return s.process(stream)
}

type rig struct {
	driver *Driver
	front  *httptest.Server
	bodies chan string // what the continue-path upstream received
}

func newRig(t *testing.T, cfg Config, process func(extprocv3.ExternalProcessor_ProcessServer) error) *rig {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, &scripted{process: process})
	go gs.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{bodies: make(chan string, 4)}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.bodies <- string(b)
		io.WriteString(w, "upstream")
	}))
	cfg.Upstream = upstream.URL
	r.driver = New(conn, cfg)
	r.front = httptest.NewServer(r.driver)
	t.Cleanup(func() {
		r.front.Close()
		r.driver.Close()
		conn.Close()
		gs.Stop()
		upstream.Close()
	})
	return r
}

func (r *rig) post(t *testing.T, body string) (*http.Response, string, error) {
	t.Helper()
	resp, err := r.front.Client().Post(r.front.URL+"/v1/x", "application/json", strings.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), err
}

func streamedHeaders(kv ...string) *extprocv3.ProcessingResponse {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_StreamedImmediateResponse{
		StreamedImmediateResponse: &extprocv3.StreamedImmediateResponse{Response: &extprocv3.StreamedImmediateResponse_HeadersResponse{
			HeadersResponse: &extprocv3.HttpHeaders{Headers: m}}}}}
}

func streamedBody(body string, eos bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_StreamedImmediateResponse{
		StreamedImmediateResponse: &extprocv3.StreamedImmediateResponse{Response: &extprocv3.StreamedImmediateResponse_BodyResponse{
			BodyResponse: &extprocv3.StreamedBodyResponse{Body: []byte(body), EndOfStream: eos}}}}}
}

// recvAll reads the request direction until end_of_stream and returns the
// messages.
func recvAll(stream extprocv3.ExternalProcessor_ProcessServer) []*extprocv3.ProcessingRequest {
	var got []*extprocv3.ProcessingRequest
	for {
		m, err := stream.Recv()
		if err != nil {
			return got
		}
		got = append(got, m)
		if m.GetRequestBody().GetEndOfStream() || m.GetRequestHeaders().GetEndOfStream() {
			return got
		}
	}
}

// The first message is request_headers with protocol_config, raw values and
// pseudo-headers; body chunks follow without waiting; a streamed local
// response reaches the client.
func TestMessagesAndStreamedResponse(t *testing.T) {
	got := make(chan []*extprocv3.ProcessingRequest, 1)
	r := newRig(t, Config{ChunkSize: 4}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		msgs := recvAll(s)
		got <- msgs
		s.Send(streamedHeaders(":status", "201", "content-type", "text/event-stream", "x-envoy-upstream", "dropped"))
		s.Send(streamedBody("data: 1\n\n", false))
		s.Send(streamedBody("data: 2\n\n", true))
		return nil
	})
	resp, body, err := r.post(t, "0123456789")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 || body != "data: 1\n\ndata: 2\n\n" || resp.Header.Get("X-Envoy-Upstream") != "" {
		t.Fatalf("%d %q %v", resp.StatusCode, body, resp.Header)
	}
	msgs := <-got
	first := msgs[0]
	if first.GetProtocolConfig().GetRequestBodyMode() != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED || first.GetRequestHeaders() == nil {
		t.Fatalf("first message %v", first)
	}
	keys := map[string]string{}
	for _, h := range first.GetRequestHeaders().GetHeaders().GetHeaders() {
		if h.GetValue() != "" {
			t.Errorf("%s uses value, not raw_value", h.GetKey())
		}
		keys[h.GetKey()] = string(h.GetRawValue())
	}
	if keys[":method"] != "POST" || keys[":path"] != "/v1/x" || keys[":scheme"] != "http" || keys[":authority"] == "" ||
		keys["x-request-id"] == "" || keys["x-forwarded-proto"] != "http" || keys["content-type"] != "application/json" {
		t.Fatalf("headers %v", keys)
	}
	var chunks []string
	for _, m := range msgs[1:] {
		if m.GetProtocolConfig() != nil {
			t.Error("protocol_config on a later message")
		}
		chunks = append(chunks, string(m.GetRequestBody().GetBody()))
	}
	if strings.Join(chunks, "|") != "0123|4567|89" || !msgs[len(msgs)-1].GetRequestBody().GetEndOfStream() {
		t.Fatalf("chunks %q", chunks)
	}
	if s := r.driver.Stats(); s.StreamedImmediate != 1 || s.Spurious != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// Out-of-order and invalid replies: status_on_error before the response
// started, a reset after.
func TestSpuriousReplies(t *testing.T) {
	bodyReply := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
	cases := []struct {
		name     string
		replies  []*extprocv3.ProcessingResponse
		status   int  // before start
		reset    bool // after start
		spurious bool // out of order (else: an invalid reply, also an error)
	}{
		{"body reply before headers", []*extprocv3.ProcessingResponse{bodyReply}, 500, false, true},
		{"no :status", []*extprocv3.ProcessingResponse{streamedHeaders("content-type", "text/plain")}, 500, false, false},
		{":status 100", []*extprocv3.ProcessingResponse{streamedHeaders(":status", "100")}, 500, false, false},
		{"body before headers_response", []*extprocv3.ProcessingResponse{streamedBody("x", true)}, 500, false, true},
		{"empty reply", []*extprocv3.ProcessingResponse{{}}, 500, false, true},
		{"headers_response twice", []*extprocv3.ProcessingResponse{streamedHeaders(":status", "200"), streamedHeaders(":status", "200")}, 0, true, true},
		{"body reply after start", []*extprocv3.ProcessingResponse{streamedHeaders(":status", "200"), bodyReply}, 0, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, Config{}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
				recvAll(s)
				for _, m := range c.replies {
					s.Send(m)
				}
				<-s.Context().Done() // the driver must end the stream
				return nil
			})
			resp, _, err := r.post(t, "{}")
			if c.reset {
				if err == nil {
					t.Fatalf("status %d, want a reset response", resp.StatusCode)
				}
			} else if err != nil || resp.StatusCode != c.status {
				t.Fatalf("%v %v, want status %d", resp, err, c.status)
			}
			s := r.driver.Stats()
			if c.spurious && s.Spurious != 1 || !c.spurious && (s.Spurious != 0 || s.ErrorReplies != 1) {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

// ImmediateResponse: status < 200 becomes 200, mutations apply (not to
// x-envoy-*), a gRPC error gives status_on_error.
func TestImmediateAndErrors(t *testing.T) {
	r := newRig(t, Config{StatusOnError: 502}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		recvAll(s)
		s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: 101}, Body: []byte(`{"ok":1}`),
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")}},
				{Header: &corev3.HeaderValue{Key: "x-envoy-x", RawValue: []byte("1")}},
				{Header: &corev3.HeaderValue{Key: "set-cookie", RawValue: []byte("a=1")}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD},
				{Header: &corev3.HeaderValue{Key: "set-cookie", RawValue: []byte("b=2")}, Append: wrapperspb.Bool(true)},
			}}}}})
		return nil
	})
	resp, body, err := r.post(t, "{}")
	if err != nil || resp.StatusCode != 200 || body != `{"ok":1}` || resp.Header.Get("Content-Type") != "application/json" ||
		resp.Header.Get("X-Envoy-X") != "" || strings.Join(resp.Header.Values("Set-Cookie"), ",") != "a=1,b=2" {
		t.Fatalf("%v %q %v", resp, body, err)
	}

	r = newRig(t, Config{StatusOnError: 502}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		recvAll(s)
		return status.Error(codes.Internal, "boom")
	})
	if resp, _, err := r.post(t, "{}"); err != nil || resp.StatusCode != 502 || r.driver.Stats().GRPCErrors != 1 {
		t.Fatalf("%v %v", resp, err)
	}
}

// A clean close before the headers reply continues the request; in
// FULL_DUPLEX_STREAMED mode the body chunks already sent are lost.
func TestCloseBeforeHeadersLosesDrainedChunks(t *testing.T) {
	r := newRig(t, Config{}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		recvAll(s)
		return nil
	})
	resp, body, err := r.post(t, "abcdef")
	if err != nil || resp.StatusCode != 200 || body != "upstream" {
		t.Fatalf("%v %q %v", resp, body, err)
	}
	if got := <-r.bodies; got != "" {
		t.Fatalf("upstream got %q; the drained chunks should be lost", got)
	}
	if s := r.driver.Stats(); s.ClosedBeforeHeaders != 1 || s.LostBodyBytes != 6 {
		t.Fatalf("stats %+v", s)
	}
}

// Buffered mode: one override per message within max_message_timeout;
// otherwise 504 when message_timeout expires.
func TestBufferedMessageTimeout(t *testing.T) {
	for _, max := range []time.Duration{0, time.Minute} {
		r := newRig(t, Config{Mode: Buffered, MessageTimeout: 100 * time.Millisecond, MaxMessageTimeout: max},
			func(s extprocv3.ExternalProcessor_ProcessServer) error {
				m, _ := s.Recv()
				if m.GetProtocolConfig().GetRequestBodyMode() != filterv3.ProcessingMode_BUFFERED {
					return status.Error(codes.InvalidArgument, "not buffered")
				}
				s.Send(&extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(30 * time.Second)})
				select {
				case <-s.Context().Done():
				case <-time.After(600 * time.Millisecond): // well past message_timeout
					s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
						ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: 200}, Body: []byte("late")}}})
				}
				return nil
			})
		resp, body, err := r.post(t, "{}")
		if err != nil {
			t.Fatal(err)
		}
		s := r.driver.Stats()
		if max == 0 && (resp.StatusCode != 504 || s.MessageTimeouts != 1 || s.OverridesIgnored != 1) {
			t.Fatalf("no max_message_timeout: %d %q %+v", resp.StatusCode, body, s)
		}
		if max > 0 && (resp.StatusCode != 200 || body != "late" || s.TimeoutOverrides != 1) {
			t.Fatalf("with max_message_timeout: %d %q %+v", resp.StatusCode, body, s)
		}
	}
}
