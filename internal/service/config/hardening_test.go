package config_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/service/config"
)

// aliasBomb returns a rules file whose descriptors double at each of levels
// levels through aliases: a few hundred bytes that name 2^levels rules once
// expanded. Its first alias is on line 9.
func aliasBomb(levels int) string {
	var b strings.Builder
	b.WriteString("domain: bomb\ndescriptors:\n")
	b.WriteString("  - key: l0\n    descriptors: &l0\n")
	b.WriteString("      - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	b.WriteString("      - {key: b, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	for i := 1; i <= levels; i++ {
		fmt.Fprintf(&b, "  - key: l%d\n    descriptors: &l%d\n", i, i)
		fmt.Fprintf(&b, "      - {key: a, descriptors: *l%d}\n", i-1)
		fmt.Fprintf(&b, "      - {key: b, descriptors: *l%d}\n", i-1)
	}
	return b.String()
}

// descriptorChain returns a rules file whose descriptors nest depth levels
// deep, with a rule at the bottom.
func descriptorChain(depth int) string {
	var b strings.Builder
	b.WriteString("domain: deep\ndescriptors:\n")
	indent := "  "
	for i := 0; i < depth; i++ {
		fmt.Fprintf(&b, "%s- key: k%d\n", indent, i)
		if i == depth-1 {
			fmt.Fprintf(&b, "%s  rate_limit: {unit: second, requests_per_unit: 1}\n", indent)
			break
		}
		fmt.Fprintf(&b, "%s  descriptors:\n", indent)
		indent += "    "
	}
	return b.String()
}

// TestHostileFilesAreRefused feeds Parse files built to make the loader
// spend without bound, and wants each refused by the default limits with an
// error that names the file and the line to look at.
func TestHostileFilesAreRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, yaml, want string
	}{
		{"alias bomb", aliasBomb(16), `bomb.yaml:57:31: alias *l12 expands past the limit of 250000 YAML nodes`},
		{"recursive alias", "domain: loop\ndescriptors: &d\n  - key: k\n    descriptors: *d\n", `bomb.yaml:4:18: alias *d expands past the limit of`},
		{"too deep", descriptorChain(17), `bomb.yaml:35:67: descriptors nested deeper than 16 levels`},
		{"long key", "domain: d\ndescriptors:\n  - key: " + strings.Repeat("k", 1025) + "\n", `bomb.yaml:3:10: 1025 bytes, more than the limit of 1024`},
		{"long value", "domain: d\ndescriptors:\n  - key: k\n    value: " + strings.Repeat("v", 5000) + "\n", `bomb.yaml:4:12: 5000 bytes, more than the limit of 1024`},
		{"long domain", "domain: " + strings.Repeat("d", 2000) + "\n", `bomb.yaml:1:9: 2000 bytes, more than the limit of 1024`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := config.Parse("bomb.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("Parse succeeded with %d rules, want an error containing %q", len(r.All()), tc.want)
			}
			if got := err.Error(); !strings.Contains(got, tc.want) {
				t.Errorf("error:\n%s\nwant it to contain:\n%s", got, tc.want)
			}
			var e *config.Error
			if !errors.As(err, &e) || e.File != "bomb.yaml" {
				t.Errorf("errors.As(*config.Error) = %v, want one naming bomb.yaml", e)
			}
		})
	}
}

// TestHostileDirectoriesAreRefused checks the limits Load applies before it
// parses anything: the size of a file and the number of files.
func TestHostileDirectoriesAreRefused(t *testing.T) {
	t.Parallel()
	rule := "domain: %s\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"big file", map[string]string{"big.yaml": fmt.Sprintf(rule, "big") + "# " + strings.Repeat("x", 1<<20) + "\n"},
			`big.yaml: the file is larger than the limit of 1048576 bytes`},
		{"many files", func() map[string]string {
			m := map[string]string{}
			for i := range 257 {
				name := fmt.Sprintf("f%03d.yaml", i)
				m[name] = fmt.Sprintf(rule, name)
			}
			return m
		}(), `holds more than the limit of 256 .yaml and .yml files`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for name, body := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			r, err := config.Load(dir)
			if err == nil {
				t.Fatalf("Load succeeded with %d files, want an error containing %q", len(r.Files()), tc.want)
			}
			if got := err.Error(); !strings.Contains(got, tc.want) {
				t.Errorf("error:\n%s\nwant it to contain:\n%s", got, tc.want)
			}
		})
	}
}

// TestAliasesWithinLimits checks that anchors and aliases, which
// envoyproxy/ratelimit's YAML reader accepts, keep working for what they
// are used for: one rate_limit or one list of descriptors written once and
// used in several places.
func TestAliasesWithinLimits(t *testing.T) {
	t.Parallel()
	r, err := config.Parse("shared.yaml", []byte(`
domain: shared
descriptors:
  - key: plan
    value: free
    rate_limit: &slow {unit: minute, requests_per_unit: 10}
    descriptors: &per_user
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: plan
    value: trial
    rate_limit: *slow
    descriptors: *per_user
  - &gold
    key: plan
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 1000}
`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		entries []config.KV
		want    string
	}{
		{kvs("plan", "free"), "10/m"},
		{kvs("plan", "trial"), "10/m"},
		{kvs("plan", "trial", "user", "u"), "1/s"},
		{kvs("plan", "gold"), "1000/m"},
	}
	for _, tc := range tests {
		rule := config.Lookup(r, "shared", tc.entries)
		if rule == nil {
			t.Errorf("Lookup(%v) = nil, want %s", tc.entries, tc.want)
			continue
		}
		if got := fmt.Sprintf("%d/%s", rule.RequestsPerUnit, rule.Unit.String()[:1]); got != tc.want {
			t.Errorf("Lookup(%v) = %s, want %s", tc.entries, got, tc.want)
		}
	}
}

// TestWithLimits lowers each limit in turn and wants a file just over it
// refused, and the same file loaded under the defaults.
func TestWithLimits(t *testing.T) {
	t.Parallel()
	three := "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n  - key: c\n"
	tests := []struct {
		name   string
		limits config.Limits
		want   string
	}{
		{"file size", config.Limits{MaxFileSize: 20}, `f.yaml: the file is larger than the limit of 20 bytes`},
		{"total size", config.Limits{MaxTotalSize: 80}, `the files of`},
		{"files", config.Limits{MaxFiles: 1}, `holds more than the limit of 1 .yaml and .yml files`},
		{"nodes", config.Limits{MaxNodes: 10}, `f.yaml:5:7: the file holds more than the limit of 10 YAML nodes`},
		{"scalar bytes", config.Limits{MaxScalarBytes: 30}, `f.yaml:4:5: the file holds more than the limit of 30 bytes of keys and values`},
		{"depth", config.Limits{MaxDepth: 1}, `f.yaml:5:7: descriptors nested deeper than 1 levels`},
		{"descriptors", config.Limits{MaxDescriptors: 2}, `f.yaml:6:5: more than the limit of 2 descriptors`},
		{"value length", config.Limits{MaxValueLen: 5}, `g.yaml:1:9: 6 bytes, more than the limit of 5 for a domain, key, value or name`},
	}
	dir := t.TempDir()
	for name, body := range map[string]string{"f.yaml": three, "g.yaml": "domain: second\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := config.Load(dir); err != nil {
		t.Fatalf("under the default limits: %v", err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load(dir, config.WithLimits(tc.limits))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load(%+v) = %v, want an error containing %q", tc.limits, err, tc.want)
			}
		})
	}
}

// TestLoadRefusesSpecialFiles wants a FIFO named like a rules file
// refused at once rather than waited on, which would stall every reload.
func TestLoadRefusesSpecialFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "rules.yaml")
	if err := mkfifo(fifo); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(dir); err == nil || !strings.Contains(err.Error(), "rules.yaml: not a regular file") {
		t.Errorf("Load(FIFO) = %v, want not a regular file", err)
	}
}
