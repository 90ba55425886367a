package tollgate_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// berlinMonth is a fixed window of 10,000 per calendar month in Berlin.
var berlinMonth = tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 10_000, Calendar: tollgate.Calendar{Unit: "month", Zone: "Europe/Berlin"}}

func TestCalendarValidate(t *testing.T) {
	t.Parallel()
	cal := func(alg tollgate.Algorithm, rate int, unit, zone string) tollgate.Limit {
		return tollgate.Limit{Algorithm: alg, Rate: rate, Calendar: tollgate.Calendar{Unit: unit, Zone: zone}}
	}
	fw, swc := tollgate.FixedWindow, tollgate.SlidingWindowCounter
	for _, tc := range []struct {
		name  string
		limit tollgate.Limit
		want  string // "" for valid, else a part of the error
	}{
		{"fixed month", berlinMonth, ""},
		{"sliding day", cal(swc, 1000, "day", "America/New_York"), ""},
		{"sliding week in UTC", cal(swc, 1000, "week", "UTC"), ""},
		{"sliding month at its bound", cal(swc, 814_453_057, "month", "Europe/Berlin"), ""},
		{"sliding month above its bound", cal(swc, 814_453_058, "month", "Europe/Berlin"), "too fine"},
		{"fixed month, a large rate", cal(fw, 1<<52, "month", "Asia/Tokyo"), ""},
		{"unknown unit", cal(fw, 10, "year", "UTC"), `unknown calendar unit "year"`},
		{"unit in capitals", cal(fw, 10, "Month", "UTC"), `unknown calendar unit "Month"`},
		{"no unit", cal(fw, 10, "", "UTC"), `unknown calendar unit ""`},
		{"no zone", cal(fw, 10, "day", ""), "needs a time zone"},
		{"the machine's zone", cal(fw, 10, "day", "Local"), `"Local" is the machine's`},
		{"unknown zone", cal(fw, 10, "day", "Mars/Olympus_Mons"), `unknown time zone "Mars/Olympus_Mons"`},
		{"a path for a zone", cal(fw, 10, "day", "../../etc/passwd"), "unknown time zone"},
		{"a long zone", cal(fw, 10, "day", strings.Repeat("A", 65)), "at most 64"},
		{"token bucket", cal(tollgate.TokenBucket, 10, "day", "UTC"), "applies only to fixed_window and sliding_window_counter"},
		{"gcra", cal(tollgate.GCRA, 10, "day", "UTC"), "applies only to fixed_window and sliding_window_counter"},
		{"leaky bucket", cal(tollgate.LeakyBucket, 10, "day", "UTC"), "applies only to fixed_window and sliding_window_counter"},
		{"sliding log", cal(tollgate.SlidingWindowLog, 10, "day", "UTC"), "applies only to fixed_window and sliding_window_counter"},
		{"with a period", tollgate.Limit{Algorithm: fw, Rate: 10, Period: 24 * time.Hour, Calendar: tollgate.Calendar{Unit: "day", Zone: "UTC"}}, "leave Period 0"},
		{"zero rate", cal(fw, 0, "day", "UTC"), "rate must be"},
	} {
		err := tc.limit.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v.Validate() = %v, want nil", tc.name, tc.limit, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v.Validate() = %v, want an error containing %q", tc.name, tc.limit, err, tc.want)
		case err != nil && !errors.Is(err, tollgate.ErrInvalidLimit):
			t.Errorf("%s: error %v does not wrap ErrInvalidLimit", tc.name, err)
		}
	}
}

func TestCalendarString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		limit tollgate.Limit
		want  string
	}{
		{berlinMonth, "10000/month Europe/Berlin fixed_window"},
		{tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 5, Calendar: tollgate.Calendar{Unit: "day", Zone: "UTC"}}, "5/day UTC sliding_window_counter"},
	} {
		if got := tc.limit.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

// TestCalendarCapacity: a calendar window admits Rate at once, as any window.
func TestCalendarCapacity(t *testing.T) {
	t.Parallel()
	if got, want := berlinMonth.Capacity(), 10_000; got != want {
		t.Errorf("Capacity() = %d, want %d", got, want)
	}
}
