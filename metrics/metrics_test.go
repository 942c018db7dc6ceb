package metrics

import (
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmhedge/llmhedge/core"
)

// TestReadmeTableNamesEveryMetric: core/README.md's metrics table lists
// every metric of core.MetricDefs with its type and labels.
func TestReadmeTableNamesEveryMetric(t *testing.T) {
	readme, err := os.ReadFile("../core/README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(line, "| `llm_hedge_") {
			name := strings.Trim(strings.SplitN(line, "|", 3)[1], " `")
			rows[name] = line
		}
	}
	for _, d := range core.MetricDefs() {
		row, ok := rows[d.Name]
		if !ok {
			t.Errorf("core/README.md's metrics table has no row for %s", d.Name)
			continue
		}
		cells := strings.Split(row, "|")
		if strings.TrimSpace(cells[2]) != d.Type {
			t.Errorf("core/README.md: %s is a %q, want %s", d.Name, strings.TrimSpace(cells[2]), d.Type)
		}
		for _, l := range d.Labels {
			if !strings.Contains(cells[3], "`"+l+"`") {
				t.Errorf("core/README.md: %s's labels %q lack %s", d.Name, cells[3], l)
			}
		}
	}
}

// TestRegisterTwiceIsNoError: a second handler of one config registers the
// same collectors.
func TestRegisterTwiceIsNoError(t *testing.T) {
	s := New()
	reg := prometheus.NewRegistry()
	for i := 0; i < 2; i++ {
		if err := Register(reg, s.Collectors()...); err != nil {
			t.Fatalf("registration %d: %v", i+1, err)
		}
	}
	s.Observe(&core.Report{Route: "r", Outcome: core.OutcomeOK, Winner: -1})
	if got := s.CounterValue(core.MetricRequests, "r", core.OutcomeOK); got != 1 {
		t.Errorf("requests_total{r,ok} = %v, want 1", got)
	}
	if err := Register(reg, New().Collectors()...); err == nil {
		t.Error("registering another Set's collectors: no error, want a duplicate")
	}
}
