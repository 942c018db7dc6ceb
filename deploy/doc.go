// Package deploy holds the operator kit: Prometheus rules
// (prometheus/llmhedge-rules.yml), a Grafana dashboard
// (grafana/llmhedge-dashboard.json) and Kubernetes examples (kubernetes/).
// Its tests check them against the metric vocabulary of core.MetricDefs,
// with promtool, and against a real Prometheus scraping real proxies.
package deploy
