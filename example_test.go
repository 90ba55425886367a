package tollgate_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/memorystore"
)

func Example() {
	// One process: the memory store. For a limit shared by every replica,
	// pass redisstore.New(rdb) instead; nothing else changes.
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a fixed clock, for the output below
	lim := tollgate.New(memorystore.New(memorystore.WithClock(func() time.Time { return now })))
	ctx := context.Background()

	limit := tollgate.Limit{Rate: 2, Period: time.Second, Burst: 3} // a token bucket
	for i := 0; i < 4; i++ {
		res, err := lim.Allow(ctx, "user:42", limit)
		if err != nil {
			panic(err) // invalid input or a store that failed, never "over the limit"
		}
		fmt.Printf("allowed=%v remaining=%d retry-after=%v\n", res.Allowed, res.Remaining, res.RetryAfter)
	}
	// Output:
	// allowed=true remaining=2 retry-after=0s
	// allowed=true remaining=1 retry-after=0s
	// allowed=true remaining=0 retry-after=0s
	// allowed=false remaining=0 retry-after=500ms
}

func ExampleLimiter_AllowN() {
	lim := tollgate.New(memorystore.New())
	ctx := context.Background()
	report := tollgate.Limit{Rate: 10, Period: time.Minute, Burst: 100}

	res, _ := lim.AllowN(ctx, "tenant:acme", report, 50) // a heavy request costs 50
	fmt.Println(res.Allowed, res.Remaining)
	_, err := lim.AllowN(ctx, "tenant:acme", report, 500) // can never pass: an error, not a wait
	fmt.Println(errors.Is(err, tollgate.ErrCostExceedsBurst))
	// Output:
	// true 50
	// true
}

func ExampleLimiter_Wait() {
	lim := tollgate.New(memorystore.New())
	// An outside provider allows 100 requests a minute. With a store every
	// replica shares (redisstore), all replicas together stay under it.
	provider := tollgate.PerMinute(100)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := lim.Wait(ctx, "provider:stripe", provider); err != nil {
		fmt.Println("gave up:", err)
		return
	}
	fmt.Println("call the provider")
	// Output: call the provider
}

func ExampleLimit_String() {
	fmt.Println(tollgate.PerMinute(100))
	fmt.Println(tollgate.Limit{Algorithm: tollgate.SlidingWindowCounter, Rate: 1000, Period: 24 * time.Hour})
	fmt.Println(tollgate.Limit{Algorithm: tollgate.LeakyBucket, Rate: 5, Period: time.Second, Burst: 1, MaxDelay: 2 * time.Second})
	// Output:
	// 100/m burst 100 token_bucket
	// 1000/24h sliding_window_counter
	// 5/s burst 1 leaky_bucket max_delay 2s
}

func ExampleLimit_Validate() {
	err := tollgate.Limit{Rate: 10, Period: time.Second, Burst: -1}.Validate()
	fmt.Println(err)
	fmt.Println(errors.Is(err, tollgate.ErrInvalidLimit))
	// Output:
	// tollgate: invalid limit: token_bucket needs a burst of at least 1 (0 for a burst of rate), got -1
	// true
}

func ExampleReservation_Settle() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a fixed clock, for the output below
	lim := tollgate.New(memorystore.New(memorystore.WithClock(func() time.Time { return now })))
	ctx := context.Background()
	// 1,000 model tokens a minute per tenant, counted when a completion ends.
	limit := tollgate.Limit{Rate: 1000, Period: time.Minute, Burst: 1000}

	r, err := lim.Reserve(ctx, "tenant:acme", limit, 400) // the estimate
	if err != nil {
		panic(err)
	}
	fmt.Printf("admitted=%v remaining=%d\n", r.Allowed, r.Remaining)

	// The completion used 150 tokens: 250 come back. Settle with a context
	// the end of the request does not cancel.
	res, err := r.Settle(context.WithoutCancel(ctx), 150)
	if err != nil {
		panic(err)
	}
	fmt.Printf("settled: remaining=%d\n", res.Remaining)

	// A reservation settles once.
	_, err = r.Settle(ctx, 150)
	fmt.Println(errors.Is(err, tollgate.ErrSettled))

	// One that cost more than the whole burst leaves a debt, waited out.
	r, _ = lim.Reserve(ctx, "tenant:acme", limit, 500)
	res, _ = r.Settle(ctx, 1100)
	fmt.Printf("in debt: remaining=%d, full again in %v\n", res.Remaining, res.ResetAfter)
	// Output:
	// admitted=true remaining=600
	// settled: remaining=850
	// true
	// in debt: remaining=0, full again in 1m15s
}
