// Package nodesdk runs the official JavaScript SDKs (the npm packages
// `openai` and `@anthropic-ai/sdk`, pinned by package-lock.json) with Node
// for the end-to-end tests. Install puts them, with `npm ci`, into the
// project cache ($LLMHEDGE_CACHE, default $HOME/.cache/llmhedge) under a
// directory named by the lockfile's hash, so a fresh machine needs only
// node and npm, and a second run nothing.
//
// It is test support: nothing outside this module's tests imports it.
package nodesdk

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/caddybin"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
)

//go:embed package.json
var packageJSON []byte

//go:embed package-lock.json
var packageLock []byte

//go:embed driver.mjs
var driver []byte

// Call is one SDK call the driver makes.
type Call struct {
	// API is "chat" (OpenAI chat.completions, streamed), "responses"
	// (OpenAI responses.stream, the SDK's default: no store field) or
	// "messages" (Anthropic messages, streamed).
	API string `json:"api"`
	// BaseURL is the SDK's base URL: ".../v1" for OpenAI, the root for Anthropic.
	BaseURL string `json:"baseURL"`
	// TimeoutMs is the SDK's timeout option; 0 keeps the SDK's default.
	TimeoutMs int `json:"timeoutMs,omitempty"`
	// MaxRetries is the SDK's maxRetries; nil keeps its default (2).
	MaxRetries *int              `json:"maxRetries,omitempty"`
	Headers    map[string]string `json:"headers,omitempty"`
	// StripShouldRetry removes x-should-retry from every answer before the
	// SDK sees it: the client as it behaved against a gateway that did not
	// send the header.
	StripShouldRetry bool `json:"stripShouldRetry,omitempty"`
	// IdempotencyKey is the request option idempotencyKey of the call
	// (chat and messages), RequestHeaders its request option headers.
	IdempotencyKey string            `json:"idempotencyKey,omitempty"`
	RequestHeaders map[string]string `json:"requestHeaders,omitempty"`
}

// Result is what one call got.
type Result struct {
	Requests int       `json:"requests"` // requests the SDK sent, its retries included
	Statuses []int     `json:"statuses"`
	Ms       float64   `json:"ms"`      // the whole call
	FirstMs  *float64  `json:"firstMs"` // the first text delta, nil when none
	Text     string    `json:"text"`
	Error    *SDKError `json:"error"`
}

// SDKError is an error the SDK raised.
type SDKError struct {
	Name    string `json:"name"`
	Status  int    `json:"status"`
	Message string `json:"message"`
}

// Duration is the whole call's time.
func (r Result) Duration() time.Duration { return time.Duration(r.Ms * float64(time.Millisecond)) }

// Install makes sure the pinned SDKs are installed and returns the
// directory holding them and the driver. It skips t when node or npm is
// missing.
func Install(t testing.TB) string {
	t.Helper()
	proc.SkipShort(t, "npm and node")
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: the JavaScript SDK tests need Node and npm", tool)
		}
	}
	sum := sha256.Sum256(packageLock)
	dir := filepath.Join(caddybin.CacheDir(), "node-sdk-"+hex.EncodeToString(sum[:6]))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err != nil {
		if err := install(dir); err != nil {
			t.Fatalf("installing the JavaScript SDKs: %v", err)
		}
	}
	dsum := sha256.Sum256(driver)
	name := "driver-" + hex.EncodeToString(dsum[:6]) + ".mjs"
	if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
		if err := writeAtomic(filepath.Join(dir, name), driver); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, name)
}

// install runs npm ci in a fresh directory next to dir and renames it into
// place, so that concurrent test packages never see half an install.
func install(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, "package.json"), packageJSON, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "package-lock.json"), packageLock, 0o644); err != nil {
		return err
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm ci: %v\n%s", err, out)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); statErr == nil {
			return nil // another test package installed it first
		}
		return err
	}
	return nil
}

func writeAtomic(path string, data []byte) error {
	tmp := fmt.Sprintf("%s.tmp-%d", path, os.Getpid())
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Run makes the calls with the driver (from Install), concurrency at a
// time, and returns their results in order; it fails t when the driver
// fails.
func Run(t testing.TB, driverPath string, concurrency int, calls []Call) []Result {
	t.Helper()
	results, err := Exec(driverPath, concurrency, calls)
	if err != nil {
		t.Fatal(err)
	}
	return results
}

// Exec is Run for a goroutine other than the test's: it returns the
// driver's failure instead of failing a test.
func Exec(driverPath string, concurrency int, calls []Call) ([]Result, error) {
	in, err := json.Marshal(map[string]any{"calls": calls, "concurrency": concurrency})
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("node", driverPath)
	cmd.Dir = filepath.Dir(driverPath)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("node driver: %v\n%s", err, stderr.String())
	}
	var results []Result
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var r Result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return nil, fmt.Errorf("node driver printed %q: %v", line, err)
		}
		results = append(results, r)
	}
	if len(results) != len(calls) {
		return nil, fmt.Errorf("node driver: %d results for %d calls\n%s", len(results), len(calls), stderr.String())
	}
	return results, nil
}

// Retries is a MaxRetries value.
func Retries(n int) *int { return &n }
