package memorystore_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
)

// TestCalendarWindows: a calendar window resets at the zone's local
// midnight, Monday or 1st, and ResetAfter runs to it exactly, across DST
// changes and month ends.
func TestCalendarWindows(t *testing.T) {
	t.Parallel()
	berlin, _ := time.LoadLocation("Europe/Berlin")
	at := func(y int, m time.Month, d, h, min int) time.Time { return time.Date(y, m, d, h, min, 0, 0, berlin) }
	cal := func(alg tollgate.Algorithm, unit string) tollgate.Limit {
		return tollgate.Limit{Algorithm: alg, Rate: 3, Calendar: tollgate.Calendar{Unit: unit, Zone: "Europe/Berlin"}}
	}
	fw := tollgate.FixedWindow
	for _, tc := range []struct {
		name  string
		limit tollgate.Limit
		now   time.Time
		reset time.Time // when the window ends
	}{
		{"a day of 23 hours", cal(fw, "day"), at(2027, 3, 28, 0, 30), at(2027, 3, 29, 0, 0)},
		{"a day of 25 hours", cal(fw, "day"), at(2027, 10, 31, 1, 0), at(2027, 11, 1, 0, 0)},
		{"the last minute of a day", cal(fw, "day"), at(2027, 10, 31, 23, 59), at(2027, 11, 1, 0, 0)},
		{"a week from Monday", cal(fw, "week"), at(2027, 3, 24, 12, 0), at(2027, 3, 29, 0, 0)},
		{"Sunday ends the week", cal(fw, "week"), at(2027, 3, 28, 23, 0), at(2027, 3, 29, 0, 0)},
		{"Monday starts one", cal(fw, "week"), at(2027, 3, 29, 0, 0), at(2027, 4, 5, 0, 0)},
		{"February", cal(fw, "month"), at(2027, 2, 1, 0, 0), at(2027, 3, 1, 0, 0)},
		{"a leap February", cal(fw, "month"), at(2028, 2, 29, 12, 0), at(2028, 3, 1, 0, 0)},
		{"December into January", cal(fw, "month"), at(2026, 12, 1, 0, 0), at(2027, 1, 1, 0, 0)},
		{"a month with a DST change", cal(fw, "month"), at(2027, 10, 2, 0, 0), at(2027, 11, 1, 0, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			now := tc.now
			s := memorystore.New(memorystore.WithClock(func() time.Time { return now }))
			ctx := context.Background()
			res, err := s.AllowN(ctx, "k", tc.limit, 3)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := res.ResetAfter, tc.reset.Sub(tc.now); !res.Allowed || got != want {
				t.Fatalf("first call: allowed %v, ResetAfter %v, want allowed, %v", res.Allowed, got, want)
			}
			now = tc.reset.Add(-time.Microsecond)
			res, err = s.AllowN(ctx, "k", tc.limit, 1)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := res.RetryAfter, time.Microsecond; res.Allowed || got != want {
				t.Errorf("1µs before the end: allowed %v, RetryAfter %v, want denied, %v", res.Allowed, got, want)
			}
			now = tc.reset
			res, err = s.AllowN(ctx, "k", tc.limit, 3)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := res.Remaining, 0; !res.Allowed || got != want {
				t.Errorf("at the end: allowed %v, Remaining %d, want allowed, %d", res.Allowed, got, want)
			}
		})
	}
}

// TestCalendarApart: a calendar window keeps a state of its own, apart from
// the same key's epoch-aligned window and from another zone's or unit's.
func TestCalendarApart(t *testing.T) {
	t.Parallel()
	now := time.Date(2027, 3, 10, 12, 0, 0, 0, time.UTC)
	s := memorystore.New(memorystore.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	cal := func(unit, zone string) tollgate.Limit {
		return tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 2, Calendar: tollgate.Calendar{Unit: unit, Zone: zone}}
	}
	limits := []tollgate.Limit{
		{Algorithm: tollgate.FixedWindow, Rate: 2, Period: 24 * time.Hour},
		cal("day", "UTC"),
		cal("day", "Europe/Berlin"),
		cal("week", "UTC"),
		cal("month", "UTC"),
		{Algorithm: tollgate.SlidingWindowCounter, Rate: 2, Calendar: tollgate.Calendar{Unit: "day", Zone: "UTC"}},
	}
	for _, l := range limits {
		if res, err := s.AllowN(ctx, "k", l, 2); err != nil || !res.Allowed {
			t.Fatalf("%v: %+v, %v: want its own state, admitted", l, res, err)
		}
	}
	for _, l := range limits {
		if res, err := s.AllowN(ctx, "k", l, 1); err != nil || res.Allowed {
			t.Errorf("%v: %+v, %v: want denied, its own 2 spent", l, res, err)
		}
	}
}
