package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// overrideBody is a /json request of n descriptors, each with its own
// limit and a value of its own, value(i) for the i-th: each asks for a
// statistics name of its own.
func overrideBody(n int, value func(i int) string) string {
	var b strings.Builder
	b.WriteString(`{"domain":"d","descriptors":[`)
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"entries":[{"key":"k","value":%q}],"limit":{"requests_per_unit":100,"unit":"MINUTE"}}`, value(i))
	}
	b.WriteString("]}")
	return b.String()
}

var seriesLine = regexp.MustCompile(`(?m)^[a-z_]+\{`)

// TestServeMetricNamesBounded: statistics names that depend on the
// request (a descriptor's own limit, detailed_metric, value_to_metric)
// cannot grow /metrics without bound. 300 requests of 64 descriptors, each
// with its own limit and a different 900-byte value, leave it small: the
// names are over the byte bound and are counted under the overflow name;
// past the count bound, new names are too.
func TestServeMetricNamesBounded(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")

	t.Run("long names", func(t *testing.T) {
		t.Parallel()
		p := startTollgate(t, "serve", "--config", path)
		const requests, descs = 300, 64
		for r := range requests {
			body := overrideBody(descs, func(i int) string { return fmt.Sprintf("%03d-%02d-", r, i) + strings.Repeat("v", 893) })
			if code, out := postJSON(t, p.http+"/json", body); code != 200 {
				t.Fatalf("request %d: %d %s", r, code, out)
			}
		}
		_, metrics := p.get("/metrics")
		series := len(seriesLine.FindAllString(metrics, -1))
		t.Logf("/metrics after %d requests of %d descriptors of 900-byte values: %d bytes, %d series", requests, descs, len(metrics), series)
		if len(metrics) > 64<<10 {
			t.Errorf("/metrics is %d bytes, want at most 64 KiB", len(metrics))
		}
		if got, want := p.metric(`tollgate_serve_metric_names_folded_total{reason="too_long"}`), float64(requests*descs); got != want {
			t.Errorf("folded, too long: %v, want %v", got, want)
		}
		if got, want := p.metric(`ratelimit_service_rate_limit_total_hits{domain="d",key1="__overflow__",key2=""}`), float64(requests*descs); got != want {
			t.Errorf("hits under the overflow name: %v, want %v", got, want)
		}
	})

	t.Run("many names", func(t *testing.T) {
		t.Parallel()
		p := startTollgate(t, "serve", "--config", path, "--max-metric-names", "100")
		for r := range 2 {
			body := overrideBody(64, func(i int) string { return fmt.Sprintf("user-%d", r*64+i) })
			if code, out := postJSON(t, p.http+"/json", body); code != 200 {
				t.Fatalf("request %d: %d %s", r, code, out)
			}
		}
		_, metrics := p.get("/metrics")
		if got, want := strings.Count(metrics, "\nratelimit_service_rate_limit_total_hits{"), 100+1; got != want {
			t.Errorf("%d total_hits series, want %d (100 names and the overflow)", got, want)
		}
		if got, want := p.metric(`tollgate_serve_metric_names_folded_total{reason="too_many"}`), float64(128-100); got != want {
			t.Errorf("folded, too many: %v, want %v", got, want)
		}
		if got, want := p.metric(`tollgate_serve_decisions_total{domain="d",outcome="ok",rule="d.__overflow__"}`), float64(128-100); got != want {
			t.Errorf("decisions under the overflow name: %v, want %v", got, want)
		}
	})
}
