package envoyfilter_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/envoyfilter"
	"github.com/llmhedge/llmhedge/internal/testkit/clientsuite"
	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// testScale runs the reference workload 20x faster.
const testScale = 0.05

// noStalls switches llmsim's drawn stalls off: tests script their stalls.
const noStalls = -1

// harness is an ext_proc server on a loopback gRPC port, two simulated
// upstreams A and B, and the Envoy driver in front, as an HTTP server.
type harness struct {
	t       *testing.T
	A, B    *llmsim.Running
	other   *httptest.Server // the cluster of requests the server continues
	seen    chan seenRequest // what `other` received
	srv     *envoyfilter.Server
	grpc    *grpc.Server
	conn    *grpc.ClientConn
	driver  *envoydriver.Driver
	front   *httptest.Server
	reports chan *core.Report
	// sharedSims: A and B belong to the caller, who closes them.
	sharedSims bool
}

// seenRequest is what the continue-path upstream received.
type seenRequest struct {
	method, path string
	header       http.Header
	body         string
}

type harnessOptions struct {
	routes string // YAML of the routes section; {A} and {B} are the upstream URLs
	envoy  string // YAML of the envoy section
	driver envoydriver.Config
	// workload of both upstreams. Default: the reference at testScale.
	workload *llmsim.Workload
	// behaveA, if set, is upstream A's Behave hook.
	behaveA func(*http.Request) llmsim.Behavior
	// sims, if set, are upstreams A and B, started and closed by the caller.
	sims *[2]*llmsim.Running
}

const defaultRoutes = `
  - name: chat
    match:
      path_prefixes: [/v1/]
    upstreams:
      - {name: A, url: "{A}"}
      - {name: B, url: "{B}"}
    delay: 100ms
`

func newHarness(t *testing.T, o harnessOptions) *harness {
	t.Helper()
	h := &harness{t: t, seen: make(chan seenRequest, 16), reports: make(chan *core.Report, 64)}
	wl := llmsim.Reference(1, testScale)
	wl.StallProb = noStalls // stalls are scripted per test, never drawn
	if o.workload != nil {
		wl = *o.workload
	}
	if o.sims != nil {
		h.A, h.B, h.sharedSims = o.sims[0], o.sims[1], true
	} else {
		h.A = (&llmsim.Server{Name: "A", Workload: wl, Behave: o.behaveA}).Start()
		h.B = (&llmsim.Server{Name: "B", Workload: wl}).Start()
	}
	h.other = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.seen <- seenRequest{method: r.Method, path: r.URL.RequestURI(), header: r.Header.Clone(), body: string(body)}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "other:%s %s", r.Method, r.URL.Path)
	}))
	routes := o.routes
	if routes == "" {
		routes = defaultRoutes
	}
	cfg := h.config(o.envoy, routes)
	var err error
	h.srv, err = envoyfilter.NewServer(cfg, envoyfilter.Options{
		Observer: core.ObserverFunc(func(r *core.Report) {
			select {
			case h.reports <- r:
			default:
			}
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	h.grpc, h.conn = serveGRPC(t, h.srv)
	dc := o.driver
	dc.Upstream = h.other.URL
	h.driver = envoydriver.New(h.conn, dc)
	h.front = httptest.NewServer(h.driver)
	t.Cleanup(h.close)
	return h
}

// config parses a server configuration with these envoy and routes
// sections; {A} and {B} in routes are the upstreams' URLs.
func (h *harness) config(envoy, routes string) *envoyfilter.FileConfig {
	h.t.Helper()
	routes = strings.NewReplacer("{A}", h.A.URL, "{B}", h.B.URL).Replace(routes)
	cfg, err := envoyfilter.ParseConfig([]byte("metrics: {listen: \"off\"}\nlog: {requests: false}\nenvoy:" +
		indentOr(envoy, " {}") + "\nroutes:" + routes))
	if err != nil {
		h.t.Fatalf("config: %v", err)
	}
	return cfg
}

func indentOr(s, empty string) string {
	if strings.TrimSpace(s) == "" {
		return empty
	}
	return "\n" + s
}

// serveGRPC serves srv on a loopback port and dials it.
func serveGRPC(t testing.TB, srv extprocv3.ExternalProcessorServer) (*grpc.Server, *grpc.ClientConn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(envoyfilter.DefaultMaxRecvMsgSize))
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	go gs.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return gs, conn
}

func (h *harness) close() {
	h.front.CloseClientConnections()
	h.front.Close()
	h.driver.Close()
	h.conn.Close()
	h.grpc.Stop()
	if !h.sharedSims {
		h.A.Close()
		h.B.Close()
	}
	h.other.Close()
	if tr, ok := http.DefaultTransport.(*http.Transport); ok {
		tr.CloseIdleConnections()
	}
}

// client is an OpenAI SDK client through the driver.
func (h *harness) client(opts ...option.RequestOption) openai.Client {
	base := []option.RequestOption{
		option.WithBaseURL(h.front.URL + "/v1/"),
		option.WithAPIKey("sk-test"),
		option.WithMaxRetries(0),
		option.WithHTTPClient(h.front.Client()),
	}
	return openai.NewClient(append(base, opts...)...)
}

func chatParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    "sim-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	}
}

// report waits for the next request report.
func (h *harness) report() *core.Report {
	h.t.Helper()
	select {
	case r := <-h.reports:
		return r
	case <-time.After(10 * time.Second):
		h.t.Fatal("no report within 10s")
		return nil
	}
}

// waitFor polls cond until it holds or the deadline passes (for state
// outside the simulated servers, which have their own WaitFor).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitSim waits on a simulated server's counters.
func waitSim(t *testing.T, s *llmsim.Running, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitFor(ctx, cond); err != nil {
		t.Fatalf("timed out waiting for %s on %s", what, s.Name)
	}
}

// chat returns the chat completions service of an SDK client through h.
func chat(h *harness) *openai.ChatCompletionService {
	c := h.client()
	return &c.Chat.Completions
}

// yamlSetting writes a clientsuite route setting as a line of a route's
// YAML.
func yamlSetting(set clientsuite.Setting) string {
	switch {
	case set.Value == "":
		set.Value = "true" // a flag
	case set.Name == "early_headers":
		set.Value = fmt.Sprintf("%q", set.Value) // quoted: YAML reads a bare off as false
	}
	return "    " + set.Name + ": " + set.Value + "\n"
}
