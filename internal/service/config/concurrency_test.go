package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/service/config"
)

func TestConcurrencyRule(t *testing.T) {
	t.Parallel()
	r, err := config.Parse("conc.yaml", []byte(`
domain: llm
descriptors:
  - key: tenant
    concurrency:
      max_in_flight: 5
      lease: 5m
      name: per_tenant_in_flight
      failure_mode: closed
    descriptors:
      - key: model
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: export
    value: csv
    shadow_mode: true
    concurrency: {max_in_flight: 1, lease: 90s}
`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		entries []config.KV
		conc    *config.Concurrency
		name    string
		mode    config.FailureMode
		shadow  bool
	}{
		{kvs("tenant", "acme"), &config.Concurrency{Max: 5, Lease: 5 * time.Minute}, "per_tenant_in_flight", config.FailClosed, false},
		{kvs("export", "csv"), &config.Concurrency{Max: 1, Lease: 90 * time.Second}, "", config.FailDefault, true},
		{kvs("tenant", "acme", "model", "m"), nil, "", config.FailDefault, false}, // a rate rule under it
	}
	for _, tc := range tests {
		rule := config.Lookup(r, "llm", tc.entries)
		if rule == nil {
			t.Fatalf("%v: no rule", tc.entries)
		}
		switch {
		case tc.conc == nil && rule.Concurrency != nil:
			t.Errorf("%v: concurrency %+v, want a rate rule", tc.entries, *rule.Concurrency)
		case tc.conc != nil && (rule.Concurrency == nil || *rule.Concurrency != *tc.conc):
			t.Errorf("%v: concurrency %+v, want %+v", tc.entries, rule.Concurrency, *tc.conc)
		}
		if got, want := rule.Name, tc.name; got != want {
			t.Errorf("%v: name %q, want %q", tc.entries, got, want)
		}
		if got, want := rule.FailureMode, tc.mode; got != want {
			t.Errorf("%v: failure mode %v, want %v", tc.entries, got, want)
		}
		if got, want := rule.DryRun, tc.shadow; got != want {
			t.Errorf("%v: dry run %v, want %v", tc.entries, got, want)
		}
		if got, want := rule.DenyAll(), false; got != want {
			t.Errorf("%v: DenyAll %v, want %v", tc.entries, got, want)
		}
	}

	var b strings.Builder
	if err := r.Dump(&b); err != nil {
		t.Fatal(err)
	}
	want := "llm.export_csv: concurrency max_in_flight=1 lease=1m30s, shadow_mode: true, quota_mode: false\n" +
		"llm.tenant: concurrency max_in_flight=5 lease=5m0s, shadow_mode: false, quota_mode: false\n" +
		"llm.tenant.model: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false\n"
	if got := b.String(); got != want {
		t.Errorf("Dump:\n%s\nwant:\n%s", got, want)
	}
}

func TestConcurrencyRuleErrors(t *testing.T) {
	t.Parallel()
	conc := func(body string) string {
		return "domain: d\ndescriptors:\n  - key: k\n    concurrency: " + body + "\n"
	}
	tests := []struct {
		name, yaml, want string
	}{
		{"no max", conc("{lease: 5m}"), `bad.yaml:4:18: concurrency needs max_in_flight`},
		{"no lease", conc("{max_in_flight: 5}"), `bad.yaml:4:18: concurrency needs a lease`},
		{"max 0", conc("{max_in_flight: 0, lease: 5m}"), `bad.yaml:4:34: max_in_flight must be 1 to 10000, got 0`},
		{"max too large", conc("{max_in_flight: 10001, lease: 5m}"), `bad.yaml:4:34: max_in_flight must be 1 to 10000, got 10001`},
		{"negative max", conc("{max_in_flight: -1, lease: 5m}"), `bad.yaml:4:34: want a whole number`},
		{"lease without unit", conc("{max_in_flight: 5, lease: 300}"), `bad.yaml:4:44: lease "300" is not a duration`},
		{"lease too long", conc("{max_in_flight: 5, lease: 25h}"), `bad.yaml:4:44: lease 25h0m0s: a lease must be 1ms to 24h0m0s`},
		{"lease too short", conc("{max_in_flight: 5, lease: 1us}"), `bad.yaml:4:44: lease 1µs: a lease must be 1ms to 24h0m0s`},
		{"misspelled key", conc("{max_inflight: 5, lease: 5m}"), `bad.yaml:4:19: unknown key "max_inflight" (did you mean "max_in_flight"?)`},
		{"a rate key", conc("{max_in_flight: 5, lease: 5m, unit: second}"), `bad.yaml:4:48: unknown key "unit"`},
		{"not a mapping", conc("5"), `bad.yaml:4:18: concurrency must be a mapping with max_in_flight and lease, found "5"`},
		{"both", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    concurrency: {max_in_flight: 5, lease: 5m}\n",
			`bad.yaml:5:18: a descriptor takes a rate_limit or a concurrency limit, not both (d.k)`},
		{"bad failure mode", conc("{max_in_flight: 5, lease: 5m, failure_mode: ajar}"), `bad.yaml:4:62: failure_mode must be open or closed`},
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
				t.Errorf("errors.As(*config.Error) = %v", e)
			}
		})
	}
}

// TestConcurrencyWordInEnvoyFile: "concurrency" as a descriptor's key or
// value, as an envoy file may use it, is a plain rate rule.
func TestConcurrencyWordInEnvoyFile(t *testing.T) {
	t.Parallel()
	r, err := config.Parse("envoy.yaml", []byte(`
domain: d
descriptors:
  - key: concurrency
    value: lease
    rate_limit: {unit: second, requests_per_unit: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	rule := config.Lookup(r, "d", kvs("concurrency", "lease"))
	if rule == nil || rule.Concurrency != nil || rule.RequestsPerUnit != 3 {
		t.Fatalf("rule %+v, want the rate rule of 3 a second", rule)
	}
}
