package traefikplugin

import (
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/llmhedge/llmhedge/core"
)

// Traefik gives plugins no metrics registry. A middleware with metricsPath
// counts its requests in one process-wide store (the llm_hedge_* metrics of
// core.MetricDefs, the names Caddy and the Envoy server export) and answers
// that path with the Prometheus text exposition of the store. The store
// outlives handlers and reloads, like the registry in shared.go, so counters
// keep counting; it starts nothing.

// metricSeries is one labelled series: a counter's value, or a histogram's
// sum, count and per-bucket counts (not cumulative; the last is +Inf).
type metricSeries struct {
	labels  []string
	value   float64
	count   uint64
	buckets []uint64
}

// metricStore holds every series, and the latest engine of each route for
// the gauges read at scrape time.
type metricStore struct {
	mu      sync.Mutex
	defs    []core.MetricDef
	series  []map[string]*metricSeries // by metric index, created on first use
	hedgers map[string]*core.Hedger    // by route
}

var sharedMetrics = &metricStore{}

// initLocked creates the tables on first use.
func (s *metricStore) initLocked() {
	if s.defs != nil {
		return
	}
	s.defs = core.MetricDefs()
	s.series = make([]map[string]*metricSeries, len(s.defs))
	for i := range s.series {
		s.series[i] = make(map[string]*metricSeries)
	}
	s.hedgers = make(map[string]*core.Hedger)
}

// Observe implements core.Observer.
func (s *metricStore) Observe(r *core.Report) { core.ReportMetrics(r, s) }

// Record implements core.MetricSink.
func (s *metricStore) Record(metric int, labels []string, v float64) {
	key := strings.Join(labels, "\xff")
	s.mu.Lock()
	s.initLocked()
	def := &s.defs[metric]
	se := s.series[metric][key]
	if se == nil {
		se = &metricSeries{labels: labels}
		if def.Type == core.MetricHistogram {
			se.buckets = make([]uint64, len(def.Buckets)+1)
		}
		s.series[metric][key] = se
	}
	if def.Type == core.MetricGauge {
		se.value = v // a gauge recorded through the sink (the fleet's)
	} else {
		se.value += v
	}
	if def.Type == core.MetricHistogram {
		se.count++
		i := 0
		for i < len(def.Buckets) && v > def.Buckets[i] {
			i++
		}
		se.buckets[i]++
	}
	s.mu.Unlock()
}

// reportObserver is a handler's core.Observer: its log line and its
// metrics, either of them nil when off.
type reportObserver struct {
	log     *logObserver
	metrics *metricStore
}

// Observe implements core.Observer.
func (o *reportObserver) Observe(r *core.Report) {
	if o.metrics != nil {
		o.metrics.Observe(r)
	}
	if o.log != nil {
		o.log.Observe(r)
	}
}

// setHedger makes h the engine whose gauges its route reports.
func (s *metricStore) setHedger(route string, h *core.Hedger) {
	s.mu.Lock()
	s.initLocked()
	s.hedgers[route] = h
	s.mu.Unlock()
}

// serveMetrics answers a scrape of the metrics path.
func serveMetrics(s *metricStore, w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "llmhedge: metrics answer GET", http.StatusMethodNotAllowed)
		return
	}
	body := appendTraceMetrics(s.exposition(), exporters)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		w.Write(body)
	}
}

// exposition is the store in the Prometheus text format: the families in
// the order of core.MetricDefs, series sorted by labels, families without a
// series left out (as Prometheus' client does).
func (s *metricStore) exposition() []byte {
	s.mu.Lock()
	s.initLocked()
	b := make([]byte, 0, 4096)
	for i := range s.defs {
		def := &s.defs[i]
		if def.FromHedger {
			continue // below, outside the lock
		}
		m := s.series[i]
		if len(m) == 0 {
			continue
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b = appendFamilyHeader(b, def)
		for _, k := range keys {
			b = appendSeries(b, def, m[k])
		}
	}
	routes := make([]string, 0, len(s.hedgers))
	for route := range s.hedgers {
		routes = append(routes, route)
	}
	hedgers := make([]*core.Hedger, 0, len(routes))
	sort.Strings(routes)
	for _, route := range routes {
		hedgers = append(hedgers, s.hedgers[route])
	}
	defs := s.defs
	s.mu.Unlock()
	if len(routes) == 0 {
		return b
	}
	for m := range defs {
		def := &defs[m]
		if !def.FromHedger {
			continue
		}
		b = appendFamilyHeader(b, def)
		for i, route := range routes {
			b = appendSample(b, def.Name, def.Labels, []string{route}, "", "", core.HedgerGauge(m, hedgers[i]))
		}
	}
	return b
}

func appendFamilyHeader(b []byte, def *core.MetricDef) []byte {
	b = append(b, "# HELP "...)
	b = append(b, def.Name...)
	b = append(b, ' ')
	b = append(b, escapeHelp(def.Help)...)
	b = append(b, "\n# TYPE "...)
	b = append(b, def.Name...)
	b = append(b, ' ')
	b = append(b, def.Type...)
	b = append(b, '\n')
	return b
}

// appendSeries writes a counter's sample, or a histogram's cumulative
// buckets, sum and count.
func appendSeries(b []byte, def *core.MetricDef, se *metricSeries) []byte {
	if def.Type != core.MetricHistogram {
		return appendSample(b, def.Name, def.Labels, se.labels, "", "", se.value)
	}
	var cumulative uint64
	for i, upper := range def.Buckets {
		cumulative += se.buckets[i]
		b = appendSample(b, def.Name+"_bucket", def.Labels, se.labels, "le", formatFloat(upper), float64(cumulative))
	}
	b = appendSample(b, def.Name+"_bucket", def.Labels, se.labels, "le", "+Inf", float64(se.count))
	b = appendSample(b, def.Name+"_sum", def.Labels, se.labels, "", "", se.value)
	b = appendSample(b, def.Name+"_count", def.Labels, se.labels, "", "", float64(se.count))
	return b
}

// appendSample writes name{labels...,extra="extraValue"} v.
func appendSample(b []byte, name string, labels, values []string, extra, extraValue string, v float64) []byte {
	b = append(b, name...)
	if len(labels) > 0 || extra != "" {
		b = append(b, '{')
		for i, l := range labels {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, l...)
			b = append(b, '=', '"')
			b = append(b, escapeLabelValue(values[i])...)
			b = append(b, '"')
		}
		if extra != "" {
			if len(labels) > 0 {
				b = append(b, ',')
			}
			b = append(b, extra...)
			b = append(b, '=', '"')
			b = append(b, extraValue...)
			b = append(b, '"')
		}
		b = append(b, '}')
	}
	b = append(b, ' ')
	b = append(b, formatFloat(v)...)
	b = append(b, '\n')
	return b
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// escapeLabelValue escapes a label value for the text format.
func escapeLabelValue(s string) string {
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, "\n", `\n`)
	return strings.ReplaceAll(s, `"`, `\"`)
}

// escapeHelp escapes a help text for the text format.
func escapeHelp(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	return strings.ReplaceAll(s, "\n", `\n`)
}

// traceMetricDefs are the plugin's own counters of its span exporters
// (tracing.go), shown once tracing has been used: the other adapters
// export spans with OpenTelemetry's SDK, which counts on its own.
var traceMetricDefs = []core.MetricDef{
	{Name: "llm_hedge_trace_spans_exported_total", Type: core.MetricCounter, Help: "Spans the trace collector accepted."},
	{Name: "llm_hedge_trace_spans_dropped_total", Type: core.MetricCounter, Help: "Spans dropped because the export queue was full."},
	{Name: "llm_hedge_trace_spans_failed_total", Type: core.MetricCounter, Help: "Spans lost in posts the trace collector did not accept (not retried)."},
	{Name: "llm_hedge_trace_export_failures_total", Type: core.MetricCounter, Help: "Posts to the trace collector that failed or got no 2xx answer."},
}

// appendTraceMetrics appends the exporters' counters, summed over all of
// them, when there is one.
func appendTraceMetrics(b []byte, g *exporterRegistry) []byte {
	st, ok := traceStats(g)
	if !ok {
		return b
	}
	values := []uint64{st.Exported, st.Dropped, st.FailedSpans, st.FailedPosts}
	for i := range traceMetricDefs {
		def := &traceMetricDefs[i]
		b = appendFamilyHeader(b, def)
		b = appendSample(b, def.Name, nil, nil, "", "", float64(values[i]))
	}
	return b
}
