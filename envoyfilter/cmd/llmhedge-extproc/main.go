// Command llmhedge-extproc is the Envoy ext_proc server of llmhedge: it
// hedges LLM requests on their first output token behind Envoy.
//
//	llmhedge-extproc -config /etc/llmhedge/extproc.yaml
//
// SIGHUP reloads the configuration without dropping streams; SIGTERM (or
// SIGINT) drains the streams in flight, then exits.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"go.opentelemetry.io/otel"
	"go.uber.org/zap"

	"github.com/llmhedge/llmhedge/envoyfilter"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version from the build info is used.
var version = ""

func main() {
	configPath := flag.String("config", "", "path of the configuration file (YAML)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("llmhedge-extproc", buildVersion())
		return
	}
	if *configPath == "" {
		fmt.Fprintln(os.Stderr, "llmhedge-extproc: -config is required")
		flag.Usage()
		os.Exit(2)
	}
	cfg, err := envoyfilter.LoadConfig(*configPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "llmhedge-extproc:", err)
		os.Exit(1)
	}
	log, level, err := envoyfilter.NewLogger(cfg.Log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "llmhedge-extproc: log:", err)
		os.Exit(1)
	}
	defer log.Sync()
	// The tracing pipeline's failures (a collector that does not answer,
	// a full queue) go to the server's log rather than to stderr's
	// default logger. They name the endpoint, never an export header.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: export failed", zap.Error(err))
	}))
	app, err := envoyfilter.NewApp(*configPath, cfg, log, level, envoyfilter.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "llmhedge-extproc:", err)
		os.Exit(1)
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	if err := app.Run(signals); err != nil {
		fmt.Fprintln(os.Stderr, "llmhedge-extproc:", err)
		os.Exit(1)
	}
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(devel)"
}
