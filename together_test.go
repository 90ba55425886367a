package tollgate_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/test/testkit"
	"github.com/tollgate/tollgate/memorystore"
)

func TestCheckAll(t *testing.T) {
	t.Parallel()
	sec, day := tollgate.PerSecond(10), tollgate.PerDay(10_000)
	many := make([]tollgate.Limit, 17)
	for i := range many {
		many[i] = tollgate.PerSecond(1)
		many[i].Period = time.Duration(i+1) * time.Second
	}
	tests := []struct {
		name   string
		key    string
		limits []tollgate.Limit
		n      int
		want   error // nil: valid
	}{
		{"a plan", "k", []tollgate.Limit{sec, day}, 1, nil},
		{"a look", "k", []tollgate.Limit{sec, day}, 0, nil},
		{"sixteen", "k", many[:16], 1, nil},
		{"two algorithms of one period", "k", []tollgate.Limit{sec, {Algorithm: tollgate.GCRA, Rate: 10, Period: time.Second, Burst: 10}}, 1, nil},
		{"no limit", "k", nil, 1, tollgate.ErrInvalidLimit},
		{"seventeen", "k", many, 1, tollgate.ErrInvalidLimit},
		{"one state twice", "k", []tollgate.Limit{sec, day, tollgate.PerSecond(20)}, 1, tollgate.ErrInvalidLimit},
		{"an invalid limit", "k", []tollgate.Limit{sec, {Rate: 1}}, 1, tollgate.ErrInvalidLimit},
		{"above one capacity", "k", []tollgate.Limit{day, sec}, 11, tollgate.ErrCostExceedsBurst},
		{"a negative cost", "k", []tollgate.Limit{sec}, -1, tollgate.ErrInvalidCost},
		{"no key", "", []tollgate.Limit{sec}, 1, tollgate.ErrInvalidKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, err := tollgate.CheckAll(tt.key, tt.limits, tt.n, nil)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("CheckAll = %v, want %v", err, tt.want)
			}
			if err == nil && len(ps) != len(tt.limits) {
				t.Errorf("got %d Params, want %d", len(ps), len(tt.limits))
			}
		})
	}
}

// TestAllowAllSpendsAllOrNothing: a request the second limit denies spends
// nothing of the first, and one the first denies nothing of the second.
func TestAllowAllSpendsAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := testkit.NewClock(time.Date(2027, 3, 1, 12, 0, 0, 0, time.UTC))
	lim := tollgate.New(memorystore.New(memorystore.WithClock(clock.Now)))
	burst := tollgate.Limit{Algorithm: tollgate.TokenBucket, Rate: 1, Period: time.Second, Burst: 3}
	hourly := tollgate.Limit{Algorithm: tollgate.FixedWindow, Rate: 4, Period: time.Hour}
	plan := []tollgate.Limit{burst, hourly}

	remaining := func() (int, int) {
		b, _ := lim.Peek(ctx, "k", burst)
		h, _ := lim.Peek(ctx, "k", hourly)
		return b.Remaining, h.Remaining
	}
	steps := []struct {
		advance          time.Duration
		n                int
		allowed          bool
		decided          tollgate.Limit
		retry            time.Duration
		burstLeft, hLeft int
	}{
		{0, 2, true, burst, 0, 1, 2},
		{0, 2, false, burst, time.Second, 1, 2},                                    // the bucket denies: the window keeps its 2
		{time.Second, 2, true, burst, 0, 0, 0},                                     // both admit: the bucket is then the lower
		{3 * time.Second, 1, false, hourly, 59*time.Minute + 56*time.Second, 3, 0}, // the window denies: the bucket keeps its 3
	}
	for i, s := range steps {
		clock.Advance(s.advance)
		res, err := lim.AllowAll(ctx, "k", plan, s.n)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if res.Allowed != s.allowed || res.Limit != s.decided || res.RetryAfter != s.retry {
			t.Errorf("step %d: Allowed %v by %v, RetryAfter %v; want %v by %v, %v", i, res.Allowed, res.Limit, res.RetryAfter, s.allowed, s.decided, s.retry)
		}
		if b, h := remaining(); b != s.burstLeft || h != s.hLeft {
			t.Errorf("step %d: left %d in the bucket and %d in the window, want %d and %d", i, b, h, s.burstLeft, s.hLeft)
		}
	}
}

func TestAllowAllRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lim := tollgate.New(memorystore.New())
	if _, err := lim.AllowAll(ctx, "k", []tollgate.Limit{tollgate.PerSecond(1)}, 0); !errors.Is(err, tollgate.ErrInvalidCost) {
		t.Errorf("a cost of 0: %v, want ErrInvalidCost", err)
	}
	if _, err := lim.AllowAll(ctx, "k", []tollgate.Limit{tollgate.PerSecond(1), tollgate.PerSecond(2)}, 1); !errors.Is(err, tollgate.ErrInvalidLimit) {
		t.Errorf("two limits of one state: %v, want ErrInvalidLimit", err)
	}
	plain := tollgate.New(storeOnly{memorystore.New()})
	if _, err := plain.AllowAll(ctx, "k", []tollgate.Limit{tollgate.PerSecond(1)}, 1); err == nil {
		t.Error("a store that is no Combiner decided limits together")
	}
}

// storeOnly hides every method of its store but the Store's.
type storeOnly struct{ s tollgate.Store }

func (s storeOnly) AllowN(ctx context.Context, key string, l tollgate.Limit, n int) (tollgate.Result, error) {
	return s.s.AllowN(ctx, key, l, n)
}

func (s storeOnly) Reset(ctx context.Context, key string, l tollgate.Limit) error {
	return s.s.Reset(ctx, key, l)
}

// A plan of 10 requests a second and 1,000 a day: the 11th request of a
// second is denied by the per-second limit, and spends nothing of the day.
func ExampleLimiter_AllowAll() {
	lim := tollgate.New(memorystore.New())
	ctx := context.Background()
	plan := []tollgate.Limit{tollgate.PerSecond(10), tollgate.PerDay(1000)}
	for range 10 {
		lim.AllowAll(ctx, "tenant:acme", plan, 1)
	}
	res, err := lim.AllowAll(ctx, "tenant:acme", plan, 1)
	if err != nil {
		panic(err)
	}
	day, _ := lim.Peek(ctx, "tenant:acme", plan[1])
	fmt.Println(res.Allowed, res.Limit, day.Remaining)
	// Output: false 10/s burst 10 token_bucket 990
}
