package resp

import (
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Defaults of Options.
const (
	DefaultDialTimeout  = 2 * time.Second
	DefaultReadTimeout  = 3 * time.Second
	DefaultWriteTimeout = 3 * time.Second
	DefaultMaxIdle      = 16
	DefaultMaxOpen      = 64
	// DefaultMaxBlocking bounds the connections of blocking commands.
	DefaultMaxBlocking = 256
	// defaultPort is Redis' port when a URL names none.
	defaultPort = "6379"
)

// Options configure a Client. Only URL is required.
type Options struct {
	// URL is redis://[user:password@]host[:port][/db] or rediss://... for
	// TLS. The port defaults to 6379, the database to 0.
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
	// commands. A caller that finds every connection in use waits for one
	// until its context ends. Zero means the default.
	MaxIdle     int
	MaxOpen     int
	MaxBlocking int
}

// endpoint is what a URL resolves to.
type endpoint struct {
	addr     string // host:port
	host     string // for TLS ServerName
	useTLS   bool
	user     string
	password string
	db       int
}

// errURL is the only error text of URL parsing: url.Parse's own errors
// quote the URL, and with it the password.
func errURL(why string) error {
	return errors.New("resp: invalid Redis URL: " + why)
}

// parseURL reads redis://[user:password@]host[:port][/db] and rediss://.
func parseURL(raw string) (endpoint, error) {
	var ep endpoint
	u, err := url.Parse(raw)
	if err != nil {
		return ep, errURL("not a URL (want redis://[user:password@]host:port/db)")
	}
	switch u.Scheme {
	case "redis":
	case "rediss":
		ep.useTLS = true
	default:
		return ep, errURL("scheme must be redis or rediss")
	}
	if u.Opaque != "" || u.Host == "" {
		return ep, errURL("no host (want redis://[user:password@]host:port/db)")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return ep, errURL("query parameters and fragments are not supported")
	}
	host := u.Hostname()
	port := u.Port()
	if host == "" {
		return ep, errURL("no host")
	}
	if port == "" {
		port = defaultPort
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return ep, errURL("port must be 1-65535")
	}
	ep.host = host
	ep.addr = net.JoinHostPort(host, port)
	if u.User != nil {
		ep.user = u.User.Username()
		password, ok := u.User.Password()
		if ok {
			ep.password = password
		}
	}
	path := strings.TrimPrefix(u.Path, "/")
	if path != "" {
		db, err := strconv.Atoi(path)
		if err != nil || db < 0 {
			return ep, errURL("the path must be a database number, e.g. /0")
		}
		ep.db = db
	}
	return ep, nil
}

// resolve applies defaults and reads the URL and the password variable.
func (o Options) resolve() (endpoint, Options, error) {
	ep, err := parseURL(o.URL)
	if err != nil {
		return ep, o, err
	}
	if o.PasswordEnv != "" {
		password := os.Getenv(o.PasswordEnv)
		if password == "" {
			return ep, o, errors.New("resp: environment variable " + o.PasswordEnv + " (the Redis password) is empty or unset")
		}
		ep.password = password
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
	return ep, o, nil
}

// RedactURL returns raw with its password replaced by "xxxxx", for logs.
// An unparsable URL is returned as "(invalid Redis URL)".
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(invalid Redis URL)"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	return u.String()
}
