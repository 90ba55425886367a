package calendar

import (
	"strings"
	"testing"
	"time"
)

// TestWindow: the windows around an instant, where midnight is skipped
// (Santiago), comes twice (Havana), or a whole day is (Apia, 2011).
func TestWindow(t *testing.T) {
	t.Parallel()
	utc := func(s string) int64 {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMicro()
	}
	for _, tc := range []struct {
		unit, zone, at string
		want           [5]string // Prev, Start, End, Next, After
	}{
		{"day", "Europe/Berlin", "2027-03-28T12:00:00+02:00", [5]string{"2027-03-27T00:00:00+01:00", "2027-03-28T00:00:00+01:00", "2027-03-29T00:00:00+02:00", "2027-03-30T00:00:00+02:00", "2027-03-31T00:00:00+02:00"}},
		// Clocks go from 24:00 to 01:00: Sunday starts at 01:00.
		{"day", "America/Santiago", "2027-09-05T12:00:00-03:00", [5]string{"2027-09-04T00:00:00-04:00", "2027-09-05T01:00:00-03:00", "2027-09-06T00:00:00-03:00", "2027-09-07T00:00:00-03:00", "2027-09-08T00:00:00-03:00"}},
		// From 01:00 back to 00:00: Sunday starts at the first midnight.
		{"day", "America/Havana", "2027-11-07T12:00:00-05:00", [5]string{"2027-11-06T00:00:00-04:00", "2027-11-07T00:00:00-04:00", "2027-11-08T00:00:00-05:00", "2027-11-09T00:00:00-05:00", "2027-11-10T00:00:00-05:00"}},
		// 30 December 2011 never happened in Samoa.
		{"day", "Pacific/Apia", "2011-12-31T12:00:00+14:00", [5]string{"2011-12-29T00:00:00-10:00", "2011-12-31T00:00:00+14:00", "2012-01-01T00:00:00+14:00", "2012-01-02T00:00:00+14:00", "2012-01-03T00:00:00+14:00"}},
		{"week", "Europe/Berlin", "2027-03-28T23:59:59+02:00", [5]string{"2027-03-15T00:00:00+01:00", "2027-03-22T00:00:00+01:00", "2027-03-29T00:00:00+02:00", "2027-04-05T00:00:00+02:00", "2027-04-12T00:00:00+02:00"}},
		{"month", "Europe/Berlin", "2028-02-29T22:59:59Z", [5]string{"2028-01-01T00:00:00+01:00", "2028-02-01T00:00:00+01:00", "2028-03-01T00:00:00+01:00", "2028-04-01T00:00:00+02:00", "2028-05-01T00:00:00+02:00"}},
		{"month", "UTC", "2026-12-31T23:59:59Z", [5]string{"2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z"}},
	} {
		s, err := Lookup(tc.unit, tc.zone)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.Window(utc(tc.at))
		if err != nil {
			t.Fatal(err)
		}
		want := Span{utc(tc.want[0]), utc(tc.want[1]), utc(tc.want[2]), utc(tc.want[3]), utc(tc.want[4])}
		if got != want {
			t.Errorf("%s %s at %s: got %v, want %v", tc.unit, tc.zone, tc.at, got, want)
		}
	}
}

func TestLookup(t *testing.T) {
	t.Parallel()
	a, err := Lookup("month", "Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Lookup("month", "Europe/Berlin")
	c, _ := Lookup("day", "Europe/Berlin")
	if a != b || a == c || a.ID == c.ID {
		t.Errorf("Lookup: %p %p %p (IDs %d %d): want one Spec a pair, each its own ID", a, b, c, a.ID, c.ID)
	}
	for _, tc := range []struct{ unit, zone, want string }{
		{"fortnight", "UTC", "unknown calendar unit"},
		{"day", "", "needs a time zone"},
		{"day", "Local", "Local"},
		{"day", "Europe/Nowhere", "unknown time zone"},
		{"day", "Europe/../UTC", "unknown time zone"},
		{"day", strings.Repeat("x", MaxZoneLen+1), "at most 64"},
	} {
		if _, err := Lookup(tc.unit, tc.zone); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Lookup(%q, %q) = %v, want an error containing %q", tc.unit, tc.zone, err, tc.want)
		}
	}
}
