package tiered_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/memorystore"
	"github.com/tollgate/tollgate/tiered"
)

// TestClockWentBack: after the clock went backwards, the global store's
// state is ahead of its clock and every duration it reports carries the
// difference (a lag), while it admits by the level alone. A remembered
// Result must not be read as a fuller bucket than there is: each decision
// must be the plain store's, field by field.
func TestClockWentBack(t *testing.T) {
	t.Parallel()
	type step struct {
		at time.Duration
		n  int
	}
	for _, tc := range []struct {
		name  string
		limit tollgate.Limit
		steps []step
	}{
		{
			// At 9s the bucket holds 2 (full, admitted without a delay) and
			// reports a ResetAfter of 1.2s, the lag included; the next
			// request is queued, not denied.
			name:  "shaper admitted without delay",
			limit: tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: time.Second, Burst: 2, MaxDelay: time.Second},
			steps: []step{{10 * time.Second, 1}, {9 * time.Second, 1}, {9 * time.Second, 1}, {9 * time.Second, 1}},
		},
		{
			// At 9s the bucket holds 2 and denies 6 (its queue holds 5),
			// with durations 1s too long; a request of 1 is still queued.
			name:  "shaper denied",
			limit: tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: time.Second, Burst: 2, MaxDelay: 500 * time.Millisecond},
			steps: []step{{10 * time.Second, 2}, {9 * time.Second, 6}, {9 * time.Second, 1}, {9 * time.Second, 5}, {9 * time.Second, 1}},
		},
		{
			name:  "token bucket",
			limit: tollgate.Limit{Rate: 10, Period: time.Second, Burst: 5},
			steps: []step{{10 * time.Second, 3}, {9 * time.Second, 3}, {9 * time.Second, 1}, {9 * time.Second, 2}, {9500 * time.Millisecond, 1}},
		},
	} {
		for _, g := range globalStores() {
			t.Run(g.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				clock := conformance.NewClock()
				s := tiered.New(g.new(t, clock.Now), tiered.WithClock(clock.Now), tiered.WithDenialCache(), untimed)
				plain := memorystore.New(memorystore.WithClock(clock.Now))
				ctx := context.Background()
				key := key(t)
				for i, st := range tc.steps {
					clock.Set(st.at)
					want, err := plain.AllowN(ctx, key, tc.limit, st.n)
					if err != nil {
						t.Fatal(err)
					}
					got, err := s.AllowN(ctx, key, tc.limit, st.n)
					if err != nil {
						t.Fatal(err)
					}
					if got != want {
						t.Errorf("step %d (at %v, cost %d): the plain store says otherwise\ntiered %+v\nplain  %+v", i, st.at, st.n, got, want)
					}
				}
			})
		}
	}
}
