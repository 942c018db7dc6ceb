package config

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/llmhedge/llmhedge/core/redact"
)

// FleetConfig shares idempotency across gateway replicas through one Redis
// (or Valkey): a request with a client's key joins a flight led by another
// replica, replays its stored answer, or gets its 422. Without a URL there
// is no fleet and every replica keeps its own table, as before.
type FleetConfig struct {
	// URL of the Redis server: redis://[user:password@]host:port/db, or
	// rediss:// for TLS; a Redis Cluster's is
	// redis+cluster://[user:password@]host1:port1,host2:port2/ (or
	// rediss+cluster://). Required to turn the fleet on.
	URL string `json:"url,omitempty"`
	// PasswordEnv names an environment variable holding the password, so
	// that it stays out of the configuration. It replaces a password in URL.
	PasswordEnv string `json:"password_env,omitempty"`
	// Timeout bounds every fleet operation; on a timeout the request goes on
	// with this replica's own state. Default 250ms: a burst of keyed
	// requests pays connection set-up, and a claim that times out leaves
	// its request without the fleet.
	Timeout Duration `json:"timeout,omitempty"`
	// Prefix of every key, so that several gateways can share one Redis.
	// Default "llmhedge:".
	Prefix string `json:"prefix,omitempty"`
	// Lease is how long a leader's claim lives without renewal (it renews
	// every lease/3): after a leader's replica dies, a follower takes over
	// within about this long. Default 2s.
	Lease Duration `json:"lease,omitempty"`
	// RetryInterval: after Redis failed, one request per interval tries it
	// again while the others use local state. Default 500ms.
	RetryInterval Duration `json:"retry_interval,omitempty"`
	// SyncInterval is how often a replica settles its share of the fleet's
	// hedge budget, spend and tenant counters with Redis and reads the
	// fleet's cool-downs, open breakers and kill switch: what another
	// replica saw reaches this one within about this long. Default 250ms,
	// at most 1s.
	SyncInterval Duration `json:"sync_interval,omitempty"`
	// MaxFollowers caps the requests of this replica that follow another
	// replica's flight at once (each holds a blocking Redis read). One over
	// the cap gets a 409 to retry (never a second generation). Default 512;
	// compiled clients keep as many connections for blocking reads.
	MaxFollowers int `json:"max_followers,omitempty"`
}

// Key identifies the fleet c configures (defaults applied): routes whose
// keys are equal share one client and one Fleet. Built from every field,
// so a new field can never make two configurations share one by mistake.
// It holds the URL, maybe with a password: never log it.
func (c FleetConfig) Key() string {
	b, err := json.Marshal(c.WithDefaults())
	if err != nil {
		return "" // a struct of strings, numbers and durations always marshals
	}
	return string(b)
}

// Enabled reports whether the fleet is configured.
func (c FleetConfig) Enabled() bool { return c.URL != "" }

// WithDefaults returns c with its zero fields set to their defaults.
func (c FleetConfig) WithDefaults() FleetConfig {
	if c.Timeout == 0 {
		c.Timeout = Duration(250 * time.Millisecond)
	}
	if c.Prefix == "" {
		c.Prefix = "llmhedge:"
	}
	if c.Lease == 0 {
		c.Lease = Duration(2 * time.Second)
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = Duration(500 * time.Millisecond)
	}
	if c.SyncInterval == 0 {
		c.SyncInterval = Duration(250 * time.Millisecond)
	}
	if c.MaxFollowers == 0 {
		c.MaxFollowers = 512
	}
	return c
}

// validateFleet reports the problems of c (defaults applied) through bad.
// Messages quote the URL redacted: it may hold the password.
func validateFleet(bad func(string, ...interface{}), c FleetConfig) {
	if !c.Enabled() {
		return
	}
	if _, err := ParseRedisURL(c.URL, ""); err != nil {
		bad("fleet: %v", err)
	}
	if c.Timeout <= 0 {
		bad("fleet timeout %v must be positive", c.Timeout)
	}
	if c.Lease < Duration(100*time.Millisecond) {
		bad("fleet lease %v must be at least 100ms", c.Lease)
	}
	if c.RetryInterval <= 0 {
		bad("fleet retry_interval %v must be positive", c.RetryInterval)
	}
	if c.SyncInterval < Duration(10*time.Millisecond) || c.SyncInterval > Duration(time.Second) {
		bad("fleet sync_interval %v: want 10ms..1s", c.SyncInterval)
	}
	if c.MaxFollowers < 1 {
		bad("fleet max_followers %d must be at least 1", c.MaxFollowers)
	}
	if strings.ContainsAny(c.Prefix, "{}") {
		bad("fleet prefix %q must not contain { or } (they mark the hash tag)", c.Prefix)
	}
	if c.PasswordEnv != "" && !validHeaderName(c.PasswordEnv) {
		bad("fleet password_env %q is not a valid variable name", c.PasswordEnv)
	}
}

// RedisAddress is a parsed fleet URL: what a Redis client dials.
type RedisAddress struct {
	TLS     bool   // rediss:// or rediss+cluster://
	Cluster bool   // redis+cluster:// or rediss+cluster://: a Redis Cluster
	Host    string // host:port (port 6379 when absent); a cluster's first node
	// Hosts are a cluster's seed nodes, host:port each, in the URL's order
	// (nil for a single server).
	Hosts    []string
	Username string // for AUTH username password (Redis 6 ACLs)
	Password string
	DB       int
}

// Name is how metrics and logs name the server: host:port/db (a cluster's
// seed nodes comma-separated), never the user name or the password.
func (a RedisAddress) Name() string {
	if a.Cluster {
		return strings.Join(a.Hosts, ",") + "/" + strconv.Itoa(a.DB)
	}
	return a.Host + "/" + strconv.Itoa(a.DB)
}

// ParseRedisURL parses redis://[user:password@]host:port/db or rediss://,
// and a Redis Cluster's redis+cluster://[user:password@]host1:port1,host2:port2/
// or rediss+cluster:// (database 0 only: a cluster has no other).
// A non-empty passwordEnv names the environment variable the password is
// read from (it replaces one in the URL). Errors quote the URL redacted.
func ParseRedisURL(raw, passwordEnv string) (RedisAddress, error) {
	var a RedisAddress
	shown := redact.URL(raw)
	// A cluster URL lists its nodes where one host stands: parse it with a
	// placeholder host, then each node on its own.
	parsed, hostList := raw, ""
	if strings.HasPrefix(raw, "redis+cluster://") || strings.HasPrefix(raw, "rediss+cluster://") {
		start := strings.Index(raw, "://") + 3
		end := strings.IndexAny(raw[start:], "/?#")
		if end < 0 {
			end = len(raw) - start
		}
		end += start
		if at := strings.LastIndex(raw[start:end], "@"); at >= 0 {
			start += at + 1
		}
		hostList = raw[start:end]
		parsed = raw[:start] + "cluster.invalid" + raw[end:]
	}
	u, err := url.Parse(parsed)
	if err != nil {
		return a, fmt.Errorf("url %q is not a valid URL: %s", shown, redact.ParseError(err, raw))
	}
	switch u.Scheme {
	case "redis":
	case "rediss":
		a.TLS = true
	case "redis+cluster":
		a.Cluster = true
	case "rediss+cluster":
		a.Cluster = true
		a.TLS = true
	default:
		return a, fmt.Errorf("url %q: scheme must be redis or rediss (redis+cluster or rediss+cluster for a Redis Cluster)", shown)
	}
	if a.Cluster {
		hosts, err := clusterHosts(hostList)
		if err != "" {
			return a, fmt.Errorf("url %q: %s", shown, err)
		}
		a.Hosts = hosts
		a.Host = hosts[0]
	} else {
		if u.Hostname() == "" {
			return a, fmt.Errorf("url %q has no host", shown)
		}
		if strings.Contains(u.Host, ",") {
			return a, fmt.Errorf("url %q: a list of nodes is a Redis Cluster's: redis+cluster://host1:port1,host2:port2/", shown)
		}
		host := u.Host
		if u.Port() == "" {
			host = u.Host + ":6379"
		}
		a.Host = host
	}
	if u.User != nil {
		a.Username = u.User.Username()
		password, _ := u.User.Password()
		a.Password = password
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return a, fmt.Errorf("url %q: no query or fragment is understood", shown)
	}
	if db := strings.Trim(u.Path, "/"); db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 {
			return a, fmt.Errorf("url %q: the path must be a database number", shown)
		}
		a.DB = n
	}
	if a.Cluster && a.DB != 0 {
		return a, fmt.Errorf("url %q: a Redis Cluster has database 0 only", shown)
	}
	if passwordEnv != "" {
		a.Password = os.Getenv(passwordEnv)
	}
	return a, nil
}

// clusterHosts reads a cluster URL's comma-separated host[:port] list
// (port 6379 when absent); the problem, if any, is the second result.
func clusterHosts(list string) ([]string, string) {
	if list == "" {
		return nil, "has no host"
	}
	var hosts []string
	for _, h := range strings.Split(list, ",") {
		u, err := url.Parse("redis://" + h)
		if h == "" || err != nil || u.Hostname() == "" || u.User != nil || u.Path != "" || u.RawQuery != "" {
			return nil, fmt.Sprintf("node %q of the cluster's list is not host:port", h)
		}
		if u.Port() == "" {
			h += ":6379"
		}
		hosts = append(hosts, h)
	}
	return hosts, ""
}
