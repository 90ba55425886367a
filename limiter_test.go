package tollgate_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/testkit"
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
	// At once, not after the second the context allows (the margin is for
	// a busy machine; waiting would take the whole second).
	if d := time.Since(start); d > 500*time.Millisecond {
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

// TestEveryDoorKeepsItsRules: each way into a Limiter bounds the store
// call by WithTimeout and refuses a cost below 1 before the store sees it,
// with a timeout or without.
func TestEveryDoorKeepsItsRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	limit := tollgate.PerSecond(10)
	slow := tollgate.New(slowStore{delay: time.Minute}, tollgate.WithTimeout(20*time.Millisecond))
	refusing := tollgate.New(slowStore{delay: time.Minute})
	cases := []struct {
		name string
		call func() (tollgate.Result, error)
		want error
	}{
		{"Allow under a timeout", func() (tollgate.Result, error) { return slow.Allow(ctx, "k", limit) }, context.DeadlineExceeded},
		{"AllowN under a timeout", func() (tollgate.Result, error) { return slow.AllowN(ctx, "k", limit, 2) }, context.DeadlineExceeded},
		{"Peek under a timeout", func() (tollgate.Result, error) { return slow.Peek(ctx, "k", limit) }, context.DeadlineExceeded},
		{"AllowN(0) under a timeout", func() (tollgate.Result, error) { return slow.AllowN(ctx, "k", limit, 0) }, tollgate.ErrInvalidCost},
		{"AllowN(0)", func() (tollgate.Result, error) { return refusing.AllowN(ctx, "k", limit, 0) }, tollgate.ErrInvalidCost},
		{"AllowN(-1)", func() (tollgate.Result, error) { return refusing.AllowN(ctx, "k", limit, -1) }, tollgate.ErrInvalidCost},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := tc.call()
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if got, want := res, (tollgate.Result{Limit: limit}); got != want {
				t.Errorf("Result = %+v, want %+v", got, want)
			}
		})
	}
}

// callerKey carries a caller's number in its context, for slotRecorder.
type callerKey struct{}

// slotRecorder is a Store that remembers, for every caller (numbered by
// callerKey), the clock reading at which it was admitted, and reports each
// caller's first decision on first.
type slotRecorder struct {
	tollgate.Store
	now   func() time.Time
	first chan int

	mu       sync.Mutex
	admitted map[int]time.Time
	seen     map[int]bool
}

func (r *slotRecorder) AllowN(ctx context.Context, key string, limit tollgate.Limit, n int) (tollgate.Result, error) {
	res, err := r.Store.AllowN(ctx, key, limit, n)
	id := ctx.Value(callerKey{}).(int)
	r.mu.Lock()
	if err == nil && res.Allowed {
		r.admitted[id] = r.now()
	}
	first := !r.seen[id]
	r.seen[id] = true
	r.mu.Unlock()
	if first {
		r.first <- id
	}
	return res, err
}

// TestWaitShapingUnderOverload: callers with short deadlines offer twice
// what a shaping leaky bucket lets through. A caller whose slot would come
// after its deadline must not take it, or the queue fills with slots nobody
// uses and nobody is served at all. On a settable clock, one caller every
// 5 ms for 3 s against 100/s: in every 250 ms after the first, the callers
// served (WaitN returned nil) must be most of the 25 slots.
func TestWaitShapingUnderOverload(t *testing.T) {
	t.Parallel()
	const (
		every    = 5 * time.Millisecond
		span     = 3 * time.Second
		interval = 250 * time.Millisecond
		deadline = 50 * time.Millisecond
	)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := testkit.NewClock(t0)
	rec := &slotRecorder{
		Store:    memorystore.New(memorystore.WithClock(clock.Now)),
		now:      clock.Now,
		first:    make(chan int, 1),
		admitted: map[int]time.Time{},
		seen:     map[int]bool{},
	}
	lim := tollgate.New(rec)
	limit := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 100, Period: time.Second, Burst: 1, MaxDelay: 2 * time.Second}
	callers := int(span / every)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		clock.Set(t0.Add(time.Duration(i) * every))
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), callerKey{}, i), deadline)
			defer cancel()
			errs[i] = lim.Wait(ctx, "provider", limit)
		})
		<-rec.first // the caller's first decision is made at this instant
	}
	wg.Wait()
	served := make([]int, span/interval+1)
	var wasted int
	for i, err := range errs {
		at, ok := rec.admitted[i]
		switch {
		case err == nil && !ok:
			t.Errorf("caller %d: served without a slot", i)
		case err == nil:
			served[at.Sub(t0)/interval]++
		case ok:
			wasted++ // admitted, then gave up: possible only when the store call outlasts the margin
		case !errors.Is(err, tollgate.ErrWaitExceedsDeadline) && !errors.Is(err, context.DeadlineExceeded):
			t.Errorf("caller %d: err = %v, want nil, ErrWaitExceedsDeadline or the context's", i, err)
		}
	}
	t.Logf("served per %v: %v; %d slots taken and not used", interval, served, wasted)
	for i := 1; i < int(span/interval); i++ {
		if got, least := served[i], 15; got < least {
			t.Errorf("%v to %v: %d callers served, want at least %d of the %d slots", time.Duration(i)*interval, time.Duration(i+1)*interval, got, least, 25)
		}
	}
}

// TestWaitShapingUnderOverloadRealTime is the same overload on the real
// clock, for one second: the callers that arrive in the second half are
// still served.
func TestWaitShapingUnderOverloadRealTime(t *testing.T) {
	t.Parallel()
	const (
		every    = 5 * time.Millisecond
		span     = time.Second
		deadline = 50 * time.Millisecond
	)
	lim := tollgate.New(memorystore.New())
	limit := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 100, Period: time.Second, Burst: 1, MaxDelay: 2 * time.Second}
	var wg sync.WaitGroup
	var early, late, failed atomic.Int64
	start := time.Now()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for time.Since(start) < span {
		<-tick.C
		second := time.Since(start) >= span/2
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			err := lim.Wait(ctx, "provider", limit)
			switch {
			case err == nil && second:
				late.Add(1)
			case err == nil:
				early.Add(1)
			case !errors.Is(err, tollgate.ErrWaitExceedsDeadline) && !errors.Is(err, context.DeadlineExceeded):
				t.Errorf("err = %v, want nil, ErrWaitExceedsDeadline or the context's", err)
			default:
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("served %d in the first half, %d in the second; %d gave up", early.Load(), late.Load(), failed.Load())
	// About 50 slots in the second half; a busy machine may offer fewer
	// callers, but never so few that none is served.
	if got, least := late.Load(), int64(10); got < least {
		t.Errorf("%d callers served in the second half, want at least %d", got, least)
	}
}

// TestWaitShapingCostAndDeadline: a cost that only the limit's full
// MaxDelay could admit is a wait past the deadline; a cost that no delay
// admits stays ErrCostExceedsBurst.
func TestWaitShapingCostAndDeadline(t *testing.T) {
	t.Parallel()
	// Capacity 1 + 10 × 1 s = 11; with 100 ms left, 1 + 0.
	limit := tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 10, Period: time.Second, Burst: 1, MaxDelay: time.Second}
	for _, tc := range []struct {
		n    int
		want error
	}{
		{1, nil},
		{5, tollgate.ErrWaitExceedsDeadline},
		{11, tollgate.ErrWaitExceedsDeadline},
		{12, tollgate.ErrCostExceedsBurst},
	} {
		t.Run(fmt.Sprint(tc.n), func(t *testing.T) {
			t.Parallel()
			lim := tollgate.New(memorystore.New())
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			if err := lim.WaitN(ctx, "k", limit, tc.n); !errors.Is(err, tc.want) {
				t.Errorf("WaitN(%d): err = %v, want %v", tc.n, err, tc.want)
			}
		})
	}
}
