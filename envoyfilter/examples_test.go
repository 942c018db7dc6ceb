package envoyfilter_test

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"github.com/llmhedge/llmhedge/envoyfilter"
)

const (
	envoyExample  = "../examples/envoy/envoy.yaml"
	serverExample = "../examples/envoy/llmhedge-extproc.yaml"
	extProcFilter = "envoy.filters.http.ext_proc"
)

// validatable is every generated Envoy message (protoc-gen-validate).
type validatable interface {
	proto.Message
	ValidateAll() error
}

func unpack[T validatable](t *testing.T, what string, a *anypb.Any) T {
	t.Helper()
	m, err := a.UnmarshalNew()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	typed, ok := m.(T)
	if !ok {
		t.Fatalf("%s is a %T", what, m)
	}
	if err := typed.ValidateAll(); err != nil {
		t.Fatalf("%s does not validate: %v", what, err)
	}
	return typed
}

// examples/envoy/envoy.yaml decodes into Envoy's Bootstrap, validates,
// and configures the ext_proc filter the way the server needs it.
func TestEnvoyExampleValidates(t *testing.T) {
	raw, err := os.ReadFile(envoyExample)
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("decoding the Bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("Bootstrap.ValidateAll: %v", err)
	}
	listeners := bs.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		t.Fatalf("len(listeners) = %v, want 1", len(listeners))
	} else if len(listeners[0].GetFilterChains()) != 1 {
		t.Fatalf("len(listeners[0].GetFilterChains()) = %v, want 1", len(listeners[0].GetFilterChains()))
	}
	hcm := unpack[*hcmv3.HttpConnectionManager](t, "the connection manager",
		listeners[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig())

	var ep *extprocfilterv3.ExternalProcessor
	for i, f := range hcm.GetHttpFilters() {
		if f.GetName() == extProcFilter {
			if i != 0 {
				t.Errorf("ext_proc is filter %d; it must run before the router", i)
			}
			ep = unpack[*extprocfilterv3.ExternalProcessor](t, "the ext_proc filter", f.GetTypedConfig())
		}
	}
	if ep == nil {
		t.Fatal("no ext_proc filter")
	}
	checkExtProc(t, ep)

	// The ext_proc cluster exists and speaks HTTP/2 (gRPC).
	cluster := findCluster(t, &bs, ep.GetGrpcService().GetEnvoyGrpc().GetClusterName())
	opts, ok := cluster.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if !ok {
		t.Fatal("the ext_proc cluster has no HttpProtocolOptions")
	}
	hpo := unpack[*upstreamhttpv3.HttpProtocolOptions](t, "the ext_proc cluster's protocol options", opts)
	if hpo.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Error("the ext_proc cluster must use HTTP/2")
	}
	serverPort := cluster.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().
		GetAddress().GetSocketAddress().GetPortValue()

	// Per-route: the filter is on for the LLM prefix only.
	var onPrefixes []string
	for _, r := range hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes() {
		disabled := false
		if a, ok := r.GetTypedPerFilterConfig()[extProcFilter]; ok {
			per := unpack[*extprocfilterv3.ExtProcPerRoute](t, "ExtProcPerRoute", a)
			disabled = per.GetDisabled()
		}
		if !disabled {
			onPrefixes = append(onPrefixes, r.GetMatch().GetPrefix())
		}
		if rt, ok := r.GetAction().(*routev3.Route_Route); ok && rt.Route.GetCluster() != "" {
			findCluster(t, &bs, rt.Route.GetCluster())
		}
	}

	// The server's example configuration loads and matches the Envoy one.
	t.Setenv("OPENAI_API_KEY", "sk-example")
	t.Setenv("OPENAI_BACKUP_API_KEY", "sk-example-2")
	cfg, err := envoyfilter.LoadConfig(serverExample)
	if err != nil {
		t.Fatal(err)
	}
	if _, port, _ := net.SplitHostPort(cfg.GRPC.Listen); port != strconv.Itoa(int(serverPort)) {
		t.Errorf("the server listens on %s, Envoy dials port %d", cfg.GRPC.Listen, serverPort)
	}
	for _, r := range cfg.Routes {
		for _, p := range r.Match.PathPrefixes {
			if !hasPrefixIn(p, onPrefixes) {
				t.Errorf("route %s matches %s, which Envoy never sends to the server (filter on for %v)", r.Name, p, onPrefixes)
			}
		}
	}
}

// checkExtProc checks the filter against what the server relies on and
// what Envoy's config.cc (verifyProcessingModeConfig) rejects.
func checkExtProc(t *testing.T, ep *extprocfilterv3.ExternalProcessor) {
	t.Helper()
	pm := ep.GetProcessingMode()
	if pm.GetRequestHeaderMode() != extprocfilterv3.ProcessingMode_SEND {
		t.Error("request_header_mode must be SEND: the local response answers the request headers")
	}
	if pm.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		t.Error("request_body_mode must be FULL_DUPLEX_STREAMED")
	}
	if pm.GetRequestTrailerMode() != extprocfilterv3.ProcessingMode_SEND {
		t.Error("FULL_DUPLEX_STREAMED needs request_trailer_mode SEND (config.cc)")
	}
	if ep.GetFailureModeAllow() {
		t.Error("FULL_DUPLEX_STREAMED needs failure_mode_allow false (config.cc)")
	}
	if pm.GetResponseHeaderMode() != extprocfilterv3.ProcessingMode_SKIP {
		t.Errorf("the response path must not go to the server: pm.GetResponseHeaderMode() = %v, want %v", pm.GetResponseHeaderMode(), extprocfilterv3.ProcessingMode_SKIP)
	} else if pm.GetResponseBodyMode() != extprocfilterv3.ProcessingMode_NONE {
		t.Errorf("the response path must not go to the server: pm.GetResponseBodyMode() = %v, want %v", pm.GetResponseBodyMode(), extprocfilterv3.ProcessingMode_NONE)
	} else if pm.GetResponseTrailerMode() != extprocfilterv3.ProcessingMode_SKIP {
		t.Errorf("the response path must not go to the server: pm.GetResponseTrailerMode() = %v, want %v", pm.GetResponseTrailerMode(), extprocfilterv3.ProcessingMode_SKIP)
	}
	if ep.GetAllowModeOverride() {
		t.Error("allow_mode_override: the server never overrides modes")
	}
	if ep.GetObservabilityMode() {
		t.Error("observability_mode ignores every reply")
	}
	if ep.GetGrpcService().GetEnvoyGrpc().GetClusterName() == "" {
		t.Error("ext_proc must use an envoy_grpc cluster")
	}
	if max := ep.GetGrpcService().GetEnvoyGrpc().GetMaxReceiveMessageLength(); max != nil &&
		max.GetValue() < envoyfilter.DefaultMaxImmediateResponse+64<<10 {
		t.Errorf("max_receive_message_length %d is below the server's largest ImmediateResponse", max.GetValue())
	}
	if ep.GetMaxMessageTimeout().AsDuration() < envoyfilter.DefaultOverrideMessageTimeout {
		t.Error("max_message_timeout is below the server's override_message_timeout")
	}
}

func findCluster(t *testing.T, bs *bootstrapv3.Bootstrap, name string) *clusterv3.Cluster {
	t.Helper()
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() == name {
			return c
		}
	}
	t.Fatalf("no cluster %q", name)
	return nil
}

func hasPrefixIn(p string, prefixes []string) bool {
	for _, q := range prefixes {
		if strings.HasPrefix(p, q) {
			return true
		}
	}
	return false
}
