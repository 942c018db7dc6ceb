// Package respcheck drives the resp client from the interpreter: the test
// calls its functions from many compiled goroutines at once, as Traefik's
// HTTP server calls the plugin, and every call checks that the replies it
// got are its own.
package respcheck

import (
	"context"
	"strconv"
	"strings"
	"sync"

	"github.com/llmhedge/llmhedge/resp"
)

var (
	mu       sync.Mutex
	client   *resp.Client
	url      string
	firstErr string // the first call that failed, for the log
)

// Results of a call besides its id: a reply that is not the call's own
// (what the test is after), or an error before any reply could be compared
// (the first is kept: see FirstError).
const (
	Wrong  = -1
	Failed = -2
)

// untimed leaves every wait to the call's context, which has no deadline:
// a call on a starved machine is slow, never failed by a timeout of its
// own (the test's hang guard bounds it).
func untimed(redisURL string, maxOpen int) resp.Options {
	return resp.Options{URL: redisURL, MaxOpen: maxOpen, MaxIdle: maxOpen, DialTimeout: -1, ReadTimeout: -1, WriteTimeout: -1}
}

// FirstError is the first failed call's error since Open, "" if none.
func FirstError() string {
	mu.Lock()
	defer mu.Unlock()
	return firstErr
}

func failed(id int, what string, err error) int {
	mu.Lock()
	defer mu.Unlock()
	if firstErr == "" {
		msg := "call " + strconv.Itoa(id) + ": " + what
		if err != nil {
			msg = msg + ": " + err.Error()
		}
		firstErr = msg
	}
	return Failed
}

// Open makes the shared client of Roundtrip; "" or the error's text.
func Open(redisURL string, maxOpen int) string {
	c, err := resp.New(untimed(redisURL, maxOpen))
	if err != nil {
		return err.Error()
	}
	mu.Lock()
	defer mu.Unlock()
	if client != nil {
		_ = client.Close()
	}
	client = c
	url = redisURL
	firstErr = ""
	return ""
}

// Close closes the shared client.
func Close() {
	mu.Lock()
	defer mu.Unlock()
	if client != nil {
		_ = client.Close()
	}
	client = nil
}

func shared() *resp.Client {
	mu.Lock()
	defer mu.Unlock()
	return client
}

// Dials is the number of connections the shared client has opened.
func Dials() int {
	c := shared()
	if c == nil {
		return 0
	}
	s := c.Stats()
	return int(s.Dials)
}

// CommandsPerCall is how many commands one Roundtrip sends (in two round
// trips: a pipeline of three, then one command).
const CommandsPerCall = 4

// Roundtrip sends, on the shared client, a pipeline SET/GET/ECHO of a value
// unique to id (of a length that varies with id, so replies end at
// different places in the read buffer) and then a GET; it returns id when
// every reply is id's own, Wrong when one is not, Failed on an error.
func Roundtrip(id int) int {
	return check(shared(), id)
}

// RoundtripNewConnection does the same on a client of its own, closed
// afterwards: a new TCP connection per call, the way the CrowdSec bouncer
// plugin talks to Redis.
func RoundtripNewConnection(id int) int {
	mu.Lock()
	u := url
	mu.Unlock()
	c, err := resp.New(untimed(u, 0))
	if err != nil {
		return failed(id, "New", err)
	}
	got := check(c, id)
	_ = c.Close()
	return got
}

func check(c *resp.Client, id int) int {
	if c == nil {
		return failed(id, "no client (Open first)", nil)
	}
	key := "respcheck:" + strconv.Itoa(id)
	value := key + ":" + strings.Repeat("v", id%300)
	ctx := context.Background()
	cmds := [][]string{{"SET", key, value, "PX", "60000"}, {"GET", key}, {"ECHO", value}}
	values, err := c.Pipeline(ctx, cmds)
	if err != nil {
		return failed(id, "pipeline", err)
	}
	if len(values) != 3 || values[0].Str != "OK" || values[1].Str != value || values[2].Str != value {
		return Wrong
	}
	v, err := c.Do(ctx, "GET", key)
	if err != nil {
		return failed(id, "GET", err)
	}
	if v.Str != value {
		return Wrong
	}
	return id
}
