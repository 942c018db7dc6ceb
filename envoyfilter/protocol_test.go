package envoyfilter_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

func headersMsg(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.ProcessingRequest{
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: m, EndOfStream: eos}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
	}
}

func bodyMsg(body string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: eos}}}
}

var chatHeaders = []string{":method", "POST", ":path", "/v1/chat/completions", ":authority", "gw", ":scheme", "http",
	"content-type", "application/json"}

// Malformed or unexpected messages get a gRPC error; the server goes on
// serving.
func TestMalformedMessagesGetGRPCErrors(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	client := extprocv3.NewExternalProcessorClient(h.conn)
	responseHeaders := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{}}}
	cases := []struct {
		name string
		msgs []*extprocv3.ProcessingRequest
		code codes.Code
	}{
		{"body before headers", []*extprocv3.ProcessingRequest{bodyMsg("x", true)}, codes.FailedPrecondition},
		{"empty message", []*extprocv3.ProcessingRequest{{}}, codes.InvalidArgument},
		{"no :method", []*extprocv3.ProcessingRequest{headersMsg(true, ":path", "/")}, codes.InvalidArgument},
		{"newline in a value", []*extprocv3.ProcessingRequest{headersMsg(true, ":method", "GET", ":path", "/v1/x",
			"x-a", "1\r\nx-b: 2")}, codes.InvalidArgument},
		{"bad header name", []*extprocv3.ProcessingRequest{headersMsg(true, ":method", "GET", ":path", "/v1/x",
			"bad name", "1")}, codes.InvalidArgument},
		{"invalid :path on a hedged route", []*extprocv3.ProcessingRequest{headersMsg(true, ":method", "POST",
			":path", "/v1/%zz")}, codes.InvalidArgument},
		{"headers twice while hedging", []*extprocv3.ProcessingRequest{headersMsg(false, chatHeaders...),
			headersMsg(false, chatHeaders...)}, codes.FailedPrecondition},
		{"headers twice while passing through", []*extprocv3.ProcessingRequest{headersMsg(false, ":method", "POST",
			":path", "/other"), headersMsg(false, ":method", "POST", ":path", "/other")}, codes.FailedPrecondition},
		{"response headers while hedging", []*extprocv3.ProcessingRequest{headersMsg(false, chatHeaders...),
			responseHeaders}, codes.FailedPrecondition},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stream, err := client.Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range c.msgs {
				if err := stream.Send(m); err != nil {
					break // the server may already have failed the stream
				}
			}
			for {
				_, err = stream.Recv()
				if err != nil {
					break
				}
			}
			if status.Code(err) != c.code {
				t.Fatalf("status %v, want %v", err, c.code)
			}
		})
	}
	// Still serving, and nothing leaked.
	text, _, err := streamChat(context.Background(), h.client(), simHeaders("after-1", "")...)
	if err != nil {
		t.Fatalf("after the bad streams: %v", err)
	} else if text != llmsim.ExpectedChatText("after-1", tokens) {
		t.Fatalf("after the bad streams: text = %q, want %q", text, llmsim.ExpectedChatText("after-1", tokens))
	}
	waitFor(t, "every stream to end", func() bool { return h.srv.InFlight() == 0 })
}

// Observability-mode messages are never answered: the server closes.
func TestObservabilityModeIsNotAnswered(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	stream, err := extprocv3.NewExternalProcessorClient(h.conn).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := headersMsg(true, chatHeaders...)
	m.ObservabilityMode = true
	stream.Send(m)
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("got %v, want a clean close without a reply", err)
	}
}

// The client leaving while the body is still streaming in (Envoy
// half-closes: no message says why) cancels the request.
func TestHalfCloseBeforeBodyEnds(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	stream, err := extprocv3.NewExternalProcessorClient(h.conn).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(headersMsg(false, chatHeaders...))
	stream.Send(bodyMsg(`{"model":"m","stream":true,`, false))
	stream.CloseSend()
	if m, err := stream.Recv(); err != io.EOF {
		t.Fatalf("got %v %v, want the server to close cleanly", m, err)
	}
	waitFor(t, "the stream to end", func() bool { return h.srv.InFlight() == 0 })
	if h.A.Served()+h.B.Served() != 0 {
		t.Fatal("an incomplete body was sent upstream")
	}
}

// Body chunks that arrive after the local response started are never
// answered (Envoy would count a reply as spurious and reset the client).
func TestBodyAfterLocalResponseIsNotAnswered(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	stream, err := extprocv3.NewExternalProcessorClient(h.conn).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(headersMsg(false, ":method", "POST", ":path", "/v1/chat/completions", "x-sim-request", "late-1",
		"content-type", "application/json"))
	stream.Send(bodyMsg(`{"model":"m","stream":true}`, true))
	var got []*extprocv3.ProcessingResponse
	for {
		m, err := stream.Recv()
		if err != nil {
			break
		}
		got = append(got, m)
		if len(got) == 1 {
			// The local response started. Envoy sends whatever body is
			// still coming (here an extra chunk, which a real client body
			// could not have after end_of_stream, to see it is ignored).
			stream.Send(bodyMsg("late chunk", false))
		}
	}
	if len(got) < 2 {
		t.Fatalf("got %d replies", len(got))
	}
	for i, m := range got {
		sir := m.GetStreamedImmediateResponse()
		switch {
		case sir == nil:
			t.Fatalf("reply %d is %T, want only StreamedImmediateResponse parts", i, m.GetResponse())
		case i == 0 && sir.GetHeadersResponse() == nil:
			t.Fatalf("first reply is not headers_response")
		case i > 0 && sir.GetBodyResponse() == nil:
			t.Fatalf("reply %d is not body_response", i)
		}
	}
	if !got[len(got)-1].GetStreamedImmediateResponse().GetBodyResponse().GetEndOfStream() {
		t.Fatal("the last reply does not end the stream")
	}
	status := ""
	for _, hv := range got[0].GetStreamedImmediateResponse().GetHeadersResponse().GetHeaders().GetHeaders() {
		if hv.GetKey() == ":status" {
			status = string(hv.GetRawValue())
		}
		if hv.GetValue() != "" {
			t.Fatalf("header %s uses value, not raw_value", hv.GetKey())
		}
	}
	if status != "200" {
		t.Fatalf(":status %q", status)
	}
}

// Random sequences of valid and invalid messages never crash the server:
// every stream ends with OK or a protocol error, and none stays open.
func TestRandomMessageSequences(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	client := extprocv3.NewExternalProcessorClient(h.conn)
	body := `{"model":"m","stream":true,"messages":[]}`
	pool := []*extprocv3.ProcessingRequest{
		headersMsg(false, chatHeaders...),
		headersMsg(true, chatHeaders...),
		headersMsg(false, ":method", "POST", ":path", "/other"),
		headersMsg(true, ":method", "GET", ":path", "/v1/models"),
		headersMsg(false, ":method", "POST"),
		headersMsg(false, ":method", "POST", ":path", "/v1/x", "bad name", "v"),
		bodyMsg(body, true),
		bodyMsg(body[:10], false),
		bodyMsg(body[10:], true),
		bodyMsg("", true),
		{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("x")}}},
		{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}},
		{},
		{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{}}},
	}
	rng := rand.New(rand.NewPCG(7, 7))
	allowed := map[codes.Code]bool{codes.OK: true, codes.InvalidArgument: true, codes.FailedPrecondition: true}
	for i := 0; i < 150; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		stream, err := client.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 1 + rng.IntN(6)
		var sent []string
		for j := 0; j < n; j++ {
			m := pool[rng.IntN(len(pool))]
			sent = append(sent, messageKind(m))
			if stream.Send(m) != nil {
				break
			}
		}
		stream.CloseSend()
		for err == nil {
			_, err = stream.Recv()
		}
		if code := status.Code(err); err != io.EOF && !allowed[code] {
			t.Fatalf("sequence %d %v ended with %v", i, sent, err)
		}
		cancel()
	}
	waitFor(t, "every stream to end", func() bool { return h.srv.InFlight() == 0 })
	if text, _, err := streamChat(context.Background(), h.client(), simHeaders("after-random", "")...); err != nil {
		t.Fatalf("after the random streams: %v", err)
	} else if text != llmsim.ExpectedChatText("after-random", tokens) {
		t.Fatalf("after the random streams: text = %q, want %q", text, llmsim.ExpectedChatText("after-random", tokens))
	}
}

func messageKind(m *extprocv3.ProcessingRequest) string {
	if m.GetRequest() == nil {
		return "empty"
	}
	name := fmt.Sprintf("%T", m.GetRequest())
	return name[strings.LastIndex(name, "_")+1:]
}

// catchAllRoute takes every request with a path: only the target form
// keeps CONNECT and OPTIONS * away from it.
const catchAllRoute = `
  - name: all
    upstreams: [{name: A, url: "{A}"}]
`

// CONNECT (no :path) and OPTIONS * (a path that is not origin-form) are no
// route's, even a route that matches every path: they continue through
// Envoy untouched, never failing the stream (which Envoy would answer with
// status_on_error).
func TestNonOriginFormTargetsContinue(t *testing.T) {
	h := newHarness(t, harnessOptions{routes: catchAllRoute})
	client := extprocv3.NewExternalProcessorClient(h.conn)
	open := func() extprocv3.ExternalProcessor_ProcessClient {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		stream, err := client.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return stream
	}
	// Without a body Envoy still holds everything: a clean close, no reply.
	for _, target := range [][]string{
		{":method", "OPTIONS", ":path", "*", ":authority", "gw"},
		{":method", "CONNECT", ":authority", "example.com:443"},
	} {
		stream := open()
		stream.Send(headersMsg(true, target...))
		if m, err := stream.Recv(); err != io.EOF {
			t.Fatalf("%s: got reply %v, error %v; want a clean close (continue untouched)", target[1], m, err)
		}
	}
	// A CONNECT with tunnel data in FULL_DUPLEX_STREAMED: CONTINUE, and the
	// data echoed back so that Envoy loses none of it.
	stream := open()
	stream.Send(headersMsg(false, ":method", "CONNECT", ":authority", "example.com:443"))
	m, err := stream.Recv()
	if err != nil {
		t.Fatalf("CONNECT headers: %v", err)
	} else if m.GetRequestHeaders() == nil {
		t.Fatalf("CONNECT headers: m.GetRequestHeaders() = nil, want non-nil")
	} else if m.GetRequestHeaders().GetResponse().GetStatus() != extprocv3.CommonResponse_CONTINUE {
		t.Fatalf("CONNECT headers: m.GetRequestHeaders().GetResponse().GetStatus() = %v, want extprocv3.CommonResponse_CONTINUE", m.GetRequestHeaders().GetResponse().GetStatus())
	}
	stream.Send(bodyMsg("tunnel bytes", false))
	m, err = stream.Recv()
	if got := string(m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()); err != nil {
		t.Fatal(err)
	} else if got != "tunnel bytes" {
		t.Fatalf("got = %q, want \"tunnel bytes\"", got)
	}
	stream.CloseSend()
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("CONNECT stream ended with %v, want a clean close", err)
	}
	if n := h.A.Served(); n != 0 {
		t.Fatalf("the upstream got %d requests, want 0", n)
	}
}
