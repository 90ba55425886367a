package config_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/service/config"
)

func kvs(pairs ...string) []config.KV {
	var out []config.KV
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, config.KV{Key: pairs[i], Value: pairs[i+1]})
	}
	return out
}

func mustLoad(t *testing.T, path string) *config.Rules {
	t.Helper()
	r, err := config.Load(path)
	if err != nil {
		t.Fatalf("Load(%s): %v", path, err)
	}
	return r
}

// TestEnvoyFileLoadsUnchanged loads a directory of files written for
// envoyproxy/ratelimit and checks its matching rules, entry by entry.
func TestEnvoyFileLoadsUnchanged(t *testing.T) {
	t.Parallel()
	r := mustLoad(t, "testdata/envoy")
	if got, want := r.Domains(), 2; got != want {
		t.Fatalf("Domains() = %d, want %d", got, want)
	}
	tests := []struct {
		name    string
		domain  string
		entries []config.KV
		want    string // rule ID, "" for no rule
	}{
		{"key and value", "edge", kvs("category", "account"), "edge.category_account"},
		{"value not configured", "edge", kvs("category", "other"), ""},
		{"unknown domain", "nowhere", kvs("category", "account"), ""},
		{"unknown key", "edge", kvs("nope", "x"), ""},
		{"no entries", "edge", nil, ""},
		{"nested value", "edge", kvs("source_cluster", "proxy", "destination_cluster", "billing"), "edge.source_cluster_proxy.destination_cluster_billing"},
		{"placeholder parent has no limit", "edge", kvs("source_cluster", "proxy"), ""},
		{"nested value not configured", "edge", kvs("source_cluster", "proxy", "destination_cluster", "x"), ""},
		{"bare key at the top", "edge", kvs("tenant", "acme"), "edge.tenant"},
		{"bare key nested", "edge", kvs("tenant", "acme", "user", "bob"), "edge.tenant.user"},
		{"value wins over bare key", "edge", kvs("tenant", "acme", "user", "alice"), "edge.tenant.user_alice"},
		{"deeper than the config", "edge", kvs("tenant", "acme", "user", "bob", "extra", "1"), ""},
		{"limit at depth of last entry only", "edge", kvs("healthcheck", "x", "more", "y"), ""},
		{"unlimited", "edge", kvs("tenant", "acme", "internal", "yes"), "edge.tenant.internal"},
		{"middle wildcard", "edge", kvs("route", "/api/v2/export"), "edge.route_/api/*/export"},
		{"middle wildcard, wrong suffix", "edge", kvs("route", "/api/v2/import"), ""},
		{"trailing wildcard", "edge", kvs("files", "files/a.pdf"), "edge.files_files/*"},
		{"second file", "mongo_cps", kvs("database", "users"), "mongo_cps.database_users"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rule := config.Lookup(r, tc.domain, tc.entries)
			got := ""
			if rule != nil {
				got = rule.ID
			}
			if got != tc.want {
				t.Errorf("Lookup(%s, %v) = %q, want %q", tc.domain, tc.entries, got, tc.want)
			}
		})
	}

	// The details of a few rules, as an envoy user would expect them.
	get := func(entries ...string) *config.Rule {
		rule := config.Lookup(r, "edge", kvs(entries...))
		if rule == nil {
			t.Fatalf("no rule for %v", entries)
		}
		return rule
	}
	if rule := get("tenant", "acme", "user", "alice"); rule.Name != "per_user" || rule.Limit != (tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 1, Period: time.Minute}) {
		t.Errorf("alice: name %q limit %v, want per_user and 1/m fixed_window", rule.Name, rule.Limit)
	}
	if rule := get("category", "account"); strings.Join(rule.Replaces, ",") != "per_user,not_defined_anywhere" {
		t.Errorf("category: replaces %v", rule.Replaces)
	}
	if rule := get("tenant", "acme", "user", "mallory"); !rule.DenyAll() {
		t.Errorf("mallory: DenyAll() = false, want true (requests_per_unit: 0)")
	}
	if rule := get("tenant", "acme", "path", "/trial"); !rule.DryRun {
		t.Errorf("/trial: DryRun = false, want true")
	}
	if rule := get("tenant", "acme", "internal", "x"); !rule.Unlimited {
		t.Errorf("internal: Unlimited = false, want true")
	}
	if rule := get("unspecified", "x"); !rule.DetailedMetric {
		t.Errorf("unspecified: DetailedMetric = false")
	}
	if rule := get("plan", "gold"); !rule.QuotaMode || rule.Unit != config.Day {
		t.Errorf("plan: QuotaMode %v unit %v, want quota per day", rule.QuotaMode, rule.Unit)
	}
	files := get("files", "files/b.csv")
	if v, ok := files.SharedValue(0); !ok || v != "files/*" {
		t.Errorf("files: SharedValue(0) = %q, %v; want files/*, true", v, ok)
	}
	if _, ok := get("route", "/api/1/export").SharedValue(0); ok {
		t.Errorf("route: SharedValue(0) is set without share_threshold")
	}
}

func TestWildcards(t *testing.T) {
	t.Parallel()
	r, err := config.Parse("wild.yaml", []byte(`
domain: d
descriptors:
  - key: k
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k
    value: foobar
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: k
    value: "*bar*baz"
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: k_fo
    value: x
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: n
    value: v
    descriptors:
      - key: w
        value: a*
        rate_limit: {unit: minute, requests_per_unit: 6}
`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		entries []config.KV
		want    uint32 // requests_per_unit of the rule, 0 for none
	}{
		{kvs("k", "foo"), 1},           // '*' matches nothing too
		{kvs("k", "foozzz"), 1},        // trailing wildcard
		{kvs("k", "foobar"), 2},        // an exact value wins over a wildcard
		{kvs("k", "xbarybaz"), 3},      // leading and middle wildcards
		{kvs("k", "barbaz"), 3},        // each '*' may match nothing
		{kvs("k", "bazbar"), 4},        // parts out of order: falls back to the bare key
		{kvs("k", "fo"), 4},            // too short for the pattern
		{kvs("k_fo", "x"), 5},          // an exact key, not a pattern over "key_value"
		{kvs("n", "v", "w", "abc"), 6}, // nested wildcard
		{kvs("n", "v", "w", "bc"), 0},
	}
	for _, tc := range tests {
		rule := config.Lookup(r, "d", tc.entries)
		var got uint32
		if rule != nil {
			got = rule.RequestsPerUnit
		}
		if got != tc.want {
			t.Errorf("Lookup(%v) = rule of %d/unit, want %d", tc.entries, got, tc.want)
		}
	}
}

func TestExtensions(t *testing.T) {
	t.Parallel()
	r, err := config.Parse("ext.yaml", []byte(`
domain: api
algorithm: sliding_window_counter
failure_mode: closed
descriptors:
  - key: default
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: bucket
    rate_limit:
      unit: minute
      requests_per_unit: 60
      algorithm: token_bucket
      burst: 20
      failure_mode: open
      cost: 5
  - key: gcra
    rate_limit: {unit: second, requests_per_unit: 7, algorithm: gcra}
  - key: week
    rate_limit: {unit: week, requests_per_unit: 1000}
`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key      string
		limit    tollgate.Limit
		cost     int
		failMode config.FailureMode
	}{
		{"default", tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 10, Period: time.Second}, 1, config.FailClosed},
		{"bucket", tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 60, Period: time.Minute, Burst: 20}, 5, config.FailOpen},
		{"gcra", tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 7, Period: time.Second, Burst: 7}, 1, config.FailClosed},
		{"week", tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 1000, Period: 7 * 24 * time.Hour}, 1, config.FailClosed},
	}
	for _, tc := range tests {
		rule := config.Lookup(r, "api", kvs(tc.key, "x"))
		if rule == nil {
			t.Errorf("%s: no rule", tc.key)
			continue
		}
		if got, want := rule.Limit, tc.limit; got != want {
			t.Errorf("%s: limit %v, want %v", tc.key, got, want)
		}
		if got, want := rule.Cost, tc.cost; got != want {
			t.Errorf("%s: cost %d, want %d", tc.key, got, want)
		}
		if got, want := rule.FailureMode, tc.failMode; got != want {
			t.Errorf("%s: failure mode %v, want %v", tc.key, got, want)
		}
	}

	// Without a file default, a rule is a fixed window, as in envoy.
	r, err = config.Parse("plain.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := config.Lookup(r, "d", kvs("k", "v")).Limit, (tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 5, Period: 365 * 24 * time.Hour}); got != want {
		t.Errorf("default limit %v, want %v", got, want)
	}
}

func TestErrorsNameFileLineAndColumn(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, yaml, want string
	}{
		{"misspelled key", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unti: 5\n",
			`bad.yaml:6:7: unknown key "requests_per_unti" (did you mean "requests_per_unit"?)`},
		{"unknown top key", "domain: d\nfoo: 1\n", `bad.yaml:2:1: unknown key "foo"`},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n",
			`bad.yaml:4:24: invalid rate limit unit "fortnight"`},
		{"negative rate", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			`bad.yaml:4:51: want a whole number from 0 to 4294967295, found "-1"`},
		{"empty domain", "domain: \"\"\ndescriptors: []\n", `bad.yaml:1:9: domain is missing or empty`},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", `bad.yaml:3:5: descriptor has no key`},
		{"duplicate descriptor", "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
			`bad.yaml:6:12: duplicate descriptor d.k_v (first at line 3)`},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
			`bad.yaml:4:35: should not specify rate limit unit when unlimited`},
		{"replaces self", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: a\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: a}]\n",
			`bad.yaml:8:18: replaces should not contain name of same descriptor`},
		{"replaces empty", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: \"\"}]\n",
			`bad.yaml:7:18: should not have an empty replaces entry`},
		{"not a mapping", "- a\n- b\n", `bad.yaml:1:1: the top of a rules file must be a mapping`},
		{"list of scalars", "domain: d\ndescriptors:\n  - k\n", `bad.yaml:3:5: a descriptor must be a mapping`},
		{"bad yaml", "domain: d\n  descriptors: [\n", `bad.yaml: `},
		{"missing unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n", `bad.yaml:4:17: rate_limit needs a unit`},
		{"missing requests_per_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute}\n", `bad.yaml:4:17: rate_limit needs requests_per_unit`},
		{"burst on a window", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1, burst: 5}\n",
			`bad.yaml:4:54: burst applies to token_bucket, gcra and leaky_bucket, not to fixed_window`},
		{"unknown algorithm", "domain: d\nalgorithm: magic\n", `bad.yaml:2:12: unknown algorithm "magic"`},
		{"bad failure mode", "domain: d\nfailure_mode: ajar\n", `bad.yaml:2:15: failure_mode must be open or closed`},
		{"cost above burst", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 3, cost: 4}\n",
			`bad.yaml:4:96: cost 4 is more than 10/m burst 3 token_bucket can ever admit at once (3)`},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
			`bad.yaml:5:22: share_threshold needs a wildcard value`},
		{"bool as string", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: \"yes\"\n", `bad.yaml:4:18: want true or false, found "yes"`},
		{"empty file", "# nothing\n", `bad.yaml: no domain: the file is empty`},
		{"invalid limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 4000000000, algorithm: sliding_window_counter}\n",
			`bad.yaml:4:17: invalid limit: 4000000000 per 8760h0m0s is too fine`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := config.Parse("bad.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("Parse succeeded, want an error containing %q", tc.want)
			}
			if r != nil {
				t.Errorf("Parse returned rules with its error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error:\n%v\nwant it to contain:\n%s", err, tc.want)
			}
			var e *config.Error
			if !errors.As(err, &e) || e.File != "bad.yaml" {
				t.Errorf("errors.As(*config.Error) = %v, file %q", e, e.File)
			}
		})
	}
}

func TestEveryErrorOfAFileAtOnce(t *testing.T) {
	t.Parallel()
	_, err := config.Parse("bad.yaml", []byte("domain: d\ndescriptors:\n  - key: a\n    shadow: true\n  - key: b\n    rate_limit: {unit: sec, requests_per_unit: 1}\n"))
	var le *config.LoadError
	if !errors.As(err, &le) {
		t.Fatalf("err = %v, want a *config.LoadError", err)
	}
	if got, want := len(le.Errors), 2; got != want {
		t.Errorf("%d errors, want %d:\n%v", got, want, err)
	}
}

func TestLoadDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write("b.yml", "domain: b\n")
	write(".hidden.yaml", "not: valid: yaml: [")
	write("notes.txt", "ignored")
	r := mustLoad(t, dir)
	if got, want := r.Domains(), 2; got != want {
		t.Errorf("Domains() = %d, want %d", got, want)
	}
	if got, want := len(r.Files()), 2; got != want {
		t.Errorf("Files() = %v, want %d files", r.Files(), want)
	}

	write("c.yaml", "domain: a\n")
	_, err := config.Load(dir)
	if err == nil || !strings.Contains(err.Error(), `c.yaml:1:9: domain "a" is already defined at `+filepath.Join(dir, "a.yaml")+":1") {
		t.Errorf("duplicate domain across files: err = %v", err)
	}

	if _, err := config.Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "holds no .yaml or .yml file") {
		t.Errorf("empty directory: err = %v", err)
	}
	if _, err := config.Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Errorf("missing file: no error")
	}
}

func TestSame(t *testing.T) {
	t.Parallel()
	a, _ := config.Parse("f.yaml", []byte("domain: d\n"))
	b, _ := config.Parse("f.yaml", []byte("domain: d\n"))
	c, _ := config.Parse("f.yaml", []byte("domain: e\n"))
	if !a.Same(b) {
		t.Errorf("identical sources: Same = false")
	}
	if a.Same(c) {
		t.Errorf("different sources: Same = true")
	}
}

func TestLookupAllocatesNothing(t *testing.T) {
	r := mustLoad(t, "testdata/envoy")
	entries := kvs("tenant", "acme", "user", "alice")
	allocs := testing.AllocsPerRun(100, func() { config.Lookup(r, "edge", entries) })
	if allocs != 0 {
		t.Errorf("Lookup allocates %v times, want 0", allocs)
	}
}

func BenchmarkLookup(b *testing.B) {
	r, err := config.Load("testdata/envoy")
	if err != nil {
		b.Fatal(err)
	}
	entries := kvs("tenant", "acme", "path", "/trial")
	b.ReportAllocs()
	for b.Loop() {
		config.Lookup(r, "edge", entries)
	}
}

func ExampleLookup() {
	rules, err := config.Parse("edge.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: plan
    value: pro
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 600, algorithm: token_bucket, burst: 50}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range [][]config.KV{
		{{Key: "remote_address", Value: "10.0.0.1"}},
		{{Key: "remote_address", Value: "50.0.0.5"}},
		{{Key: "plan", Value: "pro"}, {Key: "user", Value: "42"}},
		{{Key: "plan", Value: "pro"}},
	} {
		if rule := config.Lookup(rules, "edge", d); rule != nil {
			fmt.Printf("%v: %s, %v\n", d, rule.ID, rule.Limit)
		} else {
			fmt.Printf("%v: no limit\n", d)
		}
	}
	// Output:
	// [{remote_address 10.0.0.1}]: edge.remote_address, 10/s fixed_window
	// [{remote_address 50.0.0.5}]: edge.remote_address_50.0.0.5, 0/s fixed_window
	// [{plan pro} {user 42}]: edge.plan_pro.user, 600/m burst 50 token_bucket
	// [{plan pro}]: no limit
}

func ExampleParse_error() {
	_, err := config.Parse("edge.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10, algoritm: gcra}
`))
	fmt.Println(err)
	// Output:
	// config: edge.yaml:5:55: unknown key "algoritm" (did you mean "algorithm"?); allowed here: unit, requests_per_unit, unlimited, name, replaces, algorithm, burst, failure_mode, cost, rollout, penalty
}

func TestWatch(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte("domain: a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	changed := make(chan struct{}, 10)
	done := make(chan error, 1)
	go func() { done <- config.Watch(ctx, path, 10*time.Millisecond, func() { changed <- struct{}{} }) }()
	// The watch is set up asynchronously: keep writing until it is seen.
	deadline := time.After(5 * time.Second)
	for seen := false; !seen; {
		if err := os.WriteFile(path, []byte("domain: b\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
			seen = true
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("no change seen in 5s")
		}
	}
	// A save by rename, as editors do.
	tmp := filepath.Join(dir, ".rules.yaml.tmp")
	if err := os.WriteFile(tmp, []byte("domain: c\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for len(changed) > 0 {
		<-changed
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("rename not seen in 5s")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Watch returned %v", err)
	}
	if err := config.Watch(context.Background(), filepath.Join(dir, "missing", "x.yaml"), 0, func() {}); err == nil {
		t.Errorf("Watch on a missing path: no error")
	}
}

func TestMetricID(t *testing.T) {
	t.Parallel()
	r, err := config.Parse("m.yaml", []byte(`
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        value: GET
        descriptors:
          - key: user
            rate_limit: {unit: minute, requests_per_unit: 1}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: wild
    value: a*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		entries []config.KV
		want    string
	}{
		{kvs("route", "/a", "method", "GET", "user", "u1"), "d.route_/a.method_GET.user"},
		{kvs("detailed", "x"), "d.detailed_x"},
		{kvs("plain", "x"), "d.plain"},
		{kvs("wild", "abc"), "d.wild_abc"},
	}
	for _, tc := range tests {
		rule := config.Lookup(r, "d", tc.entries)
		if rule == nil {
			t.Fatalf("no rule for %v", tc.entries)
		}
		if got := config.MetricID(rule, tc.entries); got != tc.want {
			t.Errorf("MetricID(%v) = %q, want %q", tc.entries, got, tc.want)
		}
	}
}
