package resp

import (
	"crypto/tls"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/llmhedge/llmhedge/core/config"
)

// Defaults of Options.
const (
	DefaultDialTimeout  = 2 * time.Second
	DefaultReadTimeout  = 3 * time.Second
	DefaultWriteTimeout = 3 * time.Second
	DefaultMaxIdle      = 64 // every ordinary connection: a burst of claims finds them open
	DefaultMaxOpen      = 64
	// DefaultMaxBlocking bounds the connections of blocking commands (per
	// Redis node): 256 followers of one replica read at once, more wait
	// their turn.
	DefaultMaxBlocking = 256
	// DefaultIdleTimeout closes connections unused this long (below the
	// 300 s idle timeout many Redis services set).
	DefaultIdleTimeout = 2 * time.Minute
)

// Options configure a Client. Only URL is required.
type Options struct {
	// URL is redis://[user:password@]host[:port][/db] or rediss://... for
	// TLS. The port defaults to 6379, the database to 0. A Redis Cluster
	// is redis+cluster://[user:password@]host:port,host:port.../ (or
	// rediss+cluster://): any of its nodes will do, the client learns the
	// others. A redis:// URL naming a cluster node is refused (see New).
	URL string
	// PasswordEnv names an environment variable holding the password; when
	// set it replaces the URL's password (the URL then need not carry a
	// secret). Read once, by New.
	PasswordEnv string
	// TLSConfig replaces the default TLS configuration of rediss:// (the
	// system roots, ServerName from the URL's host). Its ServerName, when
	// empty, is set from the URL's host.
	TLSConfig *tls.Config

	// DialTimeout bounds connecting, the TLS handshake and AUTH/SELECT;
	// ReadTimeout and WriteTimeout bound each read and write. The context's
	// deadline applies when it is earlier. Zero means the default; negative
	// means none (the context alone).
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration

	// MaxIdle ordinary connections are kept for reuse (every blocking one
	// may be: a follower's reads come one after the other); MaxOpen bounds
	// the open connections of ordinary commands and MaxBlocking those of blocking
	// commands (XREAD ... BLOCK, BLPOP, WAIT...: a fleet follower holds
	// one for up to its block time), two pools, so that readers never
	// take the connections claims, syncs and renewals need. A caller that
	// finds every connection of its pool in use waits for one until its
	// context ends; a wait that outlasts the deadline returns an error
	// wrapping fleetstore.ErrRedisBusy (and context.DeadlineExceeded). Zero
	// means the default (DefaultMaxOpen, DefaultMaxBlocking).
	MaxIdle     int
	MaxOpen     int
	MaxBlocking int
	// IdleTimeout closes a connection unused this long, so that a client
	// nobody calls any more (the Traefik plugin cannot close one: it gets
	// no close hook) holds no connection. Zero means the default; negative
	// means never.
	IdleTimeout time.Duration
}

// endpoint is what a URL resolves to.
type endpoint struct {
	addr     string   // host:port (the first node of a cluster URL)
	host     string   // for TLS ServerName
	cluster  bool     // redis+cluster:// or rediss+cluster://
	seeds    []string // a cluster URL's nodes, host:port
	useTLS   bool
	user     string
	password string
	db       int
}

// parseURL reads redis://[user:password@]host[:port][/db] and rediss://,
// and a Redis Cluster's redis+cluster://[user:password@]host:port,host:port/
// and rediss+cluster://, with the fleet's own parser (whose errors quote the
// URL redacted), and the password from passwordEnv when that is set.
func parseURL(raw, passwordEnv string) (endpoint, error) {
	var ep endpoint
	a, err := config.ParseRedisURL(raw, passwordEnv)
	if err != nil {
		return ep, errors.New("resp: " + err.Error())
	}
	hosts := a.Hosts
	if !a.Cluster {
		hosts = []string{a.Host}
	}
	for _, h := range hosts {
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			return ep, errors.New("resp: Redis URL: host:port " + strconv.Quote(h) + " is not valid")
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return ep, errors.New("resp: Redis URL: port " + strconv.Quote(port) + " is not 1-65535")
		}
		if ep.host == "" {
			ep.host = host
		}
	}
	ep.addr = a.Host
	ep.cluster = a.Cluster
	if a.Cluster {
		ep.seeds = hosts
	}
	ep.useTLS = a.TLS
	ep.user = a.Username
	ep.password = a.Password
	ep.db = a.DB
	return ep, nil
}

// resolve applies defaults and reads the URL and the password variable.
func (o Options) resolve() (endpoint, Options, error) {
	ep, err := parseURL(o.URL, o.PasswordEnv)
	if err != nil {
		return ep, o, err
	}
	if o.PasswordEnv != "" && ep.password == "" {
		return ep, o, errors.New("resp: environment variable " + o.PasswordEnv + " (the Redis password) is empty or unset")
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.MaxOpen <= 0 {
		o.MaxOpen = DefaultMaxOpen
	}
	if o.MaxIdle <= 0 {
		o.MaxIdle = DefaultMaxIdle
	}
	if o.MaxIdle > o.MaxOpen {
		o.MaxIdle = o.MaxOpen
	}
	if o.MaxBlocking <= 0 {
		o.MaxBlocking = DefaultMaxBlocking
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	return ep, o, nil
}
