package resp

import (
	"crypto/tls"
	"errors"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/llmhedge/llmhedge/core"
)

// Defaults of Options.
const (
	DefaultDialTimeout  = 2 * time.Second
	DefaultReadTimeout  = 3 * time.Second
	DefaultWriteTimeout = 3 * time.Second
	DefaultMaxIdle      = 16
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

	// MaxIdle connections are kept for reuse; MaxOpen bounds the open
	// connections of ordinary commands and MaxBlocking those of blocking
	// commands (XREAD ... BLOCK, BLPOP, WAIT...: a fleet follower holds
	// one for up to its block time), two pools, so that readers never
	// take the connections claims, syncs and renewals need. A caller that
	// finds every connection of its pool in use waits for one until its
	// context ends; a wait that outlasts the deadline returns an error
	// wrapping core.ErrRedisBusy (and context.DeadlineExceeded). Zero
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

// parseURL reads redis://[user:password@]host[:port][/db] and rediss://
// with the fleet's own parser (whose errors quote the URL redacted), and
// the password from passwordEnv when that is set; and the cluster forms
// redis+cluster://[user:password@]host:port,host:port.../ (rediss+cluster
// for TLS), each node as its own redis:// URL would be.
func parseURL(raw, passwordEnv string) (endpoint, error) {
	scheme, rest, found := strings.Cut(raw, "://")
	if found && (strings.EqualFold(scheme, "redis+cluster") || strings.EqualFold(scheme, "rediss+cluster")) {
		return parseClusterURL(scheme[:len(scheme)-len("+cluster")], rest, passwordEnv)
	}
	return parseServerURL(raw, passwordEnv)
}

// parseClusterURL reads the part after "<scheme>+cluster://": one or more
// host:port separated by commas, database 0 only (a cluster has no other).
func parseClusterURL(scheme, rest, passwordEnv string) (endpoint, error) {
	authority := rest
	tail := ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
		tail = rest[i:]
	}
	userinfo := ""
	hosts := authority
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		userinfo = authority[:at+1]
		hosts = authority[at+1:]
	}
	var ep endpoint
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return ep, errors.New("resp: Redis Cluster URL " + scheme + "+cluster://...: an empty node in the host list (want host:port,host:port)")
		}
		one, err := parseServerURL(scheme+"://"+userinfo+h+tail, passwordEnv)
		if err != nil {
			return ep, err
		}
		if one.db != 0 {
			return ep, errors.New("resp: Redis Cluster URL: database " + strconv.Itoa(one.db) + ": a cluster has database 0 only")
		}
		if len(ep.seeds) == 0 {
			ep = one
		}
		ep.seeds = append(ep.seeds, one.addr)
	}
	ep.cluster = true
	return ep, nil
}

// parseServerURL reads a single server's URL.
func parseServerURL(raw, passwordEnv string) (endpoint, error) {
	var ep endpoint
	a, err := core.ParseRedisURL(raw, passwordEnv)
	if err != nil {
		return ep, errors.New("resp: " + err.Error())
	}
	if a.Cluster {
		return ep, errors.New("resp: a Redis Cluster URL (" + a.Name() + "): this client speaks to one server only")
	}
	host, port, err := net.SplitHostPort(a.Host)
	if err != nil {
		return ep, errors.New("resp: Redis URL: host:port " + strconv.Quote(a.Host) + " is not valid")
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return ep, errors.New("resp: Redis URL: port " + strconv.Quote(port) + " is not 1-65535")
	}
	ep.addr = a.Host
	ep.host = host
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
