package tollgate_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/conformance"
	"github.com/tollgate/tollgate/memorystore"
)

// 10 per second, burst 10, on a clock that stands still: what a
// reservation spends and a settle gives back stays visible.
var reserveLimit = tollgate.Limit{Rate: 10, Period: time.Second, Burst: 10}

func standingLimiter() *tollgate.Limiter {
	clock := conformance.NewClock()
	return tollgate.New(memorystore.New(memorystore.WithClock(clock.Now)))
}

// remaining is what a look at key reports.
func remaining(t *testing.T, lim *tollgate.Limiter, key string, limit tollgate.Limit) int {
	t.Helper()
	r, err := lim.Peek(context.Background(), key, limit)
	if err != nil {
		t.Fatal(err)
	}
	return r.Remaining
}

func TestReservationSettle(t *testing.T) {
	t.Parallel()
	window := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 10, Period: time.Minute}
	for _, tc := range []struct {
		name     string
		limit    tollgate.Limit
		estimate int
		actual   int
		want     int // Remaining after the settle
	}{
		{"refund", reserveLimit, 6, 2, 8},
		{"estimate exact", reserveLimit, 6, 6, 4},
		{"extra charge", reserveLimit, 6, 9, 1},
		{"into a debt", reserveLimit, 6, 15, 0},
		{"full refund", reserveLimit, 6, 0, 10},
		{"window refund", window, 6, 1, 9},
		{"window charge", window, 6, 12, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lim := standingLimiter()
			ctx := context.Background()
			r, err := lim.Reserve(ctx, "k", tc.limit, tc.estimate)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := r.Allowed, true; got != want {
				t.Fatalf("Allowed = %v, want %v", got, want)
			}
			if got, want := r.Remaining, 10-tc.estimate; got != want {
				t.Errorf("Remaining after the reservation = %d, want %d", got, want)
			}
			res, err := r.Settle(ctx, tc.actual)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := res.Remaining, tc.want; got != want {
				t.Errorf("Settle(%d): Remaining = %d, want %d", tc.actual, got, want)
			}
			if got, want := remaining(t, lim, "k", tc.limit), tc.want; got != want {
				t.Errorf("a look after the settle: Remaining = %d, want %d", got, want)
			}
		})
	}
}

// A debt is waited out before the next request: 6 reserved and 15 spent
// from a full burst of 10 leave a debt of 5 tokens, and the next request's
// token comes 6 tokens later, 0.6s at 10/s.
func TestSettleDebtDelaysTheNextRequest(t *testing.T) {
	t.Parallel()
	lim := standingLimiter()
	ctx := context.Background()
	r, err := lim.Reserve(ctx, "k", reserveLimit, 6)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Settle(ctx, 15); err != nil {
		t.Fatal(err)
	}
	res, err := lim.Allow(ctx, "k", reserveLimit)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.RetryAfter, 600*time.Millisecond; res.Allowed || got != want {
		t.Errorf("Allow after a debt of 5: Allowed %v, RetryAfter %v, want denied for %v", res.Allowed, got, want)
	}
}

func TestReservationSettlesOnce(t *testing.T) {
	t.Parallel()
	second := []struct {
		name   string
		settle func(context.Context, *tollgate.Reservation) (tollgate.Result, error)
	}{
		{"Settle", func(ctx context.Context, r *tollgate.Reservation) (tollgate.Result, error) { return r.Settle(ctx, 0) }},
	}
	for _, tc := range second {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lim := standingLimiter()
			ctx := context.Background()
			r, err := lim.Reserve(ctx, "k", reserveLimit, 4)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Settle(ctx, 5); err != nil {
				t.Fatal(err)
			}
			if _, err := tc.settle(ctx, r); !errors.Is(err, tollgate.ErrSettled) {
				t.Errorf("second settle: err = %v, want ErrSettled", err)
			}
			if got, want := remaining(t, lim, "k", reserveLimit), 5; got != want {
				t.Errorf("Remaining = %d, want %d: the second settle changed the key", got, want)
			}
		})
	}
}

// Of many goroutines settling one reservation at once, exactly one does.
func TestReservationSettlesOnceConcurrently(t *testing.T) {
	t.Parallel()
	lim := standingLimiter()
	ctx := context.Background()
	r, err := lim.Reserve(ctx, "k", reserveLimit, 8)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		settled atomic.Int32
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := r.Settle(ctx, 0)
			switch {
			case err == nil:
				settled.Add(1)
			case !errors.Is(err, tollgate.ErrSettled):
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if got, want := settled.Load(), int32(1); got != want {
		t.Errorf("%d refunds succeeded, want %d", got, want)
	}
	if got, want := remaining(t, lim, "k", reserveLimit), 10; got != want {
		t.Errorf("Remaining = %d, want %d: refunded once", got, want)
	}
}

// A denied reservation spent nothing: settling it changes nothing, as often
// as it is settled, and returns the denial.
func TestDeniedReservationSettlesNothing(t *testing.T) {
	t.Parallel()
	lim := standingLimiter()
	ctx := context.Background()
	if _, err := lim.AllowN(ctx, "k", reserveLimit, 8); err != nil {
		t.Fatal(err)
	}
	r, err := lim.Reserve(ctx, "k", reserveLimit, 5)
	if err != nil {
		t.Fatal(err)
	}
	if r.Allowed {
		t.Fatalf("reserving 5 of 2 left: %+v, want denied", r.Result)
	}
	for _, actual := range []int{0, 5, 9} {
		res, err := r.Settle(ctx, actual)
		if err != nil {
			t.Fatalf("Settle(%d): %v", actual, err)
		}
		if got, want := res, r.Result; got != want {
			t.Errorf("Settle(%d) = %+v, want the denial %+v", actual, got, want)
		}
	}
	if got, want := remaining(t, lim, "k", reserveLimit), 2; got != want {
		t.Errorf("Remaining = %d, want %d", got, want)
	}
}

// A negative actual is refused, and leaves the reservation to be settled.
func TestSettleNegativeActual(t *testing.T) {
	t.Parallel()
	lim := standingLimiter()
	ctx := context.Background()
	r, err := lim.Reserve(ctx, "k", reserveLimit, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Settle(ctx, -1); !errors.Is(err, tollgate.ErrInvalidCost) {
		t.Errorf("Settle(-1): err = %v, want ErrInvalidCost", err)
	}
	if got, want := remaining(t, lim, "k", reserveLimit), 6; got != want {
		t.Errorf("Remaining after Settle(-1) = %d, want %d", got, want)
	}
	if _, err := r.Settle(ctx, 1); err != nil {
		t.Fatalf("Settle(1) after Settle(-1): %v, want it settled", err)
	}
	if got, want := remaining(t, lim, "k", reserveLimit), 9; got != want {
		t.Errorf("Remaining = %d, want %d", got, want)
	}
}

func TestReserveRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		store    tollgate.Store
		estimate int
		want     error
	}{
		{"estimate 0", memorystore.New(), 0, tollgate.ErrInvalidCost},
		{"estimate above burst", memorystore.New(), 11, tollgate.ErrCostExceedsBurst},
		{"a store that cannot settle", slowStore{}, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := tollgate.New(tc.store).Reserve(ctx, "k", reserveLimit, tc.estimate)
			if err == nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("Reserve: %+v, err = %v, want %v", r, err, tc.want)
			}
		})
	}
}
