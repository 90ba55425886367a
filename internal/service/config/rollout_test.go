package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/service/config"
)

func TestRolloutParsed(t *testing.T) {
	t.Parallel()
	rules, err := config.Parse("r.yaml", []byte(`domain: edge
descriptors:
  - key: tenant
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
      algorithm: token_bucket
      burst: 150
      rollout:
        requests_per_unit: 60
        percent: 12.5
        from: 2027-01-01T00:00:00Z
        until: 2027-02-01T00:00:00+01:00
        shadow: true
  - key: plan
    rate_limit:
      unit: hour
      requests_per_unit: 10
      algorithm: gcra
      rollout: {requests_per_unit: 20}
`))
	if err != nil {
		t.Fatal(err)
	}
	all := rules.All()
	tenant, plan := all[0], all[1]
	ro := tenant.Rollout
	if ro == nil || tenant.Rolled == nil {
		t.Fatalf("tenant: Rollout %v, Rolled %v", ro, tenant.Rolled)
	}
	from := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	until := time.Date(2027, 1, 31, 23, 0, 0, 0, time.UTC)
	if ro.Percent != 12.5 || !ro.From.Equal(from) || !ro.Until.Equal(until) || !ro.Shadow {
		t.Errorf("tenant's rollout = %+v", ro)
	}
	// The rule's own burst stays: the rollout changed the rate.
	want := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 60, Period: time.Minute, Burst: 150}
	if got := tenant.Rolled.Limit; got != want || ro.Limit != want {
		t.Errorf("rolled limit %v (rollout %v), want %v", got, ro.Limit, want)
	}
	if r := tenant.Rolled; r.RequestsPerUnit != 60 || r.ID != tenant.ID || r.Index != tenant.Index || !r.DryRun || r.Rollout != nil || r.Line != tenant.Line {
		t.Errorf("Rolled = %+v, want the rule with 60 per unit", r)
	}
	// A bucket without a burst of its own: the burst follows the rate.
	want = tollgate.Limit{Algorithm: tollgate.GCRA, Rate: 20, Period: time.Hour, Burst: 20}
	if plan.Rollout == nil || plan.Rollout.Percent != 100 || plan.Rolled.Limit != want {
		t.Errorf("plan: rollout %+v, want 100%% of the keys at %v", plan.Rollout, want)
	}
	if tenant.Limit.Rate != 100 || tenant.RequestsPerUnit != 100 {
		t.Errorf("the rule itself changed: %v", tenant.Limit)
	}
}

func TestRolloutErrors(t *testing.T) {
	t.Parallel()
	head := "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n"
	tests := []struct{ name, rollout, want string }{
		{"percent above 100", "      rollout: {requests_per_unit: 5, percent: 120}\n", "r.yaml:7:48: percent must be a number above 0 and at most 100"},
		{"percent 0", "      rollout: {requests_per_unit: 5, percent: 0}\n", "r.yaml:7:48: percent must be a number above 0"},
		{"not a time", "      rollout: {requests_per_unit: 5, from: tomorrow}\n", `r.yaml:7:45: want an RFC 3339 time with its offset, such as 2027-01-01T00:00:00Z, found "tomorrow"`},
		{"no offset", "      rollout: {requests_per_unit: 5, from: \"2027-01-01 00:00\"}\n", `r.yaml:7:45: want an RFC 3339 time`},
		{"nothing changes", "      rollout: {percent: 10}\n", "r.yaml:7:16: a rollout needs a new requests_per_unit or burst"},
		{"until before from", "      rollout: {requests_per_unit: 5, from: 2027-02-01T00:00:00Z, until: 2027-01-01T00:00:00Z}\n", "r.yaml:7:16: until must come after from"},
		{"burst on a window", "      rollout: {burst: 5}\n", "r.yaml:7:17: burst applies to token_bucket, gcra and leaky_bucket"},
		{"unknown key", "      rollout: {requests_per_unit: 5, unit: hour}\n", `r.yaml:7:39: unknown key "unit"`},
		{"zero rate", "      rollout: {requests_per_unit: 0}\n", "r.yaml:7:36: a rollout's requests_per_unit must be at least 1"},
		{"not a mapping", "      rollout: 60\n", "r.yaml:7:16: rollout must be a mapping"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Parse("r.yaml", []byte(head+tc.rollout))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error:\n%v\nwant it to contain:\n%s", err, tc.want)
			}
		})
	}
	_, err := config.Parse("r.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, rollout: {requests_per_unit: 5}}\n"))
	if want := "a rollout changes a limit"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("unlimited with a rollout: %v, want %q", err, want)
	}
}

func TestPenaltyParsed(t *testing.T) {
	t.Parallel()
	rules, err := config.Parse("p.yaml", []byte("domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5, penalty: {for: 15m, after: 5, within: 10m}}\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5, penalty: {for: 30s}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	user, ip := rules.All()[0].Penalty, rules.All()[1].Penalty
	if user == nil || user.For != 15*time.Minute || user.After != 5 || user.Within != 10*time.Minute {
		t.Errorf("user's penalty %+v", user)
	}
	if ip == nil || ip.For != 30*time.Second || ip.After != 0 {
		t.Errorf("ip's penalty %+v", ip)
	}
	head := "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n"
	tests := []struct{ name, penalty, want string }{
		{"no for", "      penalty: {after: 3, within: 1m}\n", "p.yaml:7:16: for must be positive"},
		{"bad duration", "      penalty: {for: soon}\n", `p.yaml:7:22: want a positive duration such as 90s, 15m or 1h30m, found "soon"`},
		{"after without within", "      penalty: {for: 1m, after: 3}\n", "p.yaml:7:16: after 3 denials needs within"},
		{"after 0", "      penalty: {for: 1m, after: 0}\n", "p.yaml:7:33: after must be at least 1"},
		{"unknown key", "      penalty: {for: 1m, during: 1h}\n", `p.yaml:7:26: unknown key "during"`},
	}
	for _, tc := range tests {
		_, err := config.Parse("p.yaml", []byte(head+tc.penalty))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error\n%v\nwant it to contain\n%s", tc.name, err, tc.want)
		}
	}
}
