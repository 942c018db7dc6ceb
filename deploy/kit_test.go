package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/llmhedge/llmhedge/core"
	"github.com/llmhedge/llmhedge/internal/testkit/proc"
)

const (
	rulesPath     = "prometheus/llmhedge-rules.yml"
	dashboardPath = "grafana/llmhedge-dashboard.json"
)

// ruleFile is the part of a Prometheus rule file the tests read.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Record      string            `json:"record"`
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// rule is one recording or alerting rule.
type rule struct{ name, expr string }

func loadRules(t testing.TB) (records, alerts []rule) {
	raw, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(raw, &f); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				records = append(records, rule{r.Record, r.Expr})
			} else {
				alerts = append(alerts, rule{r.Alert, r.Expr})
			}
		}
	}
	return records, alerts
}

// dashboard is the part of the Grafana dashboard the tests read.
type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// query is one panel query.
type query struct{ panel, refID, expr string }

func loadDashboard(t testing.TB) (dashboard, []query) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardPath, err)
	}
	var qs []query
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			qs = append(qs, query{p.Title, tg.RefID, tg.Expr})
		}
	}
	return d, qs
}

// grafanaVariables are what Grafana puts in place of the dashboard's
// variables before the query reaches Prometheus.
var grafanaVariables = strings.NewReplacer(
	"$__rate_interval", "1m",
	"$__range", "5m",
	"$route", ".+",
)

// metricName finds the metric names and recording rules an expression reads.
var metricName = regexp.MustCompile(`\b(llm_hedge_[a-z_]+|llmhedge:[a-z0-9_:]+)`)

// exportedSeries returns the series names the adapters export: each
// metric of core.MetricDefs, with a histogram's _bucket, _sum and _count.
func exportedSeries() map[string]bool {
	names := map[string]bool{}
	for _, d := range core.MetricDefs() {
		if d.Type == core.MetricHistogram {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[d.Name+s] = true
			}
			continue
		}
		names[d.Name] = true
	}
	return names
}

// TestRulesAndDashboardReadOnlyExportedMetrics fails on a rule or a panel
// that reads a metric no adapter exports (a name changed in core, a metric
// of a branch not merged) or a recording rule that llmhedge-rules.yml does
// not define.
func TestRulesAndDashboardReadOnlyExportedMetrics(t *testing.T) {
	records, alerts := loadRules(t)
	known := exportedSeries()
	for _, r := range records {
		known[r.name] = true
	}
	check := func(what, expr string) {
		for _, name := range metricName.FindAllString(expr, -1) {
			if !known[name] {
				t.Errorf("%s reads %s, which is neither in core.MetricDefs nor a recording rule of %s", what, name, rulesPath)
			}
		}
		if !metricName.MatchString(expr) && !strings.Contains(expr, "vector(") {
			t.Errorf("%s reads no llmhedge metric: %q", what, expr)
		}
	}
	for _, r := range append(records, alerts...) {
		check("rule "+r.name, r.expr)
	}
	_, qs := loadDashboard(t)
	for _, q := range qs {
		check(fmt.Sprintf("panel %q query %s", q.panel, q.refID), q.expr)
	}
}

// TestDashboardIsWellFormed checks the dashboard's structure: unique panel
// ids, a Prometheus data source and at least one query on every panel
// other than a row, the variables its queries use.
func TestDashboardIsWellFormed(t *testing.T) {
	d, _ := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid = %q, title = %q, want both set", d.UID, d.Title)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	for _, v := range []string{"datasource", "route"} {
		if !vars[v] {
			t.Errorf("dashboard has no variable %q", v)
		}
	}
	ids := map[int]string{}
	for _, p := range d.Panels {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panel %q has id %d, as %q has", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q has no prometheus data source", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.RefID == "" || strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q has a query with refId %q and expr %q, want both set", p.Title, tg.RefID, tg.Expr)
			}
		}
	}
}

// promtool returns the path of promtool (Debian's prometheus package;
// `make prometheus` installs it).
func promtool(t testing.TB) string {
	proc.SkipShort(t, "promtool")
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: run `make prometheus` (installs Debian's prometheus package)")
	}
	return p
}

// TestDashboardQueriesParse hands every panel query, with Grafana's
// variables in place, to promtool as a recording rule: promtool parses it
// with Prometheus' own PromQL parser.
func TestDashboardQueriesParse(t *testing.T) {
	bin := promtool(t)
	_, qs := loadDashboard(t)
	var f strings.Builder
	f.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, q := range qs {
		expr, _ := json.Marshal(grafanaVariables.Replace(q.expr))
		fmt.Fprintf(&f, "      - record: dashboard_query_%d\n        expr: %s\n", i, expr)
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	if err := os.WriteFile(path, []byte(f.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "check", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules on the dashboard's %d queries: %v\n%s", len(qs), err, out)
	}
}

// TestRulesPassPromtool runs what `make rules` runs, so that `go test`
// alone checks the rules too.
func TestRulesPassPromtool(t *testing.T) {
	bin := promtool(t)
	if out, err := exec.Command(bin, "check", "rules", rulesPath).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", rulesPath, err, out)
	}
	cmd := exec.Command(bin, "test", "rules", "llmhedge-rules.test.yml")
	cmd.Dir = "prometheus"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// selector finds each metric or recording rule an expression reads, with
// its label matchers when it has any.
var selector = regexp.MustCompile(`\b(llm_hedge_[a-z_]+|llmhedge:[a-z0-9_:]+)(\{[^}]*\})?`)

// TestDashboardHonoursRouteAndShowsEveryMetric fails on a panel query that
// reads a series with a route label without selecting route=~"$route"
// (the panel would show every route whatever the variable says), and on a
// metric of core.MetricDefs that no panel shows.
func TestDashboardHonoursRouteAndShowsEveryMetric(t *testing.T) {
	hasRoute := map[string]bool{}
	for _, d := range core.MetricDefs() {
		for _, l := range d.Labels {
			if l == "route" {
				for _, s := range []string{"", "_bucket", "_sum", "_count"} {
					hasRoute[d.Name+s] = true
				}
			}
		}
	}
	records, _ := loadRules(t)
	for _, r := range records {
		if strings.Contains(r.expr, "route") {
			hasRoute[r.name] = true
		}
	}
	shown := map[string]bool{}
	_, qs := loadDashboard(t)
	for _, q := range qs {
		for _, m := range selector.FindAllStringSubmatch(q.expr, -1) {
			name := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m[1], "_bucket"), "_sum"), "_count")
			shown[name] = true
			if hasRoute[m[1]] && !strings.Contains(m[2], `route=~"$route"`) {
				t.Errorf("panel %q query %s reads %s%s without route=~\"$route\"", q.panel, q.refID, m[1], m[2])
			}
		}
	}
	for _, d := range core.MetricDefs() {
		if !shown[d.Name] {
			t.Errorf("no panel shows %s", d.Name)
		}
	}
}
