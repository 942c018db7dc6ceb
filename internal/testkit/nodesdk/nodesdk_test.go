package nodesdk

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/llmhedge/llmhedge/internal/testkit/llmsim"
)

// The driver speaks to the simulated upstream directly with each SDK.
func TestDriverAgainstSim(t *testing.T) {
	drv := Install(t)
	sim := llmsim.Start("A", llmsim.Workload{MedianTTFT: 10 * time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 5, TokenGap: time.Millisecond})
	defer sim.Close()
	calls := []Call{
		{API: "chat", BaseURL: sim.URL + "/v1"},
		{API: "responses", BaseURL: sim.URL + "/v1"},
		{API: "messages", BaseURL: sim.URL},
		{API: "chat", BaseURL: sim.URL + "/v1", Headers: map[string]string{llmsim.HeaderBehavior: "A=status:500"}, MaxRetries: Retries(1)},
	}
	res := Run(t, drv, 1, calls)
	for i, r := range res[:3] {
		if r.Error != nil || r.Text == "" || r.Requests != 1 {
			t.Errorf("%s: error %+v, text %q, requests %d; want a whole answer in one request", calls[i].API, r.Error, r.Text, r.Requests)
		}
	}
	if r := res[3]; r.Error == nil || r.Error.Status != 500 || r.Requests != 2 {
		t.Errorf("500: error %+v, requests %d; want an APIError 500 after one retry", r.Error, r.Requests)
	}
}

// The JavaScript SDKs' idempotencyKey request option sends no header (their
// idempotencyHeader is undefined): the key reaches a gateway only as a
// header in the request's headers option, as core/README.md says.
func TestIdempotencyKeyReachesTheGatewayOnlyAsAHeader(t *testing.T) {
	drv := Install(t)
	// The gateway is the upstream's own handler behind a hook that records
	// the header (no proxy hop: a reverse proxy's own connection handling
	// is not what this test is about).
	sim := &llmsim.Server{Name: "A", Workload: llmsim.Workload{MedianTTFT: time.Millisecond, Sigma: -1, StallProb: -1, Tokens: 2, TokenGap: time.Millisecond}}
	seen := make(chan string, 8)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Idempotency-Key")
		sim.ServeHTTP(w, r)
	}))
	defer front.Close()
	key := map[string]string{"Idempotency-Key": "order-42"}
	calls := []Call{
		{API: "chat", BaseURL: front.URL + "/v1", IdempotencyKey: "order-42"},
		{API: "chat", BaseURL: front.URL + "/v1", RequestHeaders: key},
		{API: "messages", BaseURL: front.URL, IdempotencyKey: "order-42"},
		{API: "messages", BaseURL: front.URL, RequestHeaders: key},
	}
	want := []string{"", "order-42", "", "order-42"}
	for i, r := range Run(t, drv, 1, calls) {
		if r.Error != nil || r.Requests != 1 {
			t.Fatalf("call %d (%s): error %+v, requests %d", i, calls[i].API, r.Error, r.Requests)
		}
		if got := <-seen; got != want[i] {
			t.Errorf("call %d (%s, idempotencyKey %q, headers %v): Idempotency-Key %q reached the gateway, want %q",
				i, calls[i].API, calls[i].IdempotencyKey, calls[i].RequestHeaders, got, want[i])
		}
	}
}
