package rollout_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/internal/door/rollout"
)

// TestRolloutShareIsStable: a 10% canary covers 8 to 12% of 10,000 keys,
// and widening it only adds keys.
func TestShareIsStable(t *testing.T) {
	t.Parallel()
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("api:header=X-Api-Key:key-%d", i)
	}
	prev := map[string]bool{}
	for _, pct := range []float64{1, 10, 25, 50, 100} {
		r := enforce.Rollout{Limit: tollgate.PerMinute(1), Percent: pct}
		in := map[string]bool{}
		for _, k := range keys {
			if rollout.Covers(&r, k) {
				in[k] = true
			}
		}
		for k := range prev {
			if !in[k] {
				t.Fatalf("%s left the rollout when it grew to %v%%", k, pct)
			}
		}
		got := 100 * float64(len(in)) / float64(len(keys))
		t.Logf("Percent %v: %.2f%% of %d keys", pct, got, len(keys))
		if lo, hi := pct*0.8, pct*1.2; got < lo || got > hi {
			t.Errorf("Percent %v covers %.2f%% of the keys, want %.1f to %.1f", pct, got, lo, hi)
		}
		prev = in
	}
	if got := rollout.Share("k"); got != rollout.Share("k") || got < 0 || got >= 100 {
		t.Errorf("Share(k) = %v, want a stable value in [0, 100)", got)
	}
}

func TestOf(t *testing.T) {
	t.Parallel()
	from := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	until := from.Add(24 * time.Hour)
	all := enforce.Rollout{Limit: tollgate.PerMinute(5), Percent: 100, From: from, Until: until}
	none := all
	none.Percent = 1e-9
	now := enforce.Rollout{Limit: tollgate.PerMinute(5), Percent: 100}
	tests := []struct {
		name string
		r    enforce.Rollout
		at   time.Time
		want rollout.Arm
	}{
		{"before from", all, from.Add(-time.Nanosecond), rollout.Announced},
		{"at from", all, from, rollout.Rolled},
		{"before until", all, until.Add(-time.Nanosecond), rollout.Rolled},
		{"at until", all, until, rollout.Base},
		{"not in the share", none, from, rollout.Base},
		{"not in the share, before from", none, from.Add(-time.Hour), rollout.Base},
		{"no from, no until", now, from, rollout.Rolled},
	}
	for _, tc := range tests {
		if got := rollout.Of(&tc.r, "k", tc.at); got != tc.want {
			t.Errorf("%s: Arm = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	base := tollgate.PerMinute(100)
	from := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		r    enforce.Rollout
		want string // in the error; "" for none
	}{
		{enforce.Rollout{Limit: tollgate.PerMinute(60), Percent: 10}, ""},
		{enforce.Rollout{Limit: tollgate.PerMinute(60), Percent: 100, From: from, Until: from.Add(time.Hour)}, ""},
		{enforce.Rollout{Limit: tollgate.PerMinute(60)}, "percent 0"},
		{enforce.Rollout{Limit: tollgate.PerMinute(60), Percent: 101}, "percent 101"},
		{enforce.Rollout{Limit: tollgate.PerMinute(60), Percent: 10, From: from, Until: from}, "until must come after from"},
		{enforce.Rollout{Limit: tollgate.PerHour(60), Percent: 10}, "not the algorithm or the period"},
		{enforce.Rollout{Limit: tollgate.Limit{Rate: -1, Period: time.Minute}, Percent: 10}, "invalid limit"},
	}
	for _, tc := range tests {
		err := rollout.Check(&tc.r, base)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Check(%+v) = %v, want nil", tc.r, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("Check(%+v) = %v, want an error about %q", tc.r, err, tc.want)
		}
	}
}
