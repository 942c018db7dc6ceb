// Command envoy-standin is NOT Envoy: it is a stand-in for trying
// llmhedge-extproc out on a machine without Envoy. It listens on HTTP and
// plays the part of Envoy's ext_proc filter against a running
// llmhedge-extproc over gRPC, so that curl or an SDK can go through the
// server:
//
//	go run ./examples/envoy-standin -listen 127.0.0.1:8083 -extproc 127.0.0.1:50051
//
// It is the Envoy-side driver of the server's tests
// (internal/testkit/envoydriver), written from Envoy's ext_proc source, with
// the settings of examples/envoy/envoy.yaml (FULL_DUPLEX_STREAMED request
// bodies, status_on_error 502). It is no proxy to deploy: no TLS, no routing,
// no limits, none of Envoy's edge features, and it runs nothing of Envoy's
// code; what it reproduces and what it does not is listed in that package's
// doc.go. In production, Envoy itself talks to llmhedge-extproc.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmhedge/llmhedge/internal/testkit/envoydriver"
)

func main() {
	opts := options{}
	flag.StringVar(&opts.listen, "listen", "127.0.0.1:8083", "HTTP address clients connect to (examples/envoy/envoy.yaml's listener port)")
	flag.StringVar(&opts.extproc, "extproc", "127.0.0.1:50051", "gRPC address of the running llmhedge-extproc (its grpc.listen; plaintext only)")
	flag.StringVar(&opts.mode, "mode", "full_duplex_streamed", "request body mode of the emulated filter: full_duplex_streamed (Envoy >= 1.37) or buffered")
	flag.StringVar(&opts.upstream, "upstream", "", "base URL for the requests the server hands back to Envoy (routes it does not match); none by default: those get 503")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts, os.Stdout, nil); err != nil {
		fmt.Fprintln(os.Stderr, "envoy-standin:", err)
		os.Exit(1)
	}
}

type options struct {
	listen, extproc, mode, upstream string
}

// driverConfig is the filter configuration of examples/envoy/envoy.yaml
// in the driver's terms.
func driverConfig(opts options) (envoydriver.Config, error) {
	cfg := envoydriver.Config{
		Upstream:          opts.upstream,
		StatusOnError:     http.StatusBadGateway,
		MessageTimeout:    time.Second,
		MaxMessageTimeout: 60 * time.Second,
	}
	switch opts.mode {
	case "full_duplex_streamed", "":
		cfg.Mode = envoydriver.FullDuplex
	case "buffered":
		cfg.Mode = envoydriver.Buffered
	default:
		return cfg, fmt.Errorf("-mode %q: want full_duplex_streamed or buffered", opts.mode)
	}
	return cfg, nil
}

// run serves until ctx ends. ready, when set, is told the listening
// address once requests are accepted.
func run(ctx context.Context, opts options, stdout io.Writer, ready func(addr string)) error {
	cfg, err := driverConfig(opts)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(opts.extproc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("-extproc %q: %w", opts.extproc, err)
	}
	defer conn.Close()
	driver := envoydriver.New(conn, cfg)
	defer driver.Close()
	lis, err := net.Listen("tcp", opts.listen)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	srv := &http.Server{Handler: driver, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "envoy-standin: NOT Envoy, a stand-in for trying llmhedge-extproc out.\n"+
		"  http://%s -> ext_proc at %s (%s request bodies, status_on_error 502)\nCtrl-C to stop.\n",
		lis.Addr(), opts.extproc, modeName(cfg.Mode))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	if ready != nil {
		ready(lis.Addr().String())
	}
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		srv.Close() // streams still open after the grace: cut them
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func modeName(m envoydriver.Mode) string {
	if m == envoydriver.Buffered {
		return "BUFFERED"
	}
	return "FULL_DUPLEX_STREAMED"
}
