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
	"time"

	"github.com/llmhedge/llmhedge/resp"
)

var (
	mu     sync.Mutex
	client *resp.Client
	url    string
)

// Open makes the shared client of Roundtrip; "" or the error's text.
func Open(redisURL string, maxOpen int) string {
	c, err := resp.New(resp.Options{URL: redisURL, MaxOpen: maxOpen, MaxIdle: maxOpen})
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
// every reply is id's own, -1 otherwise.
func Roundtrip(id int) int {
	return check(shared(), id)
}

// RoundtripNewConnection does the same on a client of its own, closed
// afterwards: a new TCP connection per call, the way the CrowdSec bouncer
// plugin talks to Redis.
func RoundtripNewConnection(id int) int {
	c, err := resp.New(resp.Options{URL: url})
	if err != nil {
		return -1
	}
	got := check(c, id)
	_ = c.Close()
	return got
}

func check(c *resp.Client, id int) int {
	if c == nil {
		return -1
	}
	key := "respcheck:" + strconv.Itoa(id)
	value := key + ":" + strings.Repeat("v", id%300)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmds := [][]string{{"SET", key, value, "PX", "60000"}, {"GET", key}, {"ECHO", value}}
	values, err := c.Pipeline(ctx, cmds)
	if err != nil || len(values) != 3 {
		return -1
	}
	if values[0].Str != "OK" || values[1].Str != value || values[2].Str != value {
		return -1
	}
	v, err := c.Do(ctx, "GET", key)
	if err != nil || v.Str != value {
		return -1
	}
	return id
}
