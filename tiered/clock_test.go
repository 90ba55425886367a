package tiered

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// down is a global store that always fails, so that every decision is made
// in degraded mode.
type down struct{}

var errDown = errors.New("down")

func (down) AllowN(_ context.Context, _ string, limit tollgate.Limit, _ int) (tollgate.Result, error) {
	return tollgate.Result{Limit: limit}, errDown
}

func (down) Reset(context.Context, string, tollgate.Limit) error { return errDown }

// TestDegradedModeIgnoresClockSteps: a step of the system clock (NTP, an
// operator) neither rewards nor punishes anyone in degraded mode, as in
// memorystore: the store counts time on the monotonic clock. Not parallel:
// it replaces the package's system clock.
func TestDegradedModeIgnoresClockSteps(t *testing.T) {
	var step atomic.Int64
	saved := systemClock
	systemClock = func() time.Time { return time.Now().Add(time.Duration(step.Load())) }
	defer func() { systemClock = saved }()

	for _, tc := range []struct {
		name string
		step time.Duration
	}{
		{"an hour ahead", time.Hour},
		{"an hour back", -time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			step.Store(0)
			s := New(down{}, WithLogger(slog.New(slog.DiscardHandler)), WithBreaker(1000, time.Second))
			limit := tollgate.PerHour(2)
			ctx := context.Background()
			if res, err := s.AllowN(ctx, "k", limit, 1); err != nil || !res.Allowed {
				t.Fatalf("first request, degraded: %+v, %v", res, err)
			}
			step.Store(int64(tc.step))
			res, err := s.AllowN(ctx, "k", limit, 1)
			if err != nil {
				t.Fatal(err)
			}
			// One token left, not a full bucket (a step ahead) nor none (a
			// step back that the store holds against the key).
			if got, want := res.Allowed, true; got != want {
				t.Errorf("second request: Allowed %v, want %v (%+v)", got, want, res)
			}
			if got, want := res.Remaining, 0; got != want {
				t.Errorf("second request: Remaining %d, want %d", got, want)
			}
			if got, want := s.Stats().Degraded, uint64(2); got != want {
				t.Errorf("%d degraded decisions, want %d", got, want)
			}
		})
	}
}
