package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/service/config"
)

// warningsOf parses data as the file w.yaml and returns its warnings as
// "line:col: message", or the error of a file that does not load.
func warningsOf(t *testing.T, data string) []string {
	t.Helper()
	var got []string
	_, err := config.Parse("w.yaml", []byte(data), config.WithWarnings(func(w config.Warning) {
		if w.File != "w.yaml" {
			t.Errorf("warning %v names file %q, want w.yaml", w, w.File)
		}
		got = append(got, fmt.Sprintf("%d:%d: %s", w.Line, w.Column, w.Msg))
	}))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return got
}

// TestWarnings: rules that load but are likely not what was meant are
// reported at the line and column to change; the rules meant as written
// are not.
func TestWarnings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		file string
		want []string // "line:col: " and the start of each message, in order
	}{
		{"unlimited with requests_per_unit", `domain: d
descriptors:
  - key: internal
    rate_limit:
      unlimited: true
      requests_per_unit: 100
`, []string{"6:7: requests_per_unit 100 is ignored: unlimited: true"}},
		{"a million a second", `domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000}
`, []string{"4:32: 1000000 per second is more than 100000 requests a second"}},
		{"the same rate per minute", `domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 60000000}
`, []string{"4:32: 60000000 per minute is more than 100000 requests a second"}},
		{"less than one a day", `domain: d
descriptors:
  - key: user
    rate_limit: {unit: month, requests_per_unit: 20}
`, []string{"4:31: 20 per month is less than one request a day"}},
		{"zero for every value", `domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 0}
`, []string{`4:32: requests_per_unit 0 denies every request with key "remote_address"`}},
		{"zero nested under keys without values", `domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 0}
`, []string{`6:36: requests_per_unit 0 denies every request with keys "tenant", "path"`}},
		{"wildcard after a wider one", `domain: d
descriptors:
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /api/v2/*
    rate_limit: {unit: second, requests_per_unit: 5}
`, []string{`7:12: value "/api/v2/*" is shadowed by "/api/*" (line 4)`}},
		{"wildcard after a catch-all", `domain: d
descriptors:
  - key: path
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: "*.css"
    rate_limit: {unit: second, requests_per_unit: 5}
`, []string{`7:12: value "*.css" is shadowed by "*" (line 4)`}},
		{"middle wildcards", `domain: d
descriptors:
  - key: path
    value: /a*/z
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /ab*c*/z
    rate_limit: {unit: second, requests_per_unit: 5}
`, []string{`7:12: value "/ab*c*/z" is shadowed by "/a*/z" (line 4)`}},
		{"no value after a catch-all", `domain: d
descriptors:
  - key: path
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 5}
`, []string{`6:10: descriptor d.path, without a value, is never reached: the wildcard "*" (line 4)`}},
		{"no value before a catch-all", `domain: d
descriptors:
  - key: path
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: "**"
    rate_limit: {unit: second, requests_per_unit: 10}
`, []string{`3:10: descriptor d.path, without a value, is never reached: the wildcard "**" (line 6)`}},
		{"shadowed deeper down", `domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: path
        value: /a*
        rate_limit: {unit: second, requests_per_unit: 10}
      - key: path
        value: /ab
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: path
        value: /ab*
        rate_limit: {unit: second, requests_per_unit: 5}
`, []string{`12:16: value "/ab*" is shadowed by "/a*" (line 6)`}},
		{"several at once, in file order", `domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 2000000}
  - key: b
    rate_limit: {unit: year, requests_per_unit: 12}
`, []string{"4:32: 2000000 per second", "6:30: 12 per year"}},

		// Meant as written: no warning.
		{"a block list names a value", `domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    value: evil
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 0}
  - key: bot
    value: "crawler*"
    rate_limit: {unit: second, requests_per_unit: 0}
`, nil},
		{"narrow wildcard first", `domain: d
descriptors:
  - key: path
    value: /api/v2/*
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /api/v2/export
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: other
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 100}
`, nil},
		{"wildcards that overlap but neither holds the other", `domain: d
descriptors:
  - key: f
    value: "a*"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: f
    value: "*b"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: f
    value: "a*c*"
    rate_limit: {unit: second, requests_per_unit: 5}
`, []string{`10:12: value "a*c*" is shadowed by "a*" (line 4)`}},
		{"edges of the rate thresholds", `domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 100000}
  - key: b
    rate_limit: {unit: week, requests_per_unit: 7}
  - key: c
    rate_limit: {unit: year, requests_per_unit: 365}
  - key: d
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: e
    rate_limit: {unlimited: true}
`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := warningsOf(t, tc.file)
			if len(got) != len(tc.want) {
				t.Fatalf("warnings:\n%s\nwant %d:\n%s", strings.Join(got, "\n"), len(tc.want), strings.Join(tc.want, "\n"))
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("warning %d = %q, want it to start with %q", i, got[i], w)
				}
			}
		})
	}
}

// TestWarningsAcrossMergedFiles: with WithMergeDomains the top of a domain
// spans files, and so does what shadows what; the warning names the file
// of the wider pattern.
func TestWarningsAcrossMergedFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeRules(t, filepath.Join(dir, "a.yaml"), `domain: d
descriptors:
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 10}
`)
	writeRules(t, filepath.Join(dir, "b.yaml"), `domain: d
descriptors:
  - key: path
    value: /api/v1/*
    rate_limit: {unit: second, requests_per_unit: 10}
`)
	var got []config.Warning
	if _, err := config.Load(dir, config.WithMergeDomains(), config.WithWarnings(func(w config.Warning) { got = append(got, w) })); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("warnings %v, want one", got)
	}
	w := got[0]
	if w.File != filepath.Join(dir, "b.yaml") || w.Line != 4 || w.Column != 12 {
		t.Errorf("warning at %s:%d:%d, want b.yaml:4:12", w.File, w.Line, w.Column)
	}
	if want := fmt.Sprintf(`is shadowed by "/api/*" (%s:4)`, filepath.Join(dir, "a.yaml")); !strings.Contains(w.Msg, want) {
		t.Errorf("message %q, want it to contain %q", w.Msg, want)
	}
	if s, want := w.String(), fmt.Sprintf("%s:4:12: value", filepath.Join(dir, "b.yaml")); !strings.HasPrefix(s, want) {
		t.Errorf("String() = %q, want it to start with %q", s, want)
	}
}

// TestNoWarningsForEnvoysFiles: files written for envoyproxy/ratelimit,
// as its documentation writes them, warn of nothing.
func TestNoWarningsForEnvoysFiles(t *testing.T) {
	t.Parallel()
	var got []config.Warning
	if _, err := config.Load("testdata/envoy", config.WithWarnings(func(w config.Warning) { got = append(got, w) })); err != nil {
		t.Fatal(err)
	}
	for _, w := range got {
		t.Errorf("warning: %v", w)
	}
}

// TestWarningsOfAFileWithErrors: the warnings of the rules that are valid
// come with the errors of those that are not.
func TestWarningsOfAFileWithErrors(t *testing.T) {
	t.Parallel()
	var got []string
	_, err := config.Parse("e.yaml", []byte(`domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 5000000}
  - key: b
    rate_limit: {unit: fortnight, requests_per_unit: 10}
`), config.WithWarnings(func(w config.Warning) { got = append(got, w.String()) }))
	if err == nil || !strings.Contains(err.Error(), "e.yaml:6:") {
		t.Fatalf("err = %v, want the unit at e.yaml:6", err)
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], "e.yaml:4:32: 5000000 per second") {
		t.Errorf("warnings %q, want the one of line 4", got)
	}
}

func writeRules(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
