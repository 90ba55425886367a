package ruleset_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/ruleset"
)

// TestCheckPoliciesCalendar: two policies share a counter when their
// algorithm, period and calendar are all the same; a calendar month and
// day, or two zones, or a calendar and an epoch window, do not.
func TestCheckPoliciesCalendar(t *testing.T) {
	t.Parallel()
	cal := func(unit, zone string) tollgate.Limit {
		return tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 10, Calendar: tollgate.Calendar{Unit: unit, Zone: zone}}
	}
	epochDay := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 10, Period: 24 * time.Hour}
	for _, tc := range []struct {
		name string
		a, b tollgate.Limit
		want string // in the error; "" for none
	}{
		{"a month and a day", cal("month", "UTC"), cal("day", "UTC"), ""},
		{"two zones", cal("day", "UTC"), cal("day", "Europe/Berlin"), ""},
		{"a calendar day and 24 hours", cal("day", "UTC"), epochDay, ""},
		{"the same calendar", cal("day", "UTC"), cal("day", "UTC"), "would share one counter"},
	} {
		err := ruleset.CheckPolicies([]enforce.Policy{{Name: "a", Limit: tc.a}, {Name: "b", Limit: tc.b}})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want nil", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error about %q", tc.name, err, tc.want)
		}
	}
}
