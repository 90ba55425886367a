package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/service/config"
)

// TestCalendar: a rate_limit's calendar makes its day, week or month the
// zone's calendar one; month without it keeps envoy's 30 days.
func TestCalendar(t *testing.T) {
	t.Parallel()
	r, err := config.Parse("cal.yaml", []byte(`
domain: billing
descriptors:
  - key: plan
    value: free
    rate_limit: {unit: month, requests_per_unit: 10000, calendar: Europe/Berlin}
  - key: plan
    value: daily
    rate_limit: {unit: DAY, requests_per_unit: 500, calendar: America/New_York, algorithm: sliding_window_counter}
  - key: plan
    value: weekly
    rate_limit:
      unit: week
      requests_per_unit: 2000
      calendar: UTC
      rollout: {requests_per_unit: 3000, percent: 10}
  - key: plan
    value: envoy
    rate_limit: {unit: month, requests_per_unit: 10000}
`))
	if err != nil {
		t.Fatal(err)
	}
	cal := func(alg tollgate.Algorithm, rate int, unit, zone string) tollgate.Limit {
		return tollgate.Limit{Algorithm: alg, Rate: rate, Calendar: tollgate.Calendar{Unit: unit, Zone: zone}}
	}
	for _, tc := range []struct {
		value string
		limit tollgate.Limit
		unit  config.Unit
	}{
		{"free", cal(tollgate.FixedWindow, 10000, "month", "Europe/Berlin"), config.Month},
		{"daily", cal(tollgate.SlidingWindowCounter, 500, "day", "America/New_York"), config.Day},
		{"weekly", cal(tollgate.FixedWindow, 2000, "week", "UTC"), config.Week},
		{"envoy", tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 10000, Period: 30 * 24 * time.Hour}, config.Month},
	} {
		rule := config.Lookup(r, "billing", kvs("plan", tc.value))
		if rule == nil {
			t.Errorf("%s: no rule", tc.value)
			continue
		}
		if got, want := rule.Limit, tc.limit; got != want {
			t.Errorf("%s: limit %v, want %v", tc.value, got, want)
		}
		if got, want := rule.Unit, tc.unit; got != want {
			t.Errorf("%s: unit %v, want %v", tc.value, got, want)
		}
	}
	weekly := config.Lookup(r, "billing", kvs("plan", "weekly"))
	if got, want := weekly.Rollout.Limit, cal(tollgate.FixedWindow, 3000, "week", "UTC"); got != want {
		t.Errorf("rollout's limit %v, want %v", got, want)
	}
}

func TestCalendarErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, rate, want string }{
		{"an hour", "{unit: hour, requests_per_unit: 5, calendar: UTC}", "4:52: calendar applies to the units day, week and month, not hour"},
		{"a year", "{unit: year, requests_per_unit: 5, calendar: UTC}", "calendar applies to the units day, week and month, not year"},
		{"an unknown zone", "{unit: day, requests_per_unit: 5, calendar: Europe/Atlantis}", `4:17: invalid limit: unknown time zone "Europe/Atlantis"`},
		{"the machine's zone", "{unit: day, requests_per_unit: 5, calendar: Local}", `time zone "Local" is the machine's`},
		{"an empty zone", `{unit: day, requests_per_unit: 5, calendar: ""}`, "4:61: calendar must name a time zone"},
		{"not a string", "{unit: day, requests_per_unit: 5, calendar: [UTC]}", "4:61: want a string"},
		{"a bucket", "{unit: day, requests_per_unit: 5, calendar: UTC, algorithm: token_bucket}", "a calendar applies only to fixed_window and sliding_window_counter, not to token_bucket"},
		{"an unknown zone, 0 requests", "{unit: day, requests_per_unit: 0, calendar: Europe/Atlantis}", `4:51: unknown time zone "Europe/Atlantis"`},
		{"unlimited", "{unlimited: true, calendar: UTC}", "an unlimited rate_limit takes no algorithm, burst, cost or calendar"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse("bad.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: "+tc.rate+"\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error:\n%v\nwant it to contain:\n%s", err, tc.want)
			}
		})
	}
}
