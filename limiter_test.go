package tollgate_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
)

func TestAllowNRejectsZeroCost(t *testing.T) {
	t.Parallel()
	lim := tollgate.New(memorystore.New())
	if _, err := lim.AllowN(context.Background(), "k", tollgate.PerSecond(1), 0); !errors.Is(err, tollgate.ErrInvalidCost) {
		t.Errorf("AllowN(n=0): err = %v, want ErrInvalidCost (use Peek)", err)
	}
}

func TestPeekSpendsNothing(t *testing.T) {
	t.Parallel()
	lim := tollgate.New(memorystore.New())
	ctx := context.Background()
	limit := tollgate.PerMinute(3)
	if _, err := lim.Allow(ctx, "k", limit); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		res, err := lim.Peek(ctx, "k", limit)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := res.Remaining, 2; got != want {
			t.Fatalf("Peek %d: Remaining = %d, want %d", i, got, want)
		}
	}
}

func TestWaitPacesCallers(t *testing.T) {
	t.Parallel()
	lim := tollgate.New(memorystore.New())
	limit := tollgate.Limit{Rate: 50, Period: time.Second, Burst: 1} // one per 20ms
	ctx := context.Background()
	start := time.Now()
	var wg sync.WaitGroup
	var done atomic.Int64
	for i := 0; i < 6; i++ {
		wg.Go(func() {
			if err := lim.Wait(ctx, "provider", limit); err != nil {
				t.Error(err)
			}
			done.Add(1)
		})
	}
	wg.Wait()
	// Six callers through a 1-burst bucket at 20ms a token: at least 100ms.
	if got, min := time.Since(start), 100*time.Millisecond; got < min {
		t.Errorf("6 waits took %v, want at least %v", got, min)
	}
	if done.Load() != 6 {
		t.Errorf("%d callers got through, want 6", done.Load())
	}
}

func TestWaitFailsFastPastDeadline(t *testing.T) {
	t.Parallel()
	lim := tollgate.New(memorystore.New())
	limit := tollgate.PerHour(1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := lim.Wait(ctx, "k", limit); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := lim.Wait(ctx, "k", limit) // the next token is an hour away
	if !errors.Is(err, tollgate.ErrWaitExceedsDeadline) {
		t.Fatalf("err = %v, want ErrWaitExceedsDeadline", err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("Wait took %v to give up, want at once", d)
	}
}

func TestWaitHonoursCancel(t *testing.T) {
	t.Parallel()
	lim := tollgate.New(memorystore.New())
	limit := tollgate.PerHour(1)
	ctx, cancel := context.WithCancel(context.Background())
	if err := lim.Wait(ctx, "k", limit); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(20*time.Millisecond, cancel)
	if err := lim.Wait(ctx, "k", limit); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
}

func TestWaitShapingSleepsTheDelay(t *testing.T) {
	t.Parallel()
	lim := tollgate.New(memorystore.New())
	limit := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 20, Period: time.Second, Burst: 1, MaxDelay: time.Second}
	ctx := context.Background()
	start := time.Now()
	for i := 0; i < 3; i++ { // 0, 50ms, 100ms
		if err := lim.Wait(ctx, "k", limit); err != nil {
			t.Fatal(err)
		}
	}
	if got := time.Since(start); got < 100*time.Millisecond {
		t.Errorf("three shaped waits took %v, want at least 100ms", got)
	}
}

// slowStore answers after its delay, or when the context ends.
type slowStore struct{ delay time.Duration }

func (s slowStore) AllowN(ctx context.Context, key string, limit tollgate.Limit, n int) (tollgate.Result, error) {
	select {
	case <-time.After(s.delay):
		return tollgate.Result{Allowed: true, Limit: limit}, nil
	case <-ctx.Done():
		return tollgate.Result{Limit: limit}, ctx.Err()
	}
}

func (s slowStore) Reset(ctx context.Context, key string, limit tollgate.Limit) error { return nil }

func TestWithTimeout(t *testing.T) {
	t.Parallel()
	lim := tollgate.New(slowStore{delay: time.Minute}, tollgate.WithTimeout(20*time.Millisecond))
	start := time.Now()
	_, err := lim.Allow(context.Background(), "k", tollgate.PerSecond(1))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Allow took %v with a 20ms timeout", d)
	}
}
