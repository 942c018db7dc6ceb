// Package fleetredis adapts github.com/redis/go-redis/v9 to fleetstore.RedisClient,
// the command interface of the fleet protocol, for the compiled adapters
// (the Caddy module and the Envoy server). The Traefik plugin, which Yaegi
// interprets, cannot use go-redis (it imports unsafe); it has package resp.
package fleetredis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmhedge/llmhedge/core/fleetstore"

	"github.com/llmhedge/llmhedge/core/config"

	"github.com/redis/go-redis/v9"
)

const (
	// DefaultPoolSize is how many commands (blocking reads aside) a
	// client has in flight at once: claims, renewals, appends, syncs.
	DefaultPoolSize = 256
	// DefaultBlockingPoolSize is how many blocking reads (a follower's
	// XREAD ... BLOCK) a client has in flight at once when neither the
	// settings nor the fleet's max_followers say otherwise, on connections
	// of their own: followers never take a connection from claims and
	// renewals. A read that finds none free by its deadline fails with
	// fleetstore.ErrRedisBusy, which the fleet does not count as a Redis failure.
	DefaultBlockingPoolSize = 512
)

// Settings tune a client; zero fields take the defaults.
type Settings struct {
	// Roots are the CAs a rediss:// server is verified against (nil: the
	// system's).
	Roots *x509.CertPool
	// PoolSize bounds the commands in flight at once, blocking reads aside
	// (default DefaultPoolSize). On a cluster it bounds them across all
	// nodes.
	PoolSize int
	// BlockingPoolSize bounds the blocking reads in flight at once, on a
	// pool of their own (default: the fleet's max_followers, which caps the
	// followers of a replica, so none of them waits for a connection).
	BlockingPoolSize int
}

// Client is a pooled go-redis client speaking RESP2 (whose replies map onto
// fleetstore.RedisValue without maps), without retries: the fleet bounds every
// operation by its own deadline and falls back to local state instead.
//
// A redis+cluster:// URL makes it a cluster client: commands go to the
// master of their key's slot, following MOVED and ASK. Blocking reads go to
// a second pool (a second go-redis client) so that followers cannot starve
// the main one.
type Client struct {
	main, block redis.UniversalClient
	// mainTurns and blockTurns hold one token per command in flight on
	// each pool: a command that waits for one until its deadline fails
	// with fleetstore.ErrRedisBusy (go-redis would say context deadline
	// exceeded, like a Redis that does not answer).
	mainTurns, blockTurns chan struct{}
	name                  string
	cluster               bool

	mu       sync.Mutex
	verified bool  // a single-node client checked its server is no cluster node
	refusal  error // the server is a cluster node: every command fails
}

// New returns a client for cfg's URL (and password_env). It does not dial:
// the first command does (Check dials at once). A rediss:// URL verifies
// the server against the system's roots.
func New(cfg config.FleetConfig) (*Client, error) { return NewWith(cfg, Settings{}) }

// NewWithRoots is New with the CAs a rediss:// server is verified against
// (nil: the system's).
func NewWithRoots(cfg config.FleetConfig, roots *x509.CertPool) (*Client, error) {
	return NewWith(cfg, Settings{Roots: roots})
}

// NewWith is New with settings.
func NewWith(cfg config.FleetConfig, s Settings) (*Client, error) {
	addr, err := config.ParseRedisURL(cfg.URL, cfg.PasswordEnv)
	if err != nil {
		return nil, err
	}
	if s.PoolSize <= 0 {
		s.PoolSize = DefaultPoolSize
	}
	if s.BlockingPoolSize <= 0 {
		s.BlockingPoolSize = cfg.WithDefaults().MaxFollowers
	}
	if s.BlockingPoolSize <= 0 {
		s.BlockingPoolSize = DefaultBlockingPoolSize
	}
	c := &Client{
		mainTurns:  make(chan struct{}, s.PoolSize),
		blockTurns: make(chan struct{}, s.BlockingPoolSize),
		name:       addr.Name(),
		cluster:    addr.Cluster,
	}
	if addr.Cluster {
		// No idle connections kept: a dead node's would be dialled
		// again and again until the failover.
		c.main = redis.NewClusterClient(clusterOptions(addr, s.Roots, s.PoolSize, 0))
		c.block = redis.NewClusterClient(clusterOptions(addr, s.Roots, s.BlockingPoolSize, 0))
		return c, nil
	}
	c.main = redis.NewClient(options(addr, s.Roots, s.PoolSize, 2))
	c.block = redis.NewClient(options(addr, s.Roots, s.BlockingPoolSize, 0))
	return c, nil
}

// Options are the go-redis options of New's client for cfg's URL (and
// password_env), TLS verified against roots (nil: the system's), and the
// server's name (host:port/db). llmhedge-ctl dials with them too. A Redis
// Cluster URL is refused: it needs New's cluster client.
func Options(cfg config.FleetConfig, roots *x509.CertPool) (*redis.Options, string, error) {
	addr, err := config.ParseRedisURL(cfg.URL, cfg.PasswordEnv)
	if err != nil {
		return nil, "", err
	}
	if addr.Cluster {
		return nil, "", fmt.Errorf("%s is a Redis Cluster: this needs a single server's redis:// URL", addr.Name())
	}
	return options(addr, roots, DefaultPoolSize, 2), addr.Name(), nil
}

func options(addr config.RedisAddress, roots *x509.CertPool, poolSize, minIdle int) *redis.Options {
	opts := &redis.Options{
		Addr:     addr.Host,
		Username: addr.Username,
		Password: addr.Password,
		DB:       addr.DB,
		Protocol: 2,
		// One try: a retry would outlast the operation timeout.
		MaxRetries: -1,
		// Deadlines come from each operation's context.
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
		DialerRetries:         1,
		ReadTimeout:           5 * time.Second, // above any XREAD BLOCK of the protocol
		WriteTimeout:          time.Second,
		PoolSize:              poolSize,
		MinIdleConns:          minIdle,
		PoolTimeout:           time.Second,
		DisableIdentity:       true, // no CLIENT SETINFO: Redis < 7.2 and Valkey answer it with errors
	}
	if addr.TLS {
		host := addr.Host
		if h, _, ok := cutPort(host); ok {
			host = h
		}
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host, RootCAs: roots}
	}
	return opts
}

// clusterOptions are options' for a cluster: per node pools of poolSize
// (the client's turns bound the total), MOVED and ASK followed, and no
// retry of a command that may have reached a node (noResend).
func clusterOptions(addr config.RedisAddress, roots *x509.CertPool, poolSize, minIdle int) *redis.ClusterOptions {
	opts := &redis.ClusterOptions{
		Addrs:    addr.Hosts,
		Username: addr.Username,
		Password: addr.Password,
		Protocol: 2,
		// Redirections (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) and dials that
		// failed; noResend keeps a command that may have run from a
		// second run.
		MaxRedirects: 4,
		MaxRetries:   -1,
		// Commands go to the master of their key's slot, as they are.
		DisableRoutingPolicies: true,
		// The slot map is read again on every error but a reply (see
		// Client.observe) and at least this often.
		ClusterStateReloadInterval: 5 * time.Second,
		ContextTimeoutEnabled:      true,
		DialTimeout:                time.Second,
		DialerRetries:              1,
		ReadTimeout:                5 * time.Second,
		WriteTimeout:               time.Second,
		PoolSize:                   poolSize,
		MinIdleConns:               minIdle,
		PoolTimeout:                time.Second,
		DisableIdentity:            true,
		NewClient: func(o *redis.Options) *redis.Client {
			node := redis.NewClient(o)
			node.AddHook(noResend{})
			return node
		},
	}
	if addr.TLS {
		// No ServerName: each node is verified by the host it is dialled at.
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
	}
	return opts
}

// noResend marks a node's error as final unless the command surely never
// left (a failed dial, a closed pool) or Redis answered it (MOVED, ASK,
// TRYAGAIN...): the cluster client then does not send it again. A script
// whose connection broke may have run, and must not run twice.
type noResend struct{}

func (noResend) DialHook(next redis.DialHook) redis.DialHook { return next }

func (noResend) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil || isReply(err) || neverSent(err) {
			return err
		}
		return &sentError{err: err}
	}
}

func (noResend) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// sentError is a node's error the cluster client must not retry: it hides
// the cause (no Unwrap) from go-redis' retry test.
type sentError struct{ err error }

func (e *sentError) Error() string { return e.err.Error() }

func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.ErrClosed) && !errors.Is(err, redis.ErrPoolTimeout)
}

func neverSent(err error) bool {
	var op *net.OpError
	return errors.Is(err, redis.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) ||
		errors.As(err, &op) && op.Op == "dial"
}

func cutPort(hostport string) (host, port string, ok bool) {
	for i := len(hostport) - 1; i >= 0; i-- {
		if hostport[i] == ':' {
			h := hostport[:i]
			if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
				h = h[1 : len(h)-1]
			}
			return h, hostport[i+1:], true
		}
	}
	return hostport, "", false
}

// Name is the server as metrics name it (host:port/db; a cluster's nodes
// comma-separated).
func (c *Client) Name() string { return c.name }

// Close closes both pools.
func (c *Client) Close() error {
	err := c.main.Close()
	if berr := c.block.Close(); err == nil {
		err = berr
	}
	return err
}

// Check asks the server whether the URL's kind fits it, within ctx: a
// redis:// URL must not point at a Redis Cluster node (cluster_enabled:1),
// a redis+cluster:// URL must point at one. The adapters call it at start,
// so that a mismatch is a configuration error there. A server that does not
// answer is no mismatch (nil): the fleet starts down and retries, and a
// single-node client checks again before its first command.
func (c *Client) Check(ctx context.Context) error {
	if c.cluster {
		_, err := c.command(ctx, c.main, c.mainTurns, []interface{}{"CLUSTER", "INFO"})
		if err != nil && isReply(err) {
			return fmt.Errorf("fleet %s: the URL is redis+cluster:// but the server is no Redis Cluster node (%v): use redis://", c.name, err)
		}
		return nil
	}
	if err := c.verify(ctx); err != nil && c.refused() != nil {
		return err
	}
	return nil
}

func (c *Client) refused() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refusal
}

// verify makes sure, once, that a single-node client's server is no
// cluster node; after a refusal every command fails with it.
func (c *Client) verify(ctx context.Context) error {
	if c.cluster {
		return nil
	}
	c.mu.Lock()
	verified, refusal := c.verified, c.refusal
	c.mu.Unlock()
	if verified {
		return refusal
	}
	v, err := c.command(ctx, c.main, c.mainTurns, []interface{}{"INFO", "cluster"})
	if err != nil && !isReply(err) {
		return err // no answer: check again next time
	}
	info, _ := v.(string)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.verified = true
	if strings.Contains(info, "cluster_enabled:1") {
		c.refusal = fmt.Errorf("fleet %s: the server is a Redis Cluster node (cluster_enabled:1) but the URL is redis://: use redis+cluster://host1:port1,host2:port2/", c.name)
	}
	return c.refusal
}

// command runs one command on rdb holding one of turns, and maps a wait for
// a connection past ctx's deadline to fleetstore.ErrRedisBusy.
func (c *Client) command(ctx context.Context, rdb redis.UniversalClient, turns chan struct{}, args []interface{}) (interface{}, error) {
	release, err := take(ctx, turns, c.name)
	if err != nil {
		return nil, err
	}
	defer release()
	v, err := rdb.Do(ctx, args...).Result()
	return v, c.observe(ctx, rdb, err)
}

// take waits for one of turns until ctx ends.
func take(ctx context.Context, turns chan struct{}, name string) (func(), error) {
	release := func() { <-turns }
	select {
	case turns <- struct{}{}:
		return release, nil
	default:
	}
	select {
	case turns <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("fleet %s: all %d connections in use: %w", name, cap(turns), fleetstore.ErrRedisBusy)
		}
		return nil, ctx.Err()
	}
}

// observe unwraps noResend's errors, maps a go-redis pool timeout to
// fleetstore.ErrRedisBusy, and has a cluster client read its slot map again after
// an error that was no reply (a node died, a failover may follow).
func (c *Client) observe(ctx context.Context, rdb redis.UniversalClient, err error) error {
	if err == nil || errors.Is(err, redis.Nil) {
		return err
	}
	var se *sentError
	if errors.As(err, &se) {
		err = se.err
	}
	if errors.Is(err, redis.ErrPoolTimeout) {
		return fmt.Errorf("fleet %s: %v: %w", c.name, err, fleetstore.ErrRedisBusy)
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok && !isReply(err) && !errors.Is(err, context.Canceled) {
		cc.ReloadState(ctx)
	}
	return err
}

// isBlockingRead reports whether args are XREAD or XREADGROUP with BLOCK.
func isBlockingRead(args []string) bool {
	if len(args) == 0 || !strings.EqualFold(args[0], "XREAD") && !strings.EqualFold(args[0], "XREADGROUP") {
		return false
	}
	for _, a := range args[1:] {
		if strings.EqualFold(a, "STREAMS") {
			return false
		}
		if strings.EqualFold(a, "BLOCK") {
			return true
		}
	}
	return false
}

func toArgs(args []string) []interface{} {
	out := make([]interface{}, len(args))
	for i, a := range args {
		out[i] = a
	}
	return out
}

// Do implements fleetstore.RedisClient. A blocking read (XREAD ... BLOCK) runs
// on the blocking pool, everything else on the main one.
func (c *Client) Do(ctx context.Context, args ...string) (fleetstore.RedisValue, error) {
	if err := c.verify(ctx); err != nil {
		return fleetstore.RedisValue{}, err
	}
	rdb, turns := c.main, c.mainTurns
	if isBlockingRead(args) {
		rdb, turns = c.block, c.blockTurns
	}
	v, err := c.command(ctx, rdb, turns, toArgs(args))
	if errors.Is(err, redis.Nil) {
		return fleetstore.RedisValue{Kind: fleetstore.RedisNil}, nil
	}
	if err != nil {
		return fleetstore.RedisValue{}, err
	}
	return convert(v)
}

// Pipeline implements fleetstore.RedisClient. On a cluster, go-redis sends each
// node its commands (a pipeline may span slots).
func (c *Client) Pipeline(ctx context.Context, cmds [][]string) ([]fleetstore.RedisValue, error) {
	if err := c.verify(ctx); err != nil {
		return nil, err
	}
	release, err := take(ctx, c.mainTurns, c.name)
	if err != nil {
		return nil, err
	}
	defer release()
	pipe := c.main.Pipeline()
	results := make([]*redis.Cmd, len(cmds))
	for i, cmd := range cmds {
		results[i] = pipe.Do(ctx, toArgs(cmd)...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, c.observe(ctx, c.main, err)
	}
	out := make([]fleetstore.RedisValue, len(cmds))
	for i, r := range results {
		v, err := r.Result()
		if errors.Is(err, redis.Nil) {
			out[i] = fleetstore.RedisValue{Kind: fleetstore.RedisNil}
			continue
		}
		if err != nil {
			return nil, err
		}
		cv, err := convert(v)
		if err != nil {
			return nil, err
		}
		out[i] = cv
	}
	return out, nil
}

// convert turns a RESP2 reply as go-redis decodes it into a RedisValue. An
// error reply nested in an array (a script's or a transaction's) is an
// error.
func convert(v interface{}) (fleetstore.RedisValue, error) {
	switch x := v.(type) {
	case nil:
		return fleetstore.RedisValue{Kind: fleetstore.RedisNil}, nil
	case string:
		return fleetstore.RedisValue{Kind: fleetstore.RedisString, Str: x}, nil
	case []byte:
		return fleetstore.RedisValue{Kind: fleetstore.RedisString, Str: string(x)}, nil
	case int64:
		return fleetstore.RedisValue{Kind: fleetstore.RedisInt, Int: x}, nil
	case bool: // RESP3 only; kept for completeness
		if x {
			return fleetstore.RedisValue{Kind: fleetstore.RedisInt, Int: 1}, nil
		}
		return fleetstore.RedisValue{Kind: fleetstore.RedisInt, Int: 0}, nil
	case float64:
		return fleetstore.RedisValue{Kind: fleetstore.RedisString, Str: strconv.FormatFloat(x, 'g', -1, 64)}, nil
	case []interface{}:
		arr := make([]fleetstore.RedisValue, len(x))
		for i, e := range x {
			cv, err := convert(e)
			if err != nil {
				return fleetstore.RedisValue{}, err
			}
			arr[i] = cv
		}
		return fleetstore.RedisValue{Kind: fleetstore.RedisArray, Array: arr}, nil
	case error:
		return fleetstore.RedisValue{}, x
	}
	return fleetstore.RedisValue{}, fmt.Errorf("fleetredis: unexpected reply type %T", v)
}

var _ fleetstore.RedisClient = (*Client)(nil)
