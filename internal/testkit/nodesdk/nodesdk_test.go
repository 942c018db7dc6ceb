package nodesdk

import (
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
