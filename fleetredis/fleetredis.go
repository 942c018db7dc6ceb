// Package fleetredis adapts github.com/redis/go-redis/v9 to core.RedisClient,
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
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmhedge/llmhedge/core"
)

// Client is a pooled go-redis client speaking RESP2 (whose replies map onto
// core.RedisValue without maps), without retries: the fleet bounds every
// operation by its own deadline and falls back to local state instead.
type Client struct {
	rdb  *redis.Client
	name string
}

// New returns a client for cfg's URL (and password_env). It does not dial:
// the first command does. A rediss:// URL verifies the server against the
// system's roots.
func New(cfg core.FleetConfig) (*Client, error) { return NewWithRoots(cfg, nil) }

// NewWithRoots is New with the CAs a rediss:// server is verified against
// (nil: the system's).
func NewWithRoots(cfg core.FleetConfig, roots *x509.CertPool) (*Client, error) {
	opts, name, err := Options(cfg, roots)
	if err != nil {
		return nil, err
	}
	return &Client{rdb: redis.NewClient(opts), name: name}, nil
}

// Options are the go-redis options of New's client for cfg's URL (and
// password_env), TLS verified against roots (nil: the system's), and the
// server's name (host:port/db). llmhedge-ctl dials with them too.
func Options(cfg core.FleetConfig, roots *x509.CertPool) (*redis.Options, string, error) {
	addr, err := core.ParseRedisURL(cfg.URL, cfg.PasswordEnv)
	if err != nil {
		return nil, "", err
	}
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
		ReadTimeout:           5 * time.Second, // above any XREAD BLOCK of the protocol
		WriteTimeout:          time.Second,
		// Every follower holds a connection during its blocking read.
		PoolSize:        256,
		MinIdleConns:    2,
		PoolTimeout:     time.Second,
		DisableIdentity: true, // no CLIENT SETINFO: Redis < 7.2 and Valkey answer it with errors
	}
	if addr.TLS {
		host := addr.Host
		if h, _, ok := cutPort(host); ok {
			host = h
		}
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host, RootCAs: roots}
	}
	return opts, addr.Name(), nil
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

// Name is the server as metrics name it (host:port/db).
func (c *Client) Name() string { return c.name }

// Close closes the pool.
func (c *Client) Close() error { return c.rdb.Close() }

func toArgs(args []string) []interface{} {
	out := make([]interface{}, len(args))
	for i, a := range args {
		out[i] = a
	}
	return out
}

// Do implements core.RedisClient.
func (c *Client) Do(ctx context.Context, args ...string) (core.RedisValue, error) {
	v, err := c.rdb.Do(ctx, toArgs(args)...).Result()
	if errors.Is(err, redis.Nil) {
		return core.RedisValue{Kind: core.RedisNil}, nil
	}
	if err != nil {
		return core.RedisValue{}, err
	}
	return convert(v)
}

// Pipeline implements core.RedisClient.
func (c *Client) Pipeline(ctx context.Context, cmds [][]string) ([]core.RedisValue, error) {
	pipe := c.rdb.Pipeline()
	results := make([]*redis.Cmd, len(cmds))
	for i, cmd := range cmds {
		results[i] = pipe.Do(ctx, toArgs(cmd)...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := make([]core.RedisValue, len(cmds))
	for i, r := range results {
		v, err := r.Result()
		if errors.Is(err, redis.Nil) {
			out[i] = core.RedisValue{Kind: core.RedisNil}
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
func convert(v interface{}) (core.RedisValue, error) {
	switch x := v.(type) {
	case nil:
		return core.RedisValue{Kind: core.RedisNil}, nil
	case string:
		return core.RedisValue{Kind: core.RedisString, Str: x}, nil
	case []byte:
		return core.RedisValue{Kind: core.RedisString, Str: string(x)}, nil
	case int64:
		return core.RedisValue{Kind: core.RedisInt, Int: x}, nil
	case bool: // RESP3 only; kept for completeness
		if x {
			return core.RedisValue{Kind: core.RedisInt, Int: 1}, nil
		}
		return core.RedisValue{Kind: core.RedisInt, Int: 0}, nil
	case float64:
		return core.RedisValue{Kind: core.RedisString, Str: strconv.FormatFloat(x, 'g', -1, 64)}, nil
	case []interface{}:
		arr := make([]core.RedisValue, len(x))
		for i, e := range x {
			cv, err := convert(e)
			if err != nil {
				return core.RedisValue{}, err
			}
			arr[i] = cv
		}
		return core.RedisValue{Kind: core.RedisArray, Array: arr}, nil
	case error:
		return core.RedisValue{}, x
	}
	return core.RedisValue{}, fmt.Errorf("fleetredis: unexpected reply type %T", v)
}

var _ core.RedisClient = (*Client)(nil)
