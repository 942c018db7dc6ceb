// Command llmhedge-ctl is the operator's command against an llmhedge fleet:
// the replicas (Caddy, Traefik, Envoy) that share one Redis.
//
// Usage:
//
//	llmhedge-ctl -fleet redis://host:6379/0 [flags] status [-json]
//	llmhedge-ctl -fleet URL pause [-route NAME]
//	llmhedge-ctl -fleet URL resume [-route NAME]
//	llmhedge-ctl -fleet URL set-delay -route NAME <duration|auto>
//
// status lists the fleet's switches and its live replicas (each heartbeats
// into Redis every second) with their routes: hedge rate, budget level,
// cooled-down and open upstreams, the switch in force and the spend so far.
// pause, resume and set-delay change the fleet-wide kill switch of one
// route (no -route: every route); every replica applies it within a
// second, without a reload. resume lifts a pause and keeps a delay
// override (set-delay NAME auto removes that).
//
// Flags (before the command):
//
//	-fleet URL          the fleet's Redis: redis://[user:password@]host:port/db
//	                    or rediss:// (TLS); a Redis Cluster's
//	                    redis+cluster://[user:password@]host1:port1,host2:port2/
//	                    (or rediss+cluster://). Required.
//	-password-env NAME  read the password from $NAME (it replaces one in the URL).
//	-prefix P           the fleet's key prefix (fleet.prefix). Default "llmhedge:".
//	-timeout D          deadline of the whole command. Default 5s.
//	-cacert FILE        PEM CAs a rediss:// server is verified against
//	                    (default: the system's).
//	-json               machine-readable output on stdout.
//
// Exit status: 0 done; 1 the fleet's Redis is unreachable or answered with
// an error (nothing was changed, or the change is unknown after a timeout);
// 2 usage error (bad flag, command, URL or duration).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/redis/go-redis/v9"

	"github.com/llmhedge/llmhedge/fleetredis"
)

// Exit statuses, for scripts.
const (
	exitOK    = 0
	exitFleet = 1 // Redis unreachable or an error reply
	exitUsage = 2
)

func main() {
	// go-redis logs some pool events on its own; the command reports
	// every error itself.
	redis.SetLogger(quietLogger{})
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...interface{}) {}

const usageText = `usage: llmhedge-ctl -fleet URL [-password-env NAME] [-prefix P] [-timeout D] [-cacert FILE] [-json] COMMAND

commands:
  status [-json]                          the fleet's switches and live replicas
  pause [-route NAME]                     stop hedging on NAME (no -route: every route)
  resume [-route NAME]                    lift the pause (a delay override stays)
  set-delay -route NAME <duration|auto>   override the hedge delay (auto: back to the configured one)

exit status: 0 done, 1 fleet unreachable or Redis error, 2 usage error
`

// options are the global flags.
type options struct {
	fleet       string
	passwordEnv string
	prefix      string
	timeout     time.Duration
	caCert      string
	json        bool
}

// usageError is a mistake on the command line: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...interface{}) error {
	return usageError{msg: fmt.Sprintf(format, args...)}
}

// run is the command with its arguments; it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	err := runCommand(args, stdout)
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usageText)
		return exitOK
	}
	var ue usageError
	if errors.As(err, &ue) {
		if ue.msg != "" {
			fmt.Fprintln(stderr, "llmhedge-ctl: "+ue.msg)
		}
		fmt.Fprint(stderr, usageText)
		return exitUsage
	}
	fmt.Fprintln(stderr, "llmhedge-ctl: "+err.Error())
	return exitFleet
}

func runCommand(args []string, stdout io.Writer) error {
	var o options
	fs := flag.NewFlagSet("llmhedge-ctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.fleet, "fleet", "", "the fleet's Redis URL")
	fs.StringVar(&o.passwordEnv, "password-env", "", "environment variable holding the password")
	fs.StringVar(&o.prefix, "prefix", "llmhedge:", "the fleet's key prefix")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Second, "deadline of the whole command")
	fs.StringVar(&o.caCert, "cacert", "", "PEM CAs for rediss://")
	fs.BoolVar(&o.json, "json", false, "machine-readable output")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usagef("%v", err)
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return usagef("no command")
	}
	cmd, cmdArgs := rest[0], rest[1:]
	var do func(context.Context, *fleet) error
	switch cmd {
	case "status":
		sfs := flag.NewFlagSet("status", flag.ContinueOnError)
		sfs.SetOutput(io.Discard)
		sfs.BoolVar(&o.json, "json", o.json, "machine-readable output")
		if err := parseCommandFlags(sfs, cmdArgs, 0); err != nil {
			return err
		}
		do = func(ctx context.Context, f *fleet) error { return status(ctx, f, stdout, o.json) }
	case "pause", "resume":
		route, err := routeFlag(cmd, cmdArgs)
		if err != nil {
			return err
		}
		paused := cmd == "pause"
		do = func(ctx context.Context, f *fleet) error {
			return changeSwitch(ctx, f, stdout, o.json, route, &paused, nil)
		}
	case "set-delay":
		sfs := flag.NewFlagSet(cmd, flag.ContinueOnError)
		sfs.SetOutput(io.Discard)
		route := sfs.String("route", "", "the route")
		if err := parseCommandFlags(sfs, cmdArgs, 1); err != nil {
			return err
		}
		if *route == "" {
			return usagef("set-delay needs -route NAME (-route '*' for every route)")
		}
		delay, err := fleetstore.ParseSwitchDelay(sfs.Arg(0))
		if err != nil {
			return usagef("set-delay: %s", strings.TrimPrefix(err.Error(), "llmhedge: "))
		}
		do = func(ctx context.Context, f *fleet) error {
			return changeSwitch(ctx, f, stdout, o.json, *route, nil, &delay)
		}
	default:
		return usagef("unknown command %q", cmd)
	}
	if o.fleet == "" {
		return usagef("-fleet URL is required")
	}
	if o.timeout <= 0 {
		return usagef("-timeout %v must be positive", o.timeout)
	}
	f, err := dial(o)
	if err != nil {
		return err
	}
	defer f.rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	if err := f.rdb.Ping(ctx).Err(); err != nil {
		var reply redis.Error
		if errors.As(err, &reply) {
			return f.errorf("refused the command", err) // e.g. WRONGPASS, NOAUTH
		}
		return f.errorf("unreachable", err)
	}
	return do(ctx, f)
}

// parseCommandFlags parses a command's flags and wants exactly positional
// arguments after them.
func parseCommandFlags(fs *flag.FlagSet, args []string, positional int) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usagef("%s: %v", fs.Name(), err)
	}
	if fs.NArg() != positional {
		if positional == 0 {
			return usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
		}
		return usagef("%s: want %d argument(s) after the flags, got %d", fs.Name(), positional, fs.NArg())
	}
	return nil
}

// routeFlag parses pause's and resume's [-route NAME]; no route is every
// route.
func routeFlag(cmd string, args []string) (string, error) {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	route := fs.String("route", fleetstore.SwitchAllRoutes, "the route")
	if err := parseCommandFlags(fs, args, 0); err != nil {
		return "", err
	}
	if strings.TrimSpace(*route) == "" {
		return "", usagef("%s: -route must not be empty", cmd)
	}
	return *route, nil
}

// fleet is a connection to the fleet's Redis: one server, or a Redis
// Cluster (a redis+cluster:// URL) whose keys the command reads on the
// masters that hold them.
type fleet struct {
	rdb      redis.UniversalClient
	name     string // host:port/db, as errors name it
	prefix   string
	password string // only to scrub it from errors
	timeout  time.Duration
}

func dial(o options) (*fleet, error) {
	if o.passwordEnv != "" {
		if _, ok := os.LookupEnv(o.passwordEnv); !ok {
			return nil, usagef("-password-env %s: the variable is not set", o.passwordEnv)
		}
	}
	var roots *x509.CertPool
	if o.caCert != "" {
		pem, err := os.ReadFile(o.caCert)
		if err != nil {
			return nil, usagef("-cacert: %v", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, usagef("-cacert %s: no PEM certificate", o.caCert)
		}
	}
	addr, err := config.ParseRedisURL(o.fleet, o.passwordEnv)
	if err != nil {
		return nil, usagef("-fleet: %v", err)
	}
	if addr.Cluster {
		return dialCluster(o, addr, roots), nil
	}
	opts, name, err := fleetredis.Options(config.FleetConfig{URL: o.fleet, PasswordEnv: o.passwordEnv}, roots)
	if err != nil {
		return nil, usagef("-fleet: %v", err)
	}
	// One connection, dialled on demand, bounded by the command's deadline.
	opts.PoolSize = 1
	opts.MinIdleConns = 0
	opts.DialTimeout = o.timeout
	opts.ReadTimeout = o.timeout
	opts.WriteTimeout = o.timeout
	opts.PoolTimeout = o.timeout
	opts.DialerRetries = 1
	return &fleet{rdb: redis.NewClient(opts), name: name, prefix: o.prefix, password: opts.Password, timeout: o.timeout}, nil
}

// dialCluster is dial for a Redis Cluster: a cluster client over the URL's
// nodes (it follows MOVED and ASK), a connection per node on demand,
// bounded by the command's deadline.
func dialCluster(o options, addr config.RedisAddress, roots *x509.CertPool) *fleet {
	opts := &redis.ClusterOptions{
		Addrs:           addr.Hosts,
		Username:        addr.Username,
		Password:        addr.Password,
		PoolSize:        1,
		DialTimeout:     o.timeout,
		ReadTimeout:     o.timeout,
		WriteTimeout:    o.timeout,
		PoolTimeout:     o.timeout,
		DisableIdentity: true, // no CLIENT SETINFO: Redis < 7.2 and Valkey answer it with errors
	}
	if addr.TLS {
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
	}
	return &fleet{rdb: redis.NewClusterClient(opts), name: addr.Name(), prefix: o.prefix, password: addr.Password, timeout: o.timeout}
}

// errorf is a Redis error as the command reports it: the server by name,
// never the password (scrubbed should a reply or a library echo it).
func (f *fleet) errorf(what string, err error) error {
	msg := err.Error()
	var netErr net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()) {
		msg = "no answer within -timeout " + f.timeout.String()
	}
	if f.password != "" {
		msg = strings.ReplaceAll(msg, f.password, "[redacted]")
	}
	return fmt.Errorf("fleet %s %s: %s", f.name, what, msg)
}

// writeJSON prints v indented, for -json.
func writeJSON(w io.Writer, v interface{}) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
