package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/service/config"
)

// envoyNames holds rules shaped as those envoyproxy/ratelimit checks its
// statistics' names against (test/config/config_test.go there: its
// detailed_metric, value_to_metric and share_threshold tests); the names
// expected below are the ones those tests assert.
const envoyNames = `
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 200}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        descriptors:
          - key: type
            rate_limit: {unit: minute, requests_per_unit: 120}
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        share_threshold: true
        descriptors:
          - key: action
            rate_limit: {unit: minute, requests_per_unit: 150}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: midroute
    value: /api*v2
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 80}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60}
---
domain: nested
descriptors:
  - key: key-1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: key-2
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: key_2
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: plain-1
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: plain-2
        rate_limit: {unit: minute, requests_per_unit: 5}
---
domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: route2
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 20}
---
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {unit: minute, requests_per_unit: 1}
`

// TestMetricIDAsEnvoy checks the names metrics report requests under
// against the names envoyproxy/ratelimit gives its statistics.
func TestMetricIDAsEnvoy(t *testing.T) {
	t.Parallel()
	r, err := config.Parse("names.yaml", []byte(envoyNames))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		domain  string
		entries []config.KV
		want    string
	}{
		{"share_threshold", "test-domain", kvs("files", "files/a.pdf"), "test-domain.files_files/*"},
		{"share_threshold nested", "test-domain", kvs("nested", "parent", "files", "nested/file1.txt"), "test-domain.nested_parent.files_nested/*"},
		{"share_threshold twice", "test-domain", kvs("files", "top/file1.txt", "files", "nested/file1.txt"), "test-domain.files_top/*.files_nested/*"},
		{"share_threshold over value_to_metric", "test-domain", kvs("route", "api/v1", "method", "GET"), "test-domain.route_api/*.method"},
		{"share_threshold with detailed_metric", "test-domain", kvs("service", "svc/user", "endpoint", "get"), "test-domain.service_svc/*.endpoint_get"},
		{"share_threshold then plain wildcard", "test-domain", kvs("path", "path/foo", "file", "file/doc1", "type", "pdf"), "test-domain.path_path/*.file_file/*.type"},
		{"share_threshold on two levels", "test-domain", kvs("user", "user/alice", "resource", "res/file1", "action", "read"), "test-domain.user_user/*.resource_res/*.action"},
		{"exact value before shared wildcard", "test-domain", kvs("file", "test1"), "test-domain.file_test1"},
		{"shared wildcard", "test-domain", kvs("file", "test23"), "test-domain.file_test*"},
		{"middle wildcard shared over value_to_metric", "test-domain", kvs("midroute", "/api-beta-v2"), "test-domain.midroute_/api*v2"},
		{"middle wildcards shared with detailed_metric", "test-domain", kvs("tenant", "t99prod", "resource", "resBBBv2"), "test-domain.tenant_t*prod.resource_res*v2"},

		{"detailed_metric, request stops at a parent", "nested", kvs("key-1", "value-1"), "nested.key-1_value-1"},
		{"detailed_metric on both levels", "nested", kvs("key-1", "value-1", "key-2", "value-2"), "nested.key-1_value-1.key-2_value-2"},
		{"no detailed_metric", "nested", kvs("plain-1", "value-1", "plain-2", "value-2"), "nested.plain-1.plain-2"},
		{"detailed_metric at a bare key", "nested", kvs("key_2", "key-2-value"), "nested.key_2_key-2-value"},
		{"detailed_metric under a bare key", "nested", kvs("key_2", "key-2-value", "key_3", "requested-key3-value"), "nested.key_2_key-2-value.key_3_requested-key3-value"},
		// envoy's detailed name joins key and value with '_' whatever
		// the value (config_impl.go, GetLimit: finalKey).
		{"detailed_metric, empty value", "nested", kvs("key-1", ""), "nested.key-1_"},

		{"detailed_metric over value_to_metric", "domain", kvs("route", "draw", "http_method", "GET", "subject_id", "123"), "domain.route_draw.http_method_GET.subject_id_123"},
		{"value_to_metric, empty value", "domain", kvs("route2", "", "http_method", "GET", "subject_id", "123"), "domain.route2.http_method_GET.subject_id"},
		{"value_to_metric with a wildcard", "domain", kvs("user", "alice", "action", "readfile", "resource", "documents"), "domain.user_alice.action_readfile.resource"},
		{"wildcard without flags", "domain", kvs("nestedWild", "val1", "wild", "goose"), "domain.nestedWild_val1.wild_goo*"},
		{"value_to_metric at a middle level", "d", kvs("k1", "X", "k2", "Y", "k3", "Z"), "d.k1.k2_Y.k3"},
		{"value_to_metric, empty values", "domain", kvs("route2", "", "http_method", "", "subject_id", "123"), "domain.route2.http_method.subject_id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rule := config.Lookup(r, tc.domain, tc.entries)
			if rule == nil {
				t.Fatalf("no rule for %v", tc.entries)
			}
			if got, want := config.MetricID(rule, tc.entries), tc.want; got != want {
				t.Errorf("MetricID(%v) = %q, want %q", tc.entries, got, want)
			}
		})
	}
}

// TestOverrideRule checks the rule of a request's own limit: its limit,
// and its metric names as envoyproxy/ratelimit names them
// (TestConfigLimitOverride there).
func TestOverrideRule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		unit       config.Unit
		rpu, mult  uint32
		entries    []config.KV
		wantID     string
		wantLimit  tollgate.Limit
		wantUnlim  bool
		wantDenies bool
	}{
		{"values", config.Day, 10, 0, kvs("key1", "value1", "subkey1", "something"),
			"test-domain.key1_value1.subkey1_something", tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 10, Period: 24 * time.Hour}, false, false},
		{"another value, another name", config.Hour, 42, 1, kvs("key1", "value1", "subkey1", "something_else"),
			"test-domain.key1_value1.subkey1_something_else", tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 42, Period: time.Hour}, false, false},
		{"empty value", config.Second, 5, 0, kvs("key1", "", "subkey1", "x"),
			"test-domain.key1.subkey1_x", tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 5, Period: time.Second}, false, false},
		{"unit multiplier", config.Minute, 7, 5, kvs("k", "v"),
			"test-domain.k_v", tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 7, Period: 5 * time.Minute}, false, false},
		{"zero denies", config.Minute, 0, 0, kvs("k", "v"),
			"test-domain.k_v", tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 0, Period: time.Minute}, false, true},
		{"unknown unit", config.UnitUnknown, 5, 0, kvs("k", "v"),
			"test-domain.k_v", tollgate.Limit{}, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := config.OverrideRule("test-domain", tc.unit, tc.rpu, tc.mult)
			if got, want := config.MetricID(r, tc.entries), tc.wantID; got != want {
				t.Errorf("MetricID = %q, want %q", got, want)
			}
			if got, want := r.Limit, tc.wantLimit; got != want {
				t.Errorf("Limit = %v, want %v", got, want)
			}
			if got, want := r.Unlimited, tc.wantUnlim; got != want {
				t.Errorf("Unlimited = %v, want %v", got, want)
			}
			if got, want := r.DenyAll(), tc.wantDenies; got != want {
				t.Errorf("DenyAll = %v, want %v", got, want)
			}
			if got, want := r.HasValueToMetric(), true; got != want {
				t.Errorf("HasValueToMetric = %v, want %v", got, want)
			}
			if r.DryRun || r.Cost != 1 || r.Domain != "test-domain" {
				t.Errorf("DryRun %v, Cost %d, Domain %q: want false, 1, test-domain", r.DryRun, r.Cost, r.Domain)
			}
		})
	}
	// A multiplier past what a period can hold is refused, not wrapped.
	if err := config.OverrideRule("d", config.Year, 1, 1<<32-1).Limit.Validate(); err == nil {
		t.Errorf("a year × 2^32-1: Validate() = nil, want an error")
	}
}

// TestMergeDomains loads two files of one domain, with and without
// WithMergeDomains (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
func TestMergeDomains(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	one := write("one.yaml", `domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: wild
    value: a*
    rate_limit: {unit: minute, requests_per_unit: 30}
`)
	write("two.yaml", `domain: test-domain
descriptors:
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: wild
    value: ab*
    rate_limit: {unit: minute, requests_per_unit: 40}
---
domain: other
`)
	r, err := config.Load(dir, config.WithMergeDomains())
	if err != nil {
		t.Fatalf("Load with WithMergeDomains: %v", err)
	}
	if got, want := r.Domains(), 2; got != want {
		t.Errorf("Domains() = %d, want %d", got, want)
	}
	for _, tc := range []struct {
		entries []config.KV
		want    uint32 // requests_per_unit of the rule found
		wantID  string
	}{
		{kvs("key1", "value1"), 10, "test-domain.key1_value1"},
		{kvs("key2", "value2"), 20, "test-domain.key2_value2"},
		// Wildcards keep file order across the files: the first file's
		// a* is tried before the second's ab*.
		{kvs("wild", "abc"), 30, "test-domain.wild_a*"},
	} {
		rule := config.Lookup(r, "test-domain", tc.entries)
		if rule == nil {
			t.Errorf("Lookup(%v) = nil, want the rule of %d", tc.entries, tc.want)
			continue
		}
		if got, want := rule.RequestsPerUnit, tc.want; got != want {
			t.Errorf("Lookup(%v).RequestsPerUnit = %d, want %d", tc.entries, got, want)
		}
		if got, want := rule.ID, tc.wantID; got != want {
			t.Errorf("Lookup(%v).ID = %q, want %q", tc.entries, got, want)
		}
	}
	for i, rule := range r.All() {
		if rule.Index != i {
			t.Errorf("All()[%d].Index = %d", i, rule.Index)
		}
	}

	// Without the option, a domain in two files is an error, as before.
	if _, err := config.Load(dir); err == nil || !strings.Contains(err.Error(), `domain "test-domain" is already defined at `+one+":1") {
		t.Errorf("Load without WithMergeDomains: err = %v, want the duplicate domain", err)
	}

	// A descriptor of the top level in both files is an error even when
	// merging: envoyproxy/ratelimit merges the top level only, and refuses
	// a key (and value) defined twice there.
	write("three.yml", `domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: sub
        rate_limit: {unit: second, requests_per_unit: 1}
`)
	_, err = config.Load(dir, config.WithMergeDomains())
	if want := filepath.Join(dir, "three.yml") + `:4:12: duplicate descriptor test-domain.key1_value1 (first at ` + one + `:3)`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a key in two files: err = %v, want %s", err, want)
	}
}

// TestDump checks the rules as /rlconfig shows them against
// testdata/dump/rlconfig.txt: envoyproxy/ratelimit's format
// ((*rateLimitConfigImpl).Dump), one line per rate_limit, in a fixed order.
func TestDump(t *testing.T) {
	t.Parallel()
	r := mustLoad(t, "testdata/dump/rules.yaml")
	want, err := os.ReadFile("testdata/dump/rlconfig.txt")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // the same every time, unlike map order
		var b strings.Builder
		if err := r.Dump(&b); err != nil {
			t.Fatalf("Dump: %v", err)
		}
		if got, want := b.String(), string(want); got != want {
			t.Fatalf("Dump #%d:\n%s\nwant:\n%s", i, got, want)
		}
	}
	var empty strings.Builder
	if err := (*config.Rules)(nil).Dump(&empty); err != nil || empty.Len() != 0 {
		t.Errorf("nil Rules: Dump wrote %q, %v; want nothing", empty.String(), err)
	}
}

// tree makes the files and symlinks of layout under a new directory:
// "name" is a file holding one domain named after it, "name -> target" a
// symlink, "name/" a directory.
func tree(t *testing.T, layout ...string) string {
	t.Helper()
	dir := t.TempDir()
	for i, l := range layout {
		if name, target, ok := strings.Cut(l, " -> "); ok {
			if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		p := filepath.Join(dir, l)
		if strings.HasSuffix(l, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		body := fmt.Sprintf("domain: d%d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", i, i+1)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// configMap is the layout of a Kubernetes ConfigMap volume: the files are
// symlinks through ..data, itself a symlink to a timestamped directory.
var configMap = []string{
	"..2026_12_01_09_00_00.000000001/",
	"..2026_12_01_09_00_00.000000001/rules.yaml",
	"..2026_12_01_09_00_00.000000001/limits.yml",
	"..data -> ..2026_12_01_09_00_00.000000001",
	"rules.yaml -> ..data/rules.yaml",
	"limits.yml -> ..data/limits.yml",
}

// TestLoadPicksFilesAsEnvoy checks which files a directory's rules come
// from: tollgate's own choice, and envoyproxy/ratelimit's runtime
// (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, read by
// goruntime) with RUNTIME_IGNOREDOTFILES true (WithRuntimeTree) and false,
// its default (WithRuntimeTree and WithDotFiles).
func TestLoadPicksFilesAsEnvoy(t *testing.T) {
	t.Parallel()
	plain := []string{
		"a.yaml",
		"notes.yml.txt",
		"rules",
		".hidden.yaml",
		"team/",
		"team/b.conf",
		"team/deeper/",
		"team/deeper/c.yaml",
		".git/",
		".git/d.yaml",
		"link-to-team -> team",
		"link-to-a.yaml -> a.yaml.orig",
		"a.yaml.orig/",
		"dangling.yaml -> missing.yaml",
	}
	tests := []struct {
		name   string
		layout []string
		opts   []config.Option
		want   []string // the files loaded, relative to the directory
		err    string   // or the error
	}{
		{"tollgate: *.yaml and *.yml at the top", plain, nil,
			[]string{"a.yaml"}, ""},
		{"tollgate with dotfiles", plain, []config.Option{config.WithDotFiles()},
			[]string{".hidden.yaml", "a.yaml"}, ""},
		{"envoy ignoring dotfiles: every file of the tree", plain, []config.Option{config.WithRuntimeTree()},
			[]string{"a.yaml", "notes.yml.txt", "rules", "team/b.conf", "team/deeper/c.yaml"}, ""},
		{"envoy by default: dotfiles too", plain, []config.Option{config.WithRuntimeTree(), config.WithDotFiles()},
			[]string{".git/d.yaml", ".hidden.yaml", "a.yaml", "notes.yml.txt", "rules", "team/b.conf", "team/deeper/c.yaml"}, ""},

		{"tollgate: ConfigMap", configMap, nil,
			[]string{"limits.yml", "rules.yaml"}, ""},
		{"envoy ignoring dotfiles: ConfigMap", configMap, []config.Option{config.WithRuntimeTree()},
			[]string{"limits.yml", "rules.yaml"}, ""},
		// goruntime walks into the timestamped directory and reads each
		// file twice, once there and once through its symlink: the domain
		// is defined twice, which envoyproxy/ratelimit refuses too.
		{"envoy by default: ConfigMap", configMap, []config.Option{config.WithRuntimeTree(), config.WithDotFiles()},
			nil, `domain "d1" is already defined at `},
		{"envoy by default, merging: ConfigMap", configMap, []config.Option{config.WithRuntimeTree(), config.WithDotFiles(), config.WithMergeDomains()},
			nil, `duplicate descriptor d1.k (first at `},

		{"envoy: an empty tree", []string{"empty/", ".hidden.yaml"}, []config.Option{config.WithRuntimeTree()},
			nil, "holds no file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := tree(t, tc.layout...)
			r, err := config.Load(dir, tc.opts...)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Load: err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			var got []string
			for _, f := range r.Files() {
				rel, err := filepath.Rel(dir, f)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, filepath.ToSlash(rel))
			}
			if got, want := strings.Join(got, " "), strings.Join(tc.want, " "); got != want {
				t.Errorf("Files() = %s, want %s", got, want)
			}
		})
	}
}

// TestFromEnv reads envoyproxy/ratelimit's variables (its settings.go and
// file provider) into a path and options.
func TestFromEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		path string
		opts string // the options, as optionNames names them
		err  string
	}{
		{"defaults", map[string]string{"RUNTIME_SUBDIRECTORY": "ratelimit"},
			"/srv/runtime_data/current/ratelimit/config", "tree dotfiles", ""},
		{"all set", map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "rl", "RUNTIME_APPDIRECTORY": "rules",
			"RUNTIME_IGNOREDOTFILES": "true", "MERGE_DOMAIN_CONFIG": "true", "RUNTIME_WATCH_ROOT": "false"},
			"/data/rl/rules", "tree merge", ""},
		{"no subdirectory, root not watched", map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "1"},
			"/data/config", "tree", ""},
		{"no subdirectory", map[string]string{"RUNTIME_ROOT": "/data"},
			"", "", "RUNTIME_SUBDIRECTORY is empty"},
		{"bad boolean", map[string]string{"RUNTIME_SUBDIRECTORY": "rl", "MERGE_DOMAIN_CONFIG": "yes"},
			"", "", `MERGE_DOMAIN_CONFIG="yes"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path, opts, err := config.FromEnv(func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("FromEnv: err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("FromEnv: %v", err)
			}
			if got, want := path, filepath.FromSlash(tc.path); got != want {
				t.Errorf("path = %q, want %q", got, want)
			}
			if got, want := optionNames(t, opts), tc.opts; got != want {
				t.Errorf("options = %q, want %q", got, want)
			}
		})
	}
}

// optionNames tells which of WithRuntimeTree, WithDotFiles and
// WithMergeDomains opts hold, by what Load does with them on three
// directories.
func optionNames(t *testing.T, opts []config.Option) string {
	t.Helper()
	var names []string
	// tree tells a domain from a file name; every file here is a new one.
	if r, err := config.Load(tree(t, "top.yaml", "sub/", "sub/nested.yaml"), opts...); err != nil {
		t.Fatal(err)
	} else if len(r.Files()) == 2 {
		names = append(names, "tree")
	}
	if r, err := config.Load(tree(t, "top.yaml", ".dot.yaml"), opts...); err != nil {
		t.Fatal(err)
	} else if len(r.Files()) == 2 {
		names = append(names, "dotfiles")
	}
	same := t.TempDir()
	for _, f := range []string{"one.yaml", "two.yaml"} {
		if err := os.WriteFile(filepath.Join(same, f), []byte("domain: same\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := config.Load(same, opts...); err == nil {
		names = append(names, "merge")
	}
	return strings.Join(names, " ")
}

// TestRuntimeTreeIsBounded checks that walking a tree stops at the limits:
// MaxFiles files, MaxFiles directories, 16 levels.
func TestRuntimeTreeIsBounded(t *testing.T) {
	t.Parallel()
	deep := []string{}
	p := ""
	for range 18 {
		p += "d/"
		deep = append(deep, p)
	}
	tests := []struct {
		name     string
		layout   []string
		maxFiles int
		err      string
	}{
		{"files", []string{"a", "b/", "b/c", "b/d"}, 2, "more than the limit of 2 files"},
		{"directories", []string{"a/", "b/", "c/", "c/x"}, 2, "more than the limit of 2 directories"},
		{"depth", deep, 100, "nested deeper than 16 levels"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			limits := config.Limits{MaxFiles: tc.maxFiles}
			_, err := config.Load(tree(t, tc.layout...), config.WithRuntimeTree(), config.WithLimits(limits))
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Load: err = %v, want one containing %q", err, tc.err)
			}
		})
	}
}
