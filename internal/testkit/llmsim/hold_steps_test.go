package llmsim

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A request held by TokenHold gets its status and preamble, no token until
// the release, then its whole answer; another id is not held.
func TestTokenHoldHoldsTheFirstTokenOfTheHeldID(t *testing.T) {
	var h TokenHold
	s := h.Start(&Server{Name: "A", Workload: Workload{MedianTTFT: time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 3, TokenGap: time.Millisecond, PingEvery: -1}})
	defer s.Close()
	post := func(id string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/chat/completions", strings.NewReader(`{"model":"`+DefaultModel+`","stream":true}`))
		req.Header.Set(HeaderRequest, id)
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	reached, release := h.Hold("held")
	held := post("held") // the status line came: only the token waits
	defer held.Body.Close()
	if held.StatusCode != http.StatusOK {
		t.Fatalf("held request: status %d, want 200 before the release", held.StatusCode)
	}
	var released atomic.Bool
	var early atomic.Bool // the token reached the client before the release
	body := make(chan []byte, 1)
	go func() {
		var all bytes.Buffer
		r := bufio.NewReader(held.Body)
		for {
			line, err := r.ReadBytes('\n')
			if bytes.Contains(line, []byte(TokenText("held", 0))) && !released.Load() {
				early.Store(true)
			}
			all.Write(line)
			if err != nil {
				body <- all.Bytes()
				return
			}
		}
	}()
	<-reached
	// Not held: answers whole while "held" still waits.
	free := post("free")
	fb, _ := io.ReadAll(free.Body)
	free.Body.Close()
	if want := ExpectedStream("A", DefaultModel, "free", 3); !bytes.Equal(StripPings(fb), want) {
		t.Fatalf("the request not held got %q, want %q", fb, want)
	}
	released.Store(true)
	release()
	release() // a second release is harmless
	got := <-body
	if early.Load() {
		t.Fatalf("the held token reached the client before the release: %q", got)
	}
	if want := ExpectedStream("A", DefaultModel, "held", 3); !bytes.Equal(StripPings(got), want) {
		t.Fatalf("the held request got %q after its release, want %q", got, want)
	}
}

// HoldToken(id, 1) lets the first token out and holds the second.
func TestTokenHoldHoldsALaterToken(t *testing.T) {
	var h TokenHold
	s := h.Start(&Server{Name: "A", Workload: Workload{MedianTTFT: time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 3, TokenGap: time.Millisecond, PingEvery: -1}})
	defer s.Close()
	reached, release := h.HoldToken("second", 1)
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/chat/completions", strings.NewReader(`{"model":"`+DefaultModel+`","stream":true}`))
	req.Header.Set(HeaderRequest, "second")
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	// The first token comes while the second is held.
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("the stream ended before its first token: %v", err)
		}
		if bytes.Contains(line, []byte(TokenText("second", 1))) {
			t.Fatalf("the held second token came before the release: %q", line)
		}
		if bytes.Contains(line, []byte(TokenText("second", 0))) {
			break
		}
	}
	<-reached
	release()
	rest, _ := io.ReadAll(r)
	if !bytes.Contains(rest, []byte(TokenText("second", 1))) || !bytes.HasSuffix(rest, []byte("data: [DONE]\n\n")) {
		t.Fatalf("after the release the stream went on with %q, want the second token and the end", rest)
	}
}
