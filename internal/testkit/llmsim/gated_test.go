package llmsim

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// In hold mode a stream stops after its first token until Release closes,
// then ends with every token.
func TestGatedHoldsAfterTheFirstToken(t *testing.T) {
	g := StartGated(3, true)
	defer g.Close()
	req, _ := http.NewRequest(http.MethodPost, g.URL, strings.NewReader("{}"))
	req.Header.Set(HeaderRequest, "g-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if id := <-g.First; id != "g-1" {
		t.Fatalf("First = %q, want g-1", id)
	}
	close(g.Release)
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if !strings.Contains(string(body), TokenText("g-1", i)) {
			t.Fatalf("token %d (%q) missing from the stream", i, TokenText("g-1", i))
		}
	}
	if !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("stream ends %q, want data: [DONE]", body[len(body)-20:])
	}
}

// A held request waits for its release; another id is not held.
func TestHolderHoldsOnlyTheHeldID(t *testing.T) {
	var h Holder
	release := h.Hold("held")
	done := make(chan struct{})
	go func() {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set(HeaderRequest, "held")
		h.Behave(r)
		close(done)
	}()
	free := httptest.NewRequest(http.MethodPost, "/", nil)
	free.Header.Set(HeaderRequest, "free")
	h.Behave(free) // returns at once
	select {
	case <-done:
		t.Fatal("the held request went on before its release")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-done
}
