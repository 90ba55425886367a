package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// checkCase is one run of tollgate check on a directory of small rules
// files: the files (by name), the arguments ({dir} is the directory), and
// what the run must exit with and print on stdout, line by line ({dir}
// again).
type checkCase struct {
	name  string
	files map[string]string
	args  []string
	code  int
	// out lists every line of stdout, each a prefix of the line printed;
	// err is a part of stderr.
	out []string
	err string
}

// runCheckBinary runs the tollgate binary's check as a user would and
// returns its exit code, stdout and stderr.
func runCheckBinary(t *testing.T, dir string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(tollgateBinary(t), append([]string{"check"}, args...)...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errb.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), out.String(), errb.String()
	}
	t.Fatal(err)
	return 0, "", ""
}

const validRules = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
  - key: remote_address
    value: 203.0.113.7
    rate_limit: {unit: second, requests_per_unit: 0}
`

// planRules have a descriptor of three limits and one of one.
const planRules = `domain: api
descriptors:
  - key: plan
    value: free
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: day, requests_per_unit: 100}
      - {unit: second, requests_per_unit: 20, algorithm: token_bucket, name: burst}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 50}
`

func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []checkCase{
		{name: "valid file", files: map[string]string{"r.yaml": validRules}, args: []string{"r.yaml"},
			out: []string{"r.yaml: 1 file, 1 domain, 2 rules: valid"}},
		{name: "valid directory, flags after the path", files: map[string]string{"rules/a.yaml": validRules, "rules/notes.txt": "not rules"},
			args: []string{"rules", "--strict"}, out: []string{"rules: 1 file, 1 domain, 2 rules: valid"}},
		{name: "--config as serve takes it", files: map[string]string{"r.yaml": validRules}, args: []string{"--config", "r.yaml"},
			out: []string{"r.yaml: 1 file, 1 domain, 2 rules: valid"}},
		{name: "invalid: file, line and column of each error", files: map[string]string{"r.yaml": `domain: edge
descriptors:
  - key: remote_address
    rate_limt: {unit: second, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: fortnight, requests_per_unit: 10}
`}, args: []string{"r.yaml"}, code: 1, out: []string{
			`r.yaml:4:5: error: unknown key "rate_limt" (did you mean "rate_limit"?)`,
			`r.yaml:6:24: error: invalid rate limit unit "fortnight"`,
			"r.yaml: invalid: 2 errors"}},
		{name: "a duplicate key at one level is an error", files: map[string]string{"r.yaml": `domain: edge
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
`}, args: []string{"r.yaml"}, code: 1, out: []string{
			"r.yaml:5:10: error: duplicate descriptor edge.user (first at line 3)", "r.yaml: invalid: 1 error"}},
		{name: "YAML syntax: the line the parser gives", files: map[string]string{"r.yaml": "domain: edge\ndescriptors: [\n"},
			args: []string{"r.yaml"}, code: 1, out: []string{"r.yaml:2: error: did not find expected node content", "r.yaml: invalid: 1 error"}},
		{name: "no such path", args: []string{"nope.yaml"}, code: 1,
			out: []string{"nope.yaml: error: stat nope.yaml: no such file or directory", "nope.yaml: invalid: 1 error"}},
		{name: "several paths, each loaded alone", files: map[string]string{"a/r.yaml": validRules, "b/r.yaml": validRules},
			args: []string{"a", "b"}, out: []string{"a: 1 file, 1 domain, 2 rules: valid", "b: 1 file, 1 domain, 2 rules: valid"}},

		// envoy's layout: a directory of files, one domain across them.
		{name: "a domain in two files", files: envoyLayout, args: []string{"config"}, code: 1, out: []string{
			`config/b.yaml:1:9: error: domain "edge" is already defined at config/a.yaml:1`, "config: invalid: 1 error"}},
		{name: "a domain in two files, --merge-domains", files: envoyLayout, args: []string{"--merge-domains", "config"},
			out: []string{"config: 2 files, 1 domain, 2 rules: valid"}},
		{name: "--runtime-tree reads every file under it", files: map[string]string{"config/a.yaml": validRules, "config/sub/rules": strings.Replace(validRules, "edge", "inner", 1)},
			args: []string{"--runtime-tree", "config"}, out: []string{"config: 2 files, 2 domains, 4 rules: valid"}},
		{name: "serve's bounds", files: envoyLayout, args: []string{"--merge-domains", "--rules-max-files", "1", "config"}, code: 1,
			out: []string{"config: error: config holds more than the limit of 1 .yaml and .yml files", "config: invalid: 1 error"}},

		// Each warning: exit 0 (1 with --strict).
		{name: "warning: shadowed wildcard", files: map[string]string{"r.yaml": `domain: edge
descriptors:
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /api/v2/*
    rate_limit: {unit: second, requests_per_unit: 1}
`}, args: []string{"r.yaml"}, out: []string{
			`r.yaml:7:12: warning: value "/api/v2/*" is shadowed by "/api/*" (line 4)`, "r.yaml: 1 file, 1 domain, 2 rules: valid, 1 warning"}},
		{name: "warning: a key without a value beside a catch-all", files: map[string]string{"r.yaml": `domain: edge
descriptors:
  - key: path
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 1}
`}, args: []string{"r.yaml"}, out: []string{
			`r.yaml:3:10: warning: descriptor edge.path, without a value, is never reached: the wildcard "*" (line 6)`, "r.yaml: 1 file, 1 domain, 2 rules: valid, 1 warning"}},
		{name: "warning: unlimited with a limit", files: map[string]string{"r.yaml": `domain: edge
descriptors:
  - key: internal
    rate_limit: {unlimited: true, requests_per_unit: 100}
`}, args: []string{"r.yaml"}, out: []string{
			"r.yaml:4:35: warning: requests_per_unit 100 is ignored: unlimited: true", "r.yaml: 1 file, 1 domain, 1 rule: valid, 1 warning"}},
		{name: "warning: a million a second", files: map[string]string{"r.yaml": `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000}
`}, args: []string{"r.yaml"}, out: []string{
			"r.yaml:4:32: warning: 1000000 per second is more than 100000 requests a second", "r.yaml: 1 file, 1 domain, 1 rule: valid, 1 warning"}},
		{name: "warning: less than one a day", files: map[string]string{"r.yaml": `domain: edge
descriptors:
  - key: user
    rate_limit: {unit: year, requests_per_unit: 100}
`}, args: []string{"r.yaml"}, out: []string{
			"r.yaml:4:30: warning: 100 per year is less than one request a day", "r.yaml: 1 file, 1 domain, 1 rule: valid, 1 warning"}},
		{name: "warning: zero for every value", files: map[string]string{"r.yaml": `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 0}
`}, args: []string{"r.yaml"}, out: []string{
			`r.yaml:4:32: warning: requests_per_unit 0 denies every request with key "remote_address", whatever its value`, "r.yaml: 1 file, 1 domain, 1 rule: valid, 1 warning"}},
		{name: "--strict: a warning fails", files: map[string]string{"r.yaml": `domain: edge
descriptors:
  - key: user
    rate_limit: {unit: year, requests_per_unit: 100}
`}, args: []string{"--strict", "r.yaml"}, code: 1, out: []string{
			"r.yaml:4:30: warning: 100 per year", "r.yaml: 1 file, 1 domain, 1 rule: valid, 1 warning"}},
		{name: "warnings of valid rules beside errors", files: map[string]string{"r.yaml": `domain: edge
descriptors:
  - key: user
    rate_limit: {unit: year, requests_per_unit: 100}
  - key: path
    rate_limit: {unit: second}
`}, args: []string{"r.yaml"}, code: 1, out: []string{
			"r.yaml:4:30: warning: 100 per year", "r.yaml:6:17: error: rate_limit needs requests_per_unit", "r.yaml: invalid: 1 error, 1 warning"}},

		{name: "a plan of several limits", files: map[string]string{"r.yaml": planRules}, args: []string{"r.yaml"},
			out: []string{"r.yaml: 1 file, 1 domain, 2 rules (4 limits): valid"}},
		{name: "--dump: a line per limit", files: map[string]string{"r.yaml": planRules, "bad.yaml": "domain: x\nfoo: 1\n"}, args: []string{"--dump", "r.yaml", "bad.yaml"}, code: 1,
			out: []string{`bad.yaml:2:1: error: unknown key "foo"`, "r.yaml: 1 file, 1 domain, 2 rules (4 limits): valid",
				"api.ip: unit=MINUTE requests_per_unit=50, shadow_mode: false, quota_mode: false",
				"api.plan_free.second: unit=SECOND requests_per_unit=2, shadow_mode: false, quota_mode: false, set: api.plan_free",
				"api.plan_free.day: unit=DAY requests_per_unit=100, shadow_mode: false, quota_mode: false, set: api.plan_free",
				"api.plan_free.burst: unit=SECOND requests_per_unit=20, shadow_mode: false, quota_mode: false, set: api.plan_free",
				"bad.yaml: invalid: 1 error"}},
		{name: "a plan refused", files: map[string]string{"r.yaml": "domain: api\ndescriptors:\n  - key: plan\n    rate_limits:\n      - {unit: second, requests_per_unit: 2}\n      - {unit: second, requests_per_unit: 5}\n"},
			args: []string{"r.yaml"}, code: 1, out: []string{
				"r.yaml:6:9: error: limit 2 (5 per second, line 6) would share one counter with limit 1 (2 per second, line 5): both count fixed_window per second; give them different algorithms or units",
				"r.yaml: invalid: 1 error"}},

		// Usage errors: exit 2, nothing on stdout.
		{name: "usage: --dump with --json", args: []string{"--dump", "--json", "r.yaml"}, code: 2, err: "--dump prints the rules as text: leave out --json"},
		{name: "usage: no path", code: 2, err: "tollgate check: no rules to check"},
		{name: "usage: unknown flag", args: []string{"--strit", "r.yaml"}, code: 2, err: "unknown flag --strit (did you mean --strict?)"},
		{name: "usage: a bound of 0", args: []string{"--rules-max-files", "0", "r.yaml"}, code: 2, err: "--rules-max-files 0: want a positive number"},
		{name: "usage: a flag without its value", args: []string{"r.yaml", "--config"}, code: 2, err: "flag needs an argument: --config"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for name, data := range tc.files {
				writeRulesFile(t, filepath.Join(dir, name), data)
			}
			code, out, errs := runCheckBinary(t, dir, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, out, errs)
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if out == "" {
				lines = nil
			}
			if len(lines) != len(tc.out) {
				t.Fatalf("stdout has %d lines, want %d:\n%s", len(lines), len(tc.out), out)
			}
			for i, want := range tc.out {
				if !strings.HasPrefix(lines[i], want) {
					t.Errorf("line %d = %q\nwant it to start with %q", i+1, lines[i], want)
				}
			}
			if !strings.Contains(errs, tc.err) {
				t.Errorf("stderr %q, want it to contain %q", errs, tc.err)
			}
		})
	}
}

// envoyLayout is a directory laid out for envoyproxy/ratelimit: two files
// of one domain, which it merges with MERGE_DOMAIN_CONFIG=true.
var envoyLayout = map[string]string{
	"config/a.yaml": "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
	"config/b.yaml": "domain: edge\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 50}\n",
}

// TestCheckJSON: --json prints one object, whose problems carry file, line,
// col, severity and message, with the exit code of the text output.
func TestCheckJSON(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeRulesFile(t, filepath.Join(dir, "rules", "a.yaml"), `domain: edge
descriptors:
  - key: user
    rate_limit: {unit: year, requests_per_unit: 100}
  - key: path
    rate_limit: {unit: second}
`)
	writeRulesFile(t, filepath.Join(dir, "ok.yaml"), validRules)
	tests := []struct {
		name     string
		args     []string
		code     int
		errs     int
		problems []problem
	}{
		{"valid", []string{"--json", "ok.yaml"}, 0, 0, []problem{}},
		{"errors and warnings", []string{"--json", "rules", "ok.yaml"}, 1, 1, []problem{
			{File: "rules/a.yaml", Line: 4, Col: 30, Severity: "warning", Message: "100 per year is less than one request a day; was a shorter unit meant?"},
			{File: "rules/a.yaml", Line: 6, Col: 17, Severity: "error", Message: "rate_limit needs requests_per_unit (0 denies every request)"},
		}},
		{"a path that is not there", []string{"nope", "--json"}, 1, 1, []problem{
			{File: "nope", Severity: "error", Message: "stat nope: no such file or directory"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, errs := runCheckBinary(t, dir, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tc.code, errs)
			}
			var got checkReport
			dec := json.NewDecoder(strings.NewReader(out))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&got); err != nil {
				t.Fatalf("stdout is not check's JSON: %v\n%s", err, out)
			}
			if dec.More() {
				t.Errorf("more than one JSON value on stdout:\n%s", out)
			}
			warns := 0
			for _, p := range tc.problems {
				if p.Severity == "warning" {
					warns++
				}
			}
			if got.Errors != tc.errs || got.Warnings != warns {
				t.Errorf("errors %d, warnings %d; want %d, %d", got.Errors, got.Warnings, tc.errs, warns)
			}
			if len(got.Problems) != len(tc.problems) {
				t.Fatalf("problems %+v\nwant %+v", got.Problems, tc.problems)
			}
			for i, want := range tc.problems {
				if got.Problems[i] != want {
					t.Errorf("problem %d = %+v\nwant %+v", i, got.Problems[i], want)
				}
			}
			// The documented names, as a program reads them.
			var raw map[string]any
			if err := json.Unmarshal([]byte(out), &raw); err != nil {
				t.Fatal(err)
			}
			if _, ok := raw["problems"].([]any); !ok {
				t.Errorf("problems is %T, want a list, even when empty", raw["problems"])
			}
		})
	}
}

// TestCheckExample: the example rules file checks clean, with --strict.
func TestCheckExample(t *testing.T) {
	t.Parallel()
	code, out, errs := runCheckBinary(t, "../..", "--strict", "examples/ratelimit.yaml")
	if code != 0 || !strings.HasPrefix(out, "examples/ratelimit.yaml: 1 file, 1 domain, 7 rules: valid\n") {
		t.Errorf("exit %d:\n%s%s", code, out, errs)
	}
}

// writeRulesFile writes data to path, making its directory.
func writeRulesFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
