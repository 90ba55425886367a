package config_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/service/config"
)

const planRules = `domain: api
failure_mode: closed
descriptors:
  - key: plan
    value: free
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: day, requests_per_unit: 100, calendar: UTC}
  - key: plan
    value: pro
    shadow_mode: true
    rate_limits:
      - unit: second
        requests_per_unit: 20
        algorithm: token_bucket
        burst: 40
        name: pro_burst
        cost: 2
        penalty: {for: 1m}
      - unit: second
        requests_per_unit: 20
        cost: 2
      - unit: day
        requests_per_unit: 10000
        cost: 2
        failure_mode: closed
`

// TestRateLimitsParsed: a descriptor's rate_limits is one rule of several
// limits, each named for its statistics after the descriptor's path and
// its name or unit, sharing the set's cost, failure mode, penalty and
// shadow_mode; Dump shows a line per limit.
func TestRateLimitsParsed(t *testing.T) {
	t.Parallel()
	r, err := config.Parse("plans.yaml", []byte(planRules))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(r.All()), 2; got != want {
		t.Fatalf("%d rules, want %d", got, want)
	}
	free := config.Lookup(r, "api", kvs("plan", "free"))
	pro := config.Lookup(r, "api", kvs("plan", "pro"))
	if free == nil || pro == nil {
		t.Fatalf("rules free %v, pro %v", free, pro)
	}
	tests := []struct {
		rule *config.Rule
		want []config.SetLimit
	}{
		{free, []config.SetLimit{
			{ID: "api.plan_free.second", Step: "second", Unit: config.Second, RequestsPerUnit: 2,
				Limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 2, Period: time.Second}, Line: 7, Column: 9},
			{ID: "api.plan_free.day", Step: "day", Unit: config.Day, RequestsPerUnit: 100,
				Limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 100, Calendar: tollgate.Calendar{Unit: "day", Zone: "UTC"}}, Line: 8, Column: 9},
		}},
		{pro, []config.SetLimit{
			{ID: "api.plan_pro.pro_burst", Step: "pro_burst", Name: "pro_burst", Unit: config.Second, RequestsPerUnit: 20,
				Limit: tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 20, Period: time.Second, Burst: 40}, Line: 13, Column: 9},
			{ID: "api.plan_pro.second", Step: "second", Unit: config.Second, RequestsPerUnit: 20,
				Limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 20, Period: time.Second}, Line: 20, Column: 9},
			{ID: "api.plan_pro.day", Step: "day", Unit: config.Day, RequestsPerUnit: 10000,
				Limit: tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 10000, Period: 24 * time.Hour}, Line: 23, Column: 9},
		}},
	}
	for _, tc := range tests {
		if got, want := fmt.Sprintf("%+v", tc.rule.Set), fmt.Sprintf("%+v", tc.want); got != want {
			t.Errorf("%s: Set\n got %s\nwant %s", tc.rule.ID, got, want)
		}
		for i, l := range tc.rule.SetLimits() {
			if l != tc.want[i].Limit {
				t.Errorf("%s: SetLimits()[%d] = %v, want %v", tc.rule.ID, i, l, tc.want[i].Limit)
			}
		}
		if tc.rule.DenyAll() || tc.rule.Unlimited || tc.rule.Limit != (tollgate.Limit{}) || tc.rule.Rollout != nil {
			t.Errorf("%s: DenyAll %v Unlimited %v Limit %v Rollout %v: want none of a rule of one limit's",
				tc.rule.ID, tc.rule.DenyAll(), tc.rule.Unlimited, tc.rule.Limit, tc.rule.Rollout)
		}
	}
	if free.Cost != 1 || free.FailureMode != config.FailClosed || free.Penalty != nil || free.DryRun {
		t.Errorf("free: cost %d, failure mode %v, penalty %v, dry run %v; want 1, closed (the file's), none, false",
			free.Cost, free.FailureMode, free.Penalty, free.DryRun)
	}
	if pro.Cost != 2 || pro.Penalty == nil || pro.Penalty.For != time.Minute || pro.PenaltyLimit != 0 || !pro.DryRun {
		t.Errorf("pro: cost %d, penalty %v of limit %d, dry run %v; want 2, 1m of limit 0, true", pro.Cost, pro.Penalty, pro.PenaltyLimit, pro.DryRun)
	}
	if !pro.Named("pro_burst") || pro.Named("second") || pro.Named("") {
		t.Errorf("pro: Named(pro_burst) %v, Named(second) %v, Named(\"\") %v; want true, false, false",
			pro.Named("pro_burst"), pro.Named("second"), pro.Named(""))
	}

	var b strings.Builder
	if err := r.Dump(&b); err != nil {
		t.Fatal(err)
	}
	want := "api.plan_free.second: unit=SECOND requests_per_unit=2, shadow_mode: false, quota_mode: false, set: api.plan_free\n" +
		"api.plan_free.day: unit=DAY requests_per_unit=100, shadow_mode: false, quota_mode: false, set: api.plan_free\n" +
		"api.plan_pro.pro_burst: unit=SECOND requests_per_unit=20, shadow_mode: true, quota_mode: false, set: api.plan_pro\n" +
		"api.plan_pro.second: unit=SECOND requests_per_unit=20, shadow_mode: true, quota_mode: false, set: api.plan_pro\n" +
		"api.plan_pro.day: unit=DAY requests_per_unit=10000, shadow_mode: true, quota_mode: false, set: api.plan_pro\n"
	if got := b.String(); got != want {
		t.Errorf("Dump:\n%s\nwant:\n%s", got, want)
	}
}

// TestRateLimitsErrors: every set refused, with its message at the line
// and column of what to change.
func TestRateLimitsErrors(t *testing.T) {
	t.Parallel()
	// set is a descriptor d.k with rate_limits, one limit a line from
	// line 5, each at column 9.
	set := func(limits ...string) string {
		s := "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n"
		for _, l := range limits {
			s += "      - " + l + "\n"
		}
		return s
	}
	sec := "{unit: second, requests_per_unit: 10}"
	day := "{unit: day, requests_per_unit: 1000}"
	many := make([]string, 17)
	for i := range many {
		many[i] = fmt.Sprintf("{unit: second, requests_per_unit: 1, name: l%d}", i)
	}
	tests := []struct {
		name, yaml, want string
	}{
		{"empty list", "domain: d\ndescriptors:\n  - key: k\n    rate_limits: []\n",
			"bad.yaml:4:18: rate_limits needs 2 to 16 limits, found 0 (a single limit is a rate_limit)"},
		{"one limit", set(sec),
			"bad.yaml:5:7: rate_limits needs 2 to 16 limits, found 1 (a single limit is a rate_limit)"},
		{"more than 16", set(many...),
			"bad.yaml:21:9: rate_limits holds 17 limits, more than the 16 one descriptor may have"},
		{"not a list", "domain: d\ndescriptors:\n  - key: k\n    rate_limits: {unit: second, requests_per_unit: 1}\n",
			"bad.yaml:4:18: rate_limits must be a list of 2 to 16 rate_limit mappings, found a mapping"},
		{"a limit not a mapping", set(sec, "5"),
			`bad.yaml:6:9: a limit of rate_limits must be a mapping with unit and requests_per_unit, found "5"`},
		{"with rate_limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + sec + "\n    rate_limits:\n      - " + sec + "\n      - " + day + "\n",
			"bad.yaml:5:5: a descriptor takes rate_limit or rate_limits, not both (d.k): put every limit in rate_limits"},
		{"with concurrency", "domain: d\ndescriptors:\n  - key: k\n    concurrency: {max_in_flight: 1, lease: 1m}\n    rate_limits:\n      - " + sec + "\n      - " + day + "\n",
			"bad.yaml:5:5: a descriptor takes rate_limits or a concurrency limit, not both (d.k)"},
		{"one counter", set(sec, day, "{unit: second, requests_per_unit: 5}"),
			"bad.yaml:7:9: limit 3 (5 per second, line 7) would share one counter with limit 1 (10 per second, line 5): both count fixed_window per second; give them different algorithms or units"},
		{"one counter, named", set("{unit: minute, requests_per_unit: 5, algorithm: gcra, name: a}", "{unit: minute, requests_per_unit: 9, algorithm: gcra, name: b}"),
			`bad.yaml:6:9: limit 2 ("b", 9 per minute, line 6) would share one counter with limit 1 ("a", 5 per minute, line 5): both count gcra per minute; give them different algorithms or units`},
		{"one calendar counter", set("{unit: day, requests_per_unit: 5, calendar: Europe/Berlin}", "{unit: day, requests_per_unit: 50, calendar: Europe/Berlin, name: b}"),
			`bad.yaml:6:9: limit 2 ("b", 50 per day, line 6) would share one counter with limit 1 (5 per day, line 5): both count fixed_window per calendar day in Europe/Berlin; give them different algorithms or units`},
		{"one name", set(sec, "{unit: second, requests_per_unit: 10, algorithm: token_bucket}"),
			`bad.yaml:6:9: limit 1 (10 per second, line 5) and limit 2 (10 per second, line 6) would both be named "second" in statistics and RateLimit-Policy: give one of them a name`},
		{"a name repeated", set("{unit: second, requests_per_unit: 10, name: x}", "{unit: day, requests_per_unit: 10, name: x}"),
			`bad.yaml:6:44: name "x" repeated in rate_limits (first at line 5)`},
		{"unlimited", set(sec, "{unlimited: true}"),
			"bad.yaml:6:10: unlimited: true has no place in rate_limits: a request is as limited as the least of a set's limits (for a descriptor without a limit, write rate_limit: {unlimited: true})"},
		{"0 per unit", set(sec, "{unit: day, requests_per_unit: 0}"),
			"bad.yaml:6:21: requests_per_unit 0 in rate_limits denies every request whatever the other limits say: write it as a rate_limit of its own"},
		{"rollout", set(sec, "{unit: day, requests_per_unit: 10, rollout: {requests_per_unit: 5}}"),
			"bad.yaml:6:44: rollout is not supported in rate_limits: a rollout changes the limit of a rule of one limit (rate_limit)"},
		{"replaces", set(sec, "{unit: day, requests_per_unit: 10, replaces: [{name: x}]}"),
			"bad.yaml:6:44: replaces is not supported in rate_limits (a replaces of another rule that names a limit of the set drops the whole set)"},
		{"costs differ", set("{unit: second, requests_per_unit: 10, cost: 2}", day),
			"bad.yaml:6:9: cost 1 here, but 2 for limit 1 (10 per second, line 5): a request spends one cost under every limit of rate_limits, so every limit must have the same cost"},
		{"failure modes differ", set(sec, "{unit: day, requests_per_unit: 10, failure_mode: open}"),
			"bad.yaml:6:44: failure_mode open here, but left to the server for limit 1 (10 per second, line 5): the limits of rate_limits are decided by one store call and fail as one, so every limit must have the same failure_mode"},
		{"two penalties", set("{unit: second, requests_per_unit: 10, penalty: {for: 1m}}", "{unit: day, requests_per_unit: 10, penalty: {for: 1h}}"),
			"bad.yaml:6:44: only one limit of rate_limits may have a penalty (another is at line 5): its denials start it, and while it runs the whole set is denied"},
		{"a limit's own error", set(sec, "{unit: fortnight, requests_per_unit: 10}"),
			`bad.yaml:6:16: invalid rate limit unit "fortnight" (want second, minute, hour, day, week, month or year)`},
		{"a cost over a limit", set("{unit: second, requests_per_unit: 10, cost: 20}", "{unit: day, requests_per_unit: 1000, cost: 20}"),
			"bad.yaml:5:53: cost 20 is more than 10/s fixed_window can ever admit at once (10)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := config.Parse("bad.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("Parse succeeded, want the error %q", tc.want)
			}
			if r != nil {
				t.Errorf("Parse returned rules with its error")
			}
			if got, want := err.Error(), "config: "+tc.want; got != want {
				t.Errorf("error:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// TestRateLimitsCountAsDescriptors: each limit of a set counts towards
// MaxDescriptors, as a descriptor of its own would.
func TestRateLimitsCountAsDescriptors(t *testing.T) {
	t.Parallel()
	rules := "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n" +
		"      - {unit: second, requests_per_unit: 10}\n      - {unit: minute, requests_per_unit: 100}\n      - {unit: hour, requests_per_unit: 1000}\n"
	if _, err := config.Parse("f.yaml", []byte(rules), config.WithLimits(config.Limits{MaxDescriptors: 3})); err != nil {
		t.Errorf("3 limits under a bound of 3: %v", err)
	}
	_, err := config.Parse("f.yaml", []byte(rules), config.WithLimits(config.Limits{MaxDescriptors: 2}))
	if want := "config: f.yaml:5:7: more than the limit of 2 descriptors (each limit of rate_limits counts as one)"; err == nil || err.Error() != want {
		t.Errorf("3 limits under a bound of 2: %v, want %s", err, want)
	}
}

// TestRateLimitsWarnings: each limit of a set is warned about as a
// rate_limit is.
func TestRateLimitsWarnings(t *testing.T) {
	t.Parallel()
	got := warningsOf(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n"+
		"      - {unit: second, requests_per_unit: 1000000}\n      - {unit: year, requests_per_unit: 100}\n")
	want := []string{
		"5:24: 1000000 per second is more than 100000 requests a second for one counter: one Redis core decides about that many for every key together, so no client reaches it; was a longer unit meant?",
		"6:22: 100 per year is less than one request a day; was a shorter unit meant?",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
